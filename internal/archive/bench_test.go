//go:build !windows

package archive

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// The benchmark workspace: ~150 MB, 5,000 small text files (source-like, 1-17 KiB, in
// 50 directories) plus 10 large files of 10 MiB: 4 JSON-lines logs, 4 half-random
// "binary" files with repeated structure, 2 random (incompressible). Generated once per
// test binary under $TOOLHOST_BENCH_DIR (default: the temp dir) and removed by TestMain.
//
// Run: go test ./internal/archive -run '^$' -bench . -benchtime 3x
// Pack and tar czf write their archives to a file next to the workspace; Extract and tar
// xzf restore the same archive (written by Pack) into a fresh directory per iteration.

var (
	benchOnce  sync.Once
	benchRoot  string
	benchWS    string
	benchBytes int64
	benchErr   error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if benchRoot != "" {
		os.RemoveAll(benchRoot)
	}
	os.Exit(code)
}

var words = strings.Fields(`func return if else for range package import type struct interface
	map string int error nil err ctx context defer go select case switch default var const
	buf len make append copy delete close chan bool true false byte rune float64 uint64
	handler request response server client config options logger value result index count`)

func genWorkspace() (string, string, int64, error) {
	parent := os.Getenv("TOOLHOST_BENCH_DIR")
	root, err := os.MkdirTemp(parent, "toolhost-archive-bench-")
	if err != nil {
		return "", "", 0, err
	}
	ws := filepath.Join(root, "ws")
	r := rand.New(rand.NewPCG(1, 2))
	var total int64
	var sb strings.Builder
	for i := range 5000 {
		dir := filepath.Join(ws, fmt.Sprintf("pkg%02d", i%50), fmt.Sprintf("sub%d", i%7))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return root, "", 0, err
		}
		sb.Reset()
		size := 1024 + r.IntN(16*1024)
		fmt.Fprintf(&sb, "// file %d\npackage pkg%02d\n\n", i, i%50)
		for sb.Len() < size {
			indent := strings.Repeat("\t", r.IntN(4))
			sb.WriteString(indent)
			for range 3 + r.IntN(8) {
				sb.WriteString(words[r.IntN(len(words))])
				if r.IntN(4) == 0 {
					fmt.Fprintf(&sb, "%d", r.IntN(1000))
				}
				sb.WriteByte(' ')
			}
			sb.WriteString("\n")
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%04d.go", i)), []byte(sb.String()), 0o644); err != nil {
			return root, "", 0, err
		}
		total += int64(sb.Len())
	}
	large := filepath.Join(ws, "data")
	os.MkdirAll(large, 0o755)
	const big = 10 << 20
	for i := range 10 {
		buf := make([]byte, 0, big+4096)
		switch {
		case i < 4: // JSON-lines log
			for n := 0; len(buf) < big; n++ {
				buf = fmt.Appendf(buf, `{"ts":"2026-11-21T09:%02d:%02d.%06dZ","level":"%s","req":"%016x","path":"/api/v1/%s/%d","ms":%d,"msg":"%s %s"}`+"\n",
					n/60%60, n%60, r.IntN(1e6), []string{"info", "debug", "warn"}[r.IntN(3)], r.Uint64(),
					words[r.IntN(len(words))], r.IntN(5000), r.IntN(900), words[r.IntN(len(words))], words[r.IntN(len(words))])
			}
		case i < 8: // half random bytes, half repeated records
			rec := make([]byte, 64)
			for len(buf) < big {
				if r.IntN(2) == 0 {
					for range 512 {
						buf = append(buf, byte(r.Uint32()))
					}
				} else {
					for j := range rec {
						rec[j] = byte(j * (i + 1))
					}
					for range 8 {
						buf = append(buf, rec...)
					}
				}
			}
		default: // incompressible
			for len(buf) < big {
				u := r.Uint64()
				for k := range 8 {
					buf = append(buf, byte(u>>(8*k)))
				}
			}
		}
		buf = buf[:big]
		if err := os.WriteFile(filepath.Join(large, fmt.Sprintf("large%d.bin", i)), buf, 0o644); err != nil {
			return root, "", 0, err
		}
		total += int64(len(buf))
	}
	return root, ws, total, nil
}

func benchWorkspace(b *testing.B) (string, string, int64) {
	benchOnce.Do(func() { benchRoot, benchWS, benchBytes, benchErr = genWorkspace() })
	if benchErr != nil {
		b.Fatal(benchErr)
	}
	return benchRoot, benchWS, benchBytes
}

func BenchmarkPack(b *testing.B) {
	root, ws, total := benchWorkspace(b)
	if _, err := exec.LookPath("tar"); err != nil {
		b.Fatal("GNU tar is needed for the comparison")
	}
	out := filepath.Join(root, "pack-out.tar.gz")
	b.Run("archive.Pack", func(b *testing.B) {
		b.SetBytes(total)
		var st PackStats
		for b.Loop() {
			f, err := os.Create(out)
			if err != nil {
				b.Fatal(err)
			}
			st, err = Pack(context.Background(), f, ws, PackOptions{})
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(st.BytesOut)/float64(total), "ratio")
		b.ReportMetric(float64(st.Files), "files")
	})
	b.Run("tar-czf", func(b *testing.B) {
		b.SetBytes(total)
		for b.Loop() {
			if o, err := exec.Command("tar", "czf", out, "-C", ws, ".").CombinedOutput(); err != nil {
				b.Fatalf("tar czf: %v %s", err, o)
			}
		}
		if fi, err := os.Stat(out); err == nil {
			b.ReportMetric(float64(fi.Size())/float64(total), "ratio")
		}
	})
	os.Remove(out)
}

func BenchmarkExtract(b *testing.B) {
	root, ws, total := benchWorkspace(b)
	if _, err := exec.LookPath("tar"); err != nil {
		b.Fatal("GNU tar is needed for the comparison")
	}
	arch := filepath.Join(root, "extract-in.tar.gz")
	f, err := os.Create(arch)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := Pack(context.Background(), f, ws, PackOptions{}); err != nil {
		b.Fatal(err)
	}
	f.Close()
	defer os.Remove(arch)
	dst := filepath.Join(root, "restored")
	b.Run("archive.Extract", func(b *testing.B) {
		b.SetBytes(total)
		for b.Loop() {
			b.StopTimer()
			os.RemoveAll(dst)
			in, err := os.Open(arch)
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			_, err = Extract(context.Background(), in, dst, ExtractOptions{})
			in.Close()
			if err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("tar-xzf", func(b *testing.B) {
		b.SetBytes(total)
		for b.Loop() {
			b.StopTimer()
			os.RemoveAll(dst)
			if err := os.Mkdir(dst, 0o755); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			if o, err := exec.Command("tar", "xzf", arch, "-C", dst).CombinedOutput(); err != nil {
				b.Fatalf("tar xzf: %v %s", err, o)
			}
		}
	})
	os.RemoveAll(dst)
}
