//go:build linux

package host_test

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/host"
	"github.com/toolhost/toolhost/internal/memsandbox"
	"github.com/toolhost/toolhost/internal/testenv"
)

// fourK is a 4 KiB text file of 64 lines.
var fourK = strings.Repeat(strings.Repeat("x", 63)+"\n", 64)

// BenchmarkHostOverhead measures a whole Dispatch of the built-in tools against an
// in-memory sandbox, whose operations cost next to nothing: what remains is the host's
// overhead (schema check, pool, the plugin's own work, host functions, result handling).
func BenchmarkHostOverhead(b *testing.B) {
	h := newHost(b)
	sb := memsandbox.New()
	sb.Put("f.txt", fourK)
	sb.Put("src/a.go", "package a\n")
	s := h.OpenSession(sb)
	for _, c := range []struct{ name, tool, input string }{
		{"read_file_4K", "read_file", `{"path":"f.txt"}`},
		{"write_file_small", "write_file", `{"path":"out.txt","content":"hello\n"}`},
		{"edit_file", "edit_file", `{"path":"src/a.go","old_string":"package a","new_string":"package a"}`},
		{"bash_echo", "bash", `{"command":"echo hi"}`},
		{"glob", "glob", `{"pattern":"**/*.go"}`},
	} {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			in := json.RawMessage(c.input)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.Dispatch(ctx, c.tool, in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkReadFile4K compares read_file through the plugin with the same read done
// natively in Go against the same local sandbox.
func BenchmarkReadFile4K(b *testing.B) {
	sb, _ := newSandbox(b, newProvider(b))
	ctx := context.Background()
	if err := sb.WriteFile(ctx, "/home/user/f.txt", []byte(fourK)); err != nil {
		b.Fatal(err)
	}
	b.Run("plugin", func(b *testing.B) {
		s := newHost(b).OpenSession(sb)
		in := json.RawMessage(`{"path":"f.txt"}`)
		for b.Loop() {
			res, err := s.Dispatch(ctx, "read_file", in)
			if err != nil || res.IsError {
				b.Fatal(res, err)
			}
		}

	})
	// The same with a deadline on each read, as the plugin's read has (its call's).
	b.Run("native_deadline", func(b *testing.B) {
		for b.Loop() {
			ctx, cancel := context.WithTimeout(ctx, time.Minute)
			abs, err := sandbox.Resolve("f.txt")
			if err != nil {
				b.Fatal(err)
			}
			data, err := sb.ReadFile(ctx, abs, 16<<20)
			cancel()
			if err != nil || len(data) != len(fourK) {
				b.Fatal(err)
			}
		}
	})
	b.Run("native", func(b *testing.B) {
		for b.Loop() {
			abs, err := sandbox.Resolve("f.txt")
			if err != nil {
				b.Fatal(err)
			}
			data, err := sb.ReadFile(ctx, abs, 16<<20)
			if err != nil || len(data) != len(fourK) {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkReadFile4KRatio is issue 18's "read_file 4 KB plugin / native" in one run:
// each iteration reads the same 4 KiB file of a local sandbox once through read_file
// (Dispatch: schema, pool, the plugin, its read_text host call through acting, the
// result) and once natively (Sandbox.ReadFile with a deadline, as the plugin's read has),
// the order alternating, so load falls on both alike. It reports the medians of each and
// their ratio.
//
//	go test -run '^$' -bench ReadFile4KRatio -benchtime 2000x -count 3 ./internal/host
func BenchmarkReadFile4KRatio(b *testing.B) {
	sb, _ := newSandbox(b, newProvider(b))
	ctx := context.Background()
	if err := sb.WriteFile(ctx, "/home/user/f.txt", []byte(fourK)); err != nil {
		b.Fatal(err)
	}
	s := newHost(b).OpenSession(sb)
	in := json.RawMessage(`{"path":"f.txt"}`)
	plugin := func() {
		res, err := s.Dispatch(ctx, "read_file", in)
		if err != nil || res.IsError {
			b.Fatal(res, err)
		}
	}
	native := func() {
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		abs, err := sandbox.Resolve("f.txt")
		if err != nil {
			b.Fatal(err)
		}
		if data, err := sb.ReadFile(ctx, abs, 16<<20); err != nil || len(data) != len(fourK) {
			b.Fatal(err)
		}
	}
	for range 50 { // warm both paths: instances, connections
		plugin()
		native()
	}
	var pt, nt []float64
	i := 0
	for b.Loop() {
		first, second, ft, st := plugin, native, &pt, &nt
		if i%2 == 1 {
			first, second, ft, st = native, plugin, &nt, &pt
		}
		i++
		t0 := time.Now()
		first()
		t1 := time.Now()
		second()
		*ft = append(*ft, float64(t1.Sub(t0).Nanoseconds()))
		*st = append(*st, float64(time.Since(t1).Nanoseconds()))
	}
	mp, mn := medianOf(pt), medianOf(nt)
	b.ReportMetric(mp/1e3, "plugin-µs")
	b.ReportMetric(mn/1e3, "native-µs")
	b.ReportMetric(mp/mn, "ratio")
}

func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// sixtyFourK is 64 KiB of Go-like source in 1,024 lines, each with a tab, quotes and a
// backslash: what JSON escapes most in a write_file input.
var sixtyFourK = func() string {
	var b strings.Builder
	for i := range 1024 {
		line := "\tfmt.Printf(\"line " + strconv.Itoa(10000 + i)[1:] + ": %s\\n\", name) // "
		b.WriteString(line + strings.Repeat("y", 63-len(line)) + "\n")
	}
	return b.String()
}()

// BenchmarkWriteFile64K compares write_file of 64 KiB in 1,024 lines through the plugin
// with the same write done natively in Go against the same local sandbox.
func BenchmarkWriteFile64K(b *testing.B) {
	sb, _ := newSandbox(b, newProvider(b))
	ctx := context.Background()
	input, err := json.Marshal(map[string]string{"path": "out/big.go", "content": sixtyFourK})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("plugin", func(b *testing.B) {
		s := newHost(b).OpenSession(sb)
		b.SetBytes(int64(len(sixtyFourK)))
		for b.Loop() {
			res, err := s.Dispatch(ctx, "write_file", input)
			if err != nil || res.IsError {
				b.Fatal(res, err)
			}
		}
	})
	b.Run("native", func(b *testing.B) {
		b.SetBytes(int64(len(sixtyFourK)))
		for b.Loop() {
			abs, err := sandbox.Resolve("out/big.go")
			if err != nil {
				b.Fatal(err)
			}
			if err := sb.WriteFile(ctx, abs, []byte(sixtyFourK)); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkReadFile4KBeforeAfter is BenchmarkReadFile4KRatio with a second plugin beside
// the current one: the editfile plugin built from another tree (BENCH_EDITFILE_BEFORE, a
// .wasm path; skipped without it), such as main before a change to the kit or the
// plugin. Each iteration reads the same 4 KiB file through both plugins and natively, the
// order rotating, and it reports the medians and each plugin's ratio to native.
//
//	(cd /path/to/main && GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o /tmp/before.wasm ./plugins/editfile)
//	BENCH_EDITFILE_BEFORE=/tmp/before.wasm go test -run '^$' -bench ReadFile4KBeforeAfter -benchtime 2000x -count 3 ./internal/host
func BenchmarkReadFile4KBeforeAfter(b *testing.B) {
	beforePath := os.Getenv("BENCH_EDITFILE_BEFORE")
	if beforePath == "" {
		b.Skip("BENCH_EDITFILE_BEFORE (the editfile .wasm to compare with) is not set")
	}
	sb, _ := newSandbox(b, newProvider(b))
	ctx := context.Background()
	if err := sb.WriteFile(ctx, "/home/user/f.txt", []byte(fourK)); err != nil {
		b.Fatal(err)
	}
	var spec host.PluginSpec
	for _, s := range builtinPlugins(b) {
		if strings.HasSuffix(s.Path, "editfile.wasm") {
			spec = s
		}
	}
	if spec.Path == "" {
		b.Fatal("no editfile among the built-in plugins")
	}
	spec.Path = beforePath
	hb, err := host.New(ctx, host.Config{DataDir: e2eDataDir, Plugins: []host.PluginSpec{spec}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { hb.Close(context.Background()) })
	if err := hb.Ready(ctx); err != nil {
		b.Fatal(err)
	}
	before, after := hb.OpenSession(sb), newHost(b).OpenSession(sb)
	in := json.RawMessage(`{"path":"f.txt"}`)
	via := func(s *host.Dispatcher) func() {
		return func() {
			res, err := s.Dispatch(ctx, "read_file", in)
			if err != nil || res.IsError || !strings.Contains(testenv.ResultText(res), "    64\t") {
				b.Fatal(res, err)
			}
		}
	}
	native := func() {
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		abs, err := sandbox.Resolve("f.txt")
		if err != nil {
			b.Fatal(err)
		}
		if data, err := sb.ReadFile(ctx, abs, 16<<20); err != nil || len(data) != len(fourK) {
			b.Fatal(err)
		}
	}
	fns := []func(){via(before), via(after), native}
	for range 50 { // warm every path: instances, connections
		for _, f := range fns {
			f()
		}
	}
	times := make([][]float64, len(fns))
	i := 0
	for b.Loop() {
		for k := range fns {
			j := (i + k) % len(fns)
			t0 := time.Now()
			fns[j]()
			times[j] = append(times[j], float64(time.Since(t0).Nanoseconds()))
		}
		i++
	}
	mb, ma, mn := medianOf(times[0]), medianOf(times[1]), medianOf(times[2])
	b.ReportMetric(mb/1e3, "before-µs")
	b.ReportMetric(ma/1e3, "after-µs")
	b.ReportMetric(mn/1e3, "native-µs")
	b.ReportMetric(mb/mn, "before-ratio")
	b.ReportMetric(ma/mn, "after-ratio")
}
