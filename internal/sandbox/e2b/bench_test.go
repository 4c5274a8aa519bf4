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
	"testing"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/sandbox/e2b/e2bfake"
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

// BenchmarkArchive50MB: Archive of a 50 MB workspace to memory (snapshot pack).
func BenchmarkArchive50MB(b *testing.B) {
	benchEach(b, func(b *testing.B, p sandbox.Provider) {
		sb := benchSandbox(b, p)
		ctx := context.Background()
		if res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"bash", "-c", fill50MB}}); err != nil || res.ExitCode != 0 {
			b.Fatalf("%+v %v", res, err)
		}
		b.SetBytes(50 << 20)
		var n int64
		for b.Loop() {
			cw := &countWriter{}
			if err := sb.Archive(ctx, cw, nil); err != nil {
				b.Fatal(err)
			}
			n = cw.n
		}
		b.ReportMetric(float64(n)/(1<<20), "MB-archive")
	})
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
