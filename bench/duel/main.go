// Command duel runs the same work in toolhost and in Extism's Go SDK, in one process, and
// prints what each costs and the ratio: a no-op call, a call that reads 4 KB through one
// host function, an echo of a 64 KB text full of escapes, and the load of a plugin.
//
// It is a module of its own so that Extism never enters toolhost's go.mod. Both hosts run
// on the same wazero (the one toolhost requires), with a deadline armed on every call
// (toolhost always arms one; Extism does when the manifest has a timeout, which it has
// here), the same memory limit, real clocks, and guests built with standard Go for
// wasip1: toolhost's with its plugin kit, Extism's against Extism's kernel imports
// directly (guests/extism says why). Each host gets its inputs in its own convention:
// toolhost a JSON object checked against the tool's schema, Extism raw bytes (the path,
// the text), which its guest need not parse at all.
//
// The rounds are interleaved, the order of the two hosts alternating from round to round,
// so the machine's noise falls on both alike; the table gives the medians and the ratio of
// the medians, and -out writes every batch in the format of go test -bench for benchstat
// (make duel does both). A load is a new host given the module's bytes, until its first
// call has answered, with the compilation cache warm on disk (the module was compiled
// before the rounds began). In a running process, Extism's load compiles anew from its
// cache (NewCompiledPlugin: a new runtime that decodes the module); toolhost's is a new
// host.New, whose hosts share the process's runtime and the modules compiled in it, so it
// instantiates the module an earlier host compiled. "In a fresh process" runs each load in
// a new process, timed from inside it: there both decode the module from their disk cache.
//
//	go run . [-rounds 10] [-out duel.txt]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/toolhost/toolhost/internal/memsandbox"
)

// A runtime is one of the two hosts with the duel's plugin loaded.
type runtime interface {
	// call runs one case once and returns its text.
	call(ctx context.Context, c string) (string, error)
	// load loads the plugin anew from its bytes and runs one no-op call.
	load(ctx context.Context) error
	close(ctx context.Context)
}

// The cases, with how many calls make one timed batch.
var cases = []struct {
	name, title string
	batch       int
}{
	{"noop", "no-op call", 2000},
	{"read4k", "read 4 KB through one host function", 1000},
	{"echo64k", "echo of 64 KB (1,024 lines, escapes)", 100},
	{"load", "load, warm cache, in a running process", 3},
	{"load_process", "load, warm cache, in a fresh process", 3},
}

// The inputs, the same for both.
var (
	fourK = strings.Repeat(strings.Repeat("x", 63)+"\n", 64)
	// echoText is 64 KiB of 1,024 lines, each with a tab, quotes and a backslash: 4,096
	// characters that JSON escapes.
	echoText  = echoLines()
	echoInput = `{"text":` + strconv.Quote(echoText) + `}`
)

func echoLines() string {
	var b strings.Builder
	for i := range 1024 {
		line := fmt.Sprintf("\tfmt.Printf(\"line %04d: %%s\\n\", name) // ", i)
		b.WriteString(line + strings.Repeat("y", 63-len(line)) + "\n")
	}
	return b.String()
}

func inputOf(c string) string {
	switch c {
	case "read4k":
		return `{"path":"f.txt"}`
	case "echo64k":
		return echoInput
	}
	return `{}`
}

func main() {
	rounds := flag.Int("rounds", 10, "interleaved rounds")
	out := flag.String("out", "", "write every batch here in go test -bench format (for benchstat)")
	child := flag.String("load-child", "", "internal: load the plugin once in this process and print the time")
	dir := flag.String("dir", "", "internal: the compilation cache of -load-child")
	wasm := flag.String("wasm", "", "internal: the module of -load-child")
	flag.Parse()
	log.SetFlags(0)
	ctx := context.Background()
	if *child != "" {
		if err := loadChild(ctx, *child, *dir, *wasm); err != nil {
			log.Fatal(err)
		}
		return
	}
	if err := run(ctx, *rounds, *out); err != nil {
		log.Fatal(err)
	}
}

// loadChild is one fresh-process load: the time from the module's bytes to the answer of
// its first call, printed in nanoseconds.
func loadChild(ctx context.Context, which, dir, wasmPath string) error {
	wasm, err := os.ReadFile(wasmPath)
	if err != nil {
		return err
	}
	start := time.Now()
	var rt runtime
	switch which {
	case "toolhost":
		rt, err = newToolhost(ctx, dir, wasm, memsandbox.New())
	case "extism":
		rt, err = newExtism(ctx, dir, wasm, memsandbox.New())
	default:
		return fmt.Errorf("unknown runtime %q", which)
	}
	if err != nil {
		return err
	}
	if _, err := rt.call(ctx, "noop"); err != nil {
		return err
	}
	fmt.Println(time.Since(start).Nanoseconds())
	rt.close(ctx)
	return nil
}

func run(ctx context.Context, rounds int, outPath string) error {
	work, err := os.MkdirTemp("", "toolhost-duel-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	fmt.Fprintln(os.Stderr, "building the guests...")
	wasm := map[string]string{}
	for _, g := range []string{"toolhost", "extism"} {
		p := filepath.Join(work, g+".wasm")
		if err := buildGuest(ctx, "./guests/"+g, p); err != nil {
			return err
		}
		wasm[g] = p
	}
	sb := memsandbox.New()
	sb.Put("f.txt", fourK)

	rts := map[string]runtime{}
	for _, name := range []string{"toolhost", "extism"} {
		bin, err := os.ReadFile(wasm[name])
		if err != nil {
			return err
		}
		dir := filepath.Join(work, name+"-cache")
		var rt runtime
		if name == "toolhost" {
			rt, err = newToolhost(ctx, dir, bin, sb)
		} else {
			rt, err = newExtism(ctx, dir, bin, sb)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		defer rt.close(ctx)
		rts[name] = rt
	}
	if err := sameAnswers(ctx, rts["toolhost"], rts["extism"]); err != nil {
		return err
	}
	// A warm cache: Extism's compile filled its cache before newExtism returned; toolhost
	// answered its first calls while compiling in the background, so wait for that to be
	// in its cache (and its record to say so) before a load is timed.
	if err := rts["toolhost"].(*toolhostRT).h.Settle(ctx); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}

	var lines []string
	times := map[string]map[string][]float64{} // case -> runtime -> ns/op per round
	for r := range rounds {
		order := []string{"toolhost", "extism"}
		if r%2 == 1 {
			slices.Reverse(order)
		}
		fmt.Fprintf(os.Stderr, "round %d/%d\n", r+1, rounds)
		for _, c := range cases {
			for _, name := range order {
				var ns float64
				var err error
				if c.name == "load_process" {
					ns, err = processLoads(ctx, self, name, filepath.Join(work, name+"-cache"), wasm[name], c.batch)
				} else {
					ns, err = batch(ctx, rts[name], c.name, c.batch)
				}
				if err != nil {
					return fmt.Errorf("%s %s: %w", name, c.name, err)
				}
				if times[c.name] == nil {
					times[c.name] = map[string][]float64{}
				}
				times[c.name][name] = append(times[c.name][name], ns)
				lines = append(lines, fmt.Sprintf("BenchmarkDuel/case=%s/rt=%s \t%d\t%.0f ns/op", c.name, name, c.batch, ns))
			}
		}
	}
	if outPath != "" {
		header := "goos: linux\ngoarch: amd64\npkg: github.com/toolhost/toolhost/bench/duel\n"
		if err := os.WriteFile(outPath, []byte(header+strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			return err
		}
	}
	printTable(os.Stdout, rounds, times)
	return nil
}

// batch times n calls of case c and returns the time per call.
func batch(ctx context.Context, rt runtime, c string, n int) (float64, error) {
	start := time.Now()
	for range n {
		var err error
		if c == "load" {
			err = rt.load(ctx)
		} else {
			_, err = rt.call(ctx, c)
		}
		if err != nil {
			return 0, err
		}
	}
	return float64(time.Since(start).Nanoseconds()) / float64(n), nil
}

// processLoads runs n fresh processes that each load the plugin once, and returns the mean
// of the times they measured (from the module's bytes to the first call's answer; the
// process start is not in it).
func processLoads(ctx context.Context, self, which, dir, wasm string, n int) (float64, error) {
	var total float64
	for range n {
		cmd := exec.CommandContext(ctx, self, "-load-child", which, "-dir", dir, "-wasm", wasm)
		cmd.WaitDelay = 5 * time.Second
		out, err := cmd.Output()
		if err != nil {
			return 0, fmt.Errorf("load in a new process: %w", err)
		}
		ns, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
		if err != nil {
			return 0, err
		}
		total += ns
	}
	return total / float64(n), nil
}

// sameAnswers checks that both hosts do the same work before anything is timed.
func sameAnswers(ctx context.Context, th, ex runtime) error {
	for _, c := range []string{"noop", "read4k", "echo64k"} {
		a, err := th.call(ctx, c)
		if err != nil {
			return fmt.Errorf("toolhost %s: %w", c, err)
		}
		b, err := ex.call(ctx, c)
		if err != nil {
			return fmt.Errorf("extism %s: %w", c, err)
		}
		want := map[string]string{"noop": "", "read4k": fourK, "echo64k": echoText}[c]
		if b != want {
			return fmt.Errorf("extism %s: got %d bytes, want %d", c, len(b), len(want))
		}
		// toolhost caps a text at 50,000 characters, keeping its head and its tail.
		if a != want && !(c == "echo64k" && strings.HasPrefix(a, want[:25000]) && strings.HasSuffix(a, want[len(want)-25000:])) {
			return fmt.Errorf("toolhost %s: got %d bytes, want %d", c, len(a), len(want))
		}
	}
	return nil
}

func printTable(w io.Writer, rounds int, times map[string]map[string][]float64) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "per call (median of %d interleaved rounds)\ttoolhost\tExtism\tratio\tratio range\t\n", rounds)
	for _, c := range cases {
		th, ex := times[c.name]["toolhost"], times[c.name]["extism"]
		var ratios []float64
		for i := range th {
			ratios = append(ratios, th[i]/ex[i])
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.2f\t%.2f–%.2f\t\n", c.title, dur(median(th)), dur(median(ex)),
			median(th)/median(ex), slices.Min(ratios), slices.Max(ratios))
	}
	tw.Flush()
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

func dur(ns float64) string {
	switch {
	case ns >= 1e6:
		return fmt.Sprintf("%.2f ms", ns/1e6)
	case ns >= 1e3:
		return fmt.Sprintf("%.1f µs", ns/1e3)
	}
	return fmt.Sprintf("%.0f ns", ns)
}

// buildGuest builds a guest package for wasip1 as a reactor, as toolhost's plugins are.
func buildGuest(ctx context.Context, pkg, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-buildmode=c-shared", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	cmd.Stderr = os.Stderr
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("build %s: %w", pkg, err)
	}
	return nil
}
