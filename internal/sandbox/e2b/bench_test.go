//go:build linux

package e2b_test

// Figures of the e2b provider against the fake on loopback, next to the local provider
// underneath: what the E2B client adds (the REST calls, envd's protocol through the
// fake's emulation and proxy, the workspace rule's Stats, tar in the sandbox), not E2B's
// cloud. Run with: go test -run '^$' -bench . -benchtime 20x ./internal/sandbox/e2b/

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/sandbox/e2b"
	"github.com/toolhost/toolhost/internal/sandbox/e2b/e2bfake"
	"github.com/toolhost/toolhost/internal/testnet"
)

// benchProviders are the e2b provider on a fake (by header: plain http) and a local
// provider of the same kind as the fake's.
func benchProviders(b *testing.B) map[string]sandbox.Provider {
	f := startFake(b, byHeader, e2bfake.Config{MaxConcurrent: 100})
	return map[string]sandbox.Provider{
		"e2b":   newProvider(b, providerConfig(b, f, byHeader)),
		"local": e2bfake.NewLocal(b),
	}
}

func benchEach(b *testing.B, fn func(b *testing.B, p sandbox.Provider)) {
	ps := benchProviders(b)
	for _, name := range []string{"local", "e2b"} {
		b.Run(name, func(b *testing.B) { fn(b, ps[name]) })
	}
}

func benchSandbox(b *testing.B, p sandbox.Provider) sandbox.Sandbox {
	b.Helper()
	sb, err := p.Create(context.Background(), sandbox.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sb.Close(context.Background()) })
	return sb
}

// BenchmarkCreateToFirstCommand: Create, then Exec true; Close outside the timer.
func BenchmarkCreateToFirstCommand(b *testing.B) {
	benchEach(b, func(b *testing.B, p sandbox.Provider) {
		ctx := context.Background()
		for b.Loop() {
			sb, err := p.Create(ctx, sandbox.CreateOptions{})
			if err != nil {
				b.Fatal(err)
			}
			if res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil || res.ExitCode != 0 {
				b.Fatalf("%+v %v", res, err)
			}
			b.StopTimer()
			if err := sb.Close(ctx); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})
}

// BenchmarkExecTrue: one foreground command in a warm sandbox.
func BenchmarkExecTrue(b *testing.B) {
	benchEach(b, func(b *testing.B, p sandbox.Provider) {
		sb := benchSandbox(b, p)
		ctx := context.Background()
		for b.Loop() {
			if res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil || res.ExitCode != 0 {
				b.Fatalf("%+v %v", res, err)
			}
		}
	})
}

// BenchmarkReadFile4K: ReadFile of a 4 KiB workspace file.
func BenchmarkReadFile4K(b *testing.B) {
	benchEach(b, func(b *testing.B, p sandbox.Provider) {
		sb := benchSandbox(b, p)
		ctx := context.Background()
		data := bytes.Repeat([]byte("0123456789abcdef"), 256)
		if err := sb.WriteFile(ctx, "src/f4k", data); err != nil {
			b.Fatal(err)
		}
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if got, err := sb.ReadFile(ctx, "src/f4k", 1<<20); err != nil || len(got) != len(data) {
				b.Fatalf("%d %v", len(got), err)
			}
		}
	})
}

// fill50MB makes a 50 MB workspace of 100 files: half random bytes, half text.
const fill50MB = `mkdir -p bin text && for i in $(seq 1 50); do head -c 524288 /dev/urandom > bin/$i; head -c 393216 /dev/urandom | base64 -w 76 > text/$i.txt; done; du -sb . | cut -f1`

// BenchmarkArchive50MB: Archive of a 50 MB workspace to memory (snapshot pack), in each
// iteration one after the other (interleaved, so that a loaded machine weighs on all
// alike): the local provider (the floor), the e2b provider as it is (tar in the sandbox,
// compressed on the host), and the e2b provider compressing in the sandbox (gzip -1, the
// former way). Reported per archive: ms-local, ms-e2b, ms-e2b-gzip-in-sandbox, and
// e2b/local. tree=src is a tree of the same size that gzip -1 compresses 4.5x (text, as
// a source tree), where compressing before the wire could pay on a slow link.
func BenchmarkArchive50MB(b *testing.B) {
	benchArchiveTrees(b, benchProviders(b))
}

// fill50MBText makes a 50 MB workspace of 200 text files that gzip -1 compresses about
// 4.5x, as a source tree.
const fill50MBText = `mkdir -p src && for i in $(seq 1 200); do head -c 49152 /dev/urandom | base64 -w 16 | sed 's/.*/\tv := call(&, "a constant string in the code")/' > src/$i.go; done; du -sb . | cut -f1`

func benchArchiveTrees(b *testing.B, ps map[string]sandbox.Provider) {
	for _, tree := range []struct{ name, fill string }{{"mixed", fill50MB}, {"src", fill50MBText}} {
		b.Run("tree="+tree.name, func(b *testing.B) {
			ctx := context.Background()
			sbs := map[string]sandbox.Sandbox{}
			for _, name := range []string{"local", "e2b"} {
				sb := benchSandbox(b, ps[name])
				if res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"bash", "-c", tree.fill}}); err != nil || res.ExitCode != 0 {
					b.Fatalf("%+v %v", res, err)
				}
				sbs[name] = sb
			}
			cases := []struct {
				metric  string
				sb      sandbox.Sandbox
				gzipped bool
			}{{"local", sbs["local"], false}, {"e2b", sbs["e2b"], false}, {"e2b-gzip-in-sandbox", sbs["e2b"], true}}
			took := make([]time.Duration, len(cases))
			var n int64
			for b.Loop() {
				for i, c := range cases {
					restore := e2b.SetPackInSandbox(c.gzipped)
					cw := &countWriter{}
					began := time.Now()
					err := c.sb.Archive(ctx, cw, nil)
					took[i] += time.Since(began)
					restore()
					if err != nil {
						b.Fatalf("%s: %v", c.metric, err)
					}
					n = cw.n
				}
			}
			for i, c := range cases {
				b.ReportMetric(float64(took[i].Milliseconds())/float64(b.N), "ms-"+c.metric)
			}
			b.ReportMetric(float64(took[1])/float64(took[0]), "e2b/local")
			b.ReportMetric(float64(took[2])/float64(took[0]), "gzip-in-sandbox/local")
			b.ReportMetric(float64(n)/(1<<20), "MB-archive")
		})
	}
}

// BenchmarkExtract50MB: Extract of that archive into a fresh sandbox (snapshot restore);
// the sandbox's creation is outside the timer.
func BenchmarkExtract50MB(b *testing.B) {
	benchEach(b, func(b *testing.B, p sandbox.Provider) {
		ctx := context.Background()
		src := benchSandbox(b, p)
		if res, err := src.Exec(ctx, sandbox.ExecRequest{Argv: []string{"bash", "-c", fill50MB}}); err != nil || res.ExitCode != 0 {
			b.Fatalf("%+v %v", res, err)
		}
		var arch bytes.Buffer
		if err := src.Archive(ctx, &arch, nil); err != nil {
			b.Fatal(err)
		}
		b.SetBytes(50 << 20)
		for b.Loop() {
			b.StopTimer()
			dst, err := p.Create(ctx, sandbox.CreateOptions{})
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			if err := dst.Extract(ctx, bytes.NewReader(arch.Bytes())); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			dst.Close(ctx)
			b.StartTimer()
		}
	})
}

type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

var _ io.Writer = (*countWriter)(nil)

// BenchmarkArchive50MBShaped: as BenchmarkArchive50MB, with the fake on the far side of
// a 100 Mbit/s link (testnet: two network namespaces of the test's own joined by a veth
// pair, tc-tbf on both ends; nothing leaves the machine), so the e2b provider pays the
// wire as against E2B's cloud. The local provider's figure has no wire: it is the floor.
func BenchmarkArchive50MBShaped(b *testing.B) {
	n := testnet.New(b)
	if err := n.Shape(100_000_000); err != nil {
		b.Fatal(err)
	}
	addr, err := n.AddHost("api.e2b.test")
	if err != nil {
		b.Fatal(err)
	}
	ln, err := n.Listen("tcp", netip.AddrPortFrom(addr, 80).String())
	if err != nil {
		b.Fatal(err)
	}
	f, err := e2bfake.New(e2bfake.Config{Local: e2bfake.NewLocal(b), MaxConcurrent: 100, Logger: testLogger(b)})
	if err != nil {
		b.Fatal(err)
	}
	f.Serve(ln)
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = f.Close(ctx)
	})
	cfg := providerConfig(b, f, byHeader)
	cfg.Transport = &http.Transport{DialContext: n.DialContext, MaxIdleConns: 64, DisableCompression: true}
	benchArchiveTrees(b, map[string]sandbox.Provider{"local": e2bfake.NewLocal(b), "e2b": newProvider(b, cfg)})
}
