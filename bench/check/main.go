// Command check is `make bench-check`: it measures each headline figure of
// docs/BENCHMARKS.md as the ratio (or the time) an outside run checks, three repeats or
// more, and prints the table with the minimum, median and maximum of the repeats, the
// machine's load (/proc/loadavg) before and after, the date and the commit. It judges
// nothing: no figure fails it, only a benchmark that cannot run.
//
// Every ratio is of two things measured in one run: either interleaved iteration by
// iteration inside one benchmark (its own ratio metric), or two sub-benchmarks of one
// test binary run one after the other, repeat by repeat (the repeats alternate which
// runs first where the benchmark allows). The test binaries are built once, then each
// repeat runs every figure before the next repeat begins.
//
//	go run ./bench/check [-repeats 3] [-only regexp] [-out file]
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// waitDelay bounds a Wait on a child that left a process holding its output pipes.
const waitDelay = 10 * time.Second

// results are one benchmark run's metrics: benchmark name (without -N) -> unit -> value.
type results map[string]map[string]float64

// run is one invocation of a package's benchmarks; figures derive from its results.
type run struct {
	pkg       string // the package's directory, or "duel" for bench/duel
	bench     string // -test.bench
	benchtime string
	figures   []figure
}

// figure is one row of the table.
type figure struct {
	name, goal string
	unit       string // "x" for a ratio, "ms"
	value      func(r results) (float64, error)
}

// metric reads one metric of one benchmark.
func metric(r results, bench, unit string) (float64, error) {
	m, ok := r[bench]
	if !ok {
		return 0, fmt.Errorf("no result of %s", bench)
	}
	v, ok := m[unit]
	if !ok {
		return 0, fmt.Errorf("%s reported no %q", bench, unit)
	}
	return v, nil
}

func ratioOf(bench, unit string) func(results) (float64, error) {
	return func(r results) (float64, error) { return metric(r, bench, unit) }
}

// pair is a/b of two benchmarks' metric unit.
func pair(a, b, unit string) func(results) (float64, error) {
	return func(r results) (float64, error) {
		x, err := metric(r, a, unit)
		if err != nil {
			return 0, err
		}
		y, err := metric(r, b, unit)
		if err != nil {
			return 0, err
		}
		if y == 0 {
			return 0, fmt.Errorf("%s: %s is 0", b, unit)
		}
		return x / y, nil
	}
}

func nsToMs(bench string) func(results) (float64, error) {
	return func(r results) (float64, error) {
		v, err := metric(r, bench, "ns/op")
		return v / 1e6, err
	}
}

func duelRatio(c string) func(results) (float64, error) {
	return pair("BenchmarkDuel/case="+c+"/rt=toolhost", "BenchmarkDuel/case="+c+"/rt=extism", "ns/op")
}

// runs are the headline figures (issue 34's table), each with the benchmark that
// measures it.
var runs = []run{
	{pkg: "duel", figures: []figure{
		{"duel vs Extism: no-op", "≤ 0.4", "x", duelRatio("noop")},
		{"duel vs Extism: 4 KB read", "≤ 0.4", "x", duelRatio("read4k")},
		{"duel vs Extism: 64 KB echo", "≤ 0.4", "x", duelRatio("echo64k")},
	}},
	{pkg: "./cli", bench: "^BenchmarkFirstCall$", benchtime: "3x", figures: []figure{
		{"cold / warm `call bash true`, to the result", "≤ 2x", "x", ratioOf("BenchmarkFirstCall", "cold/warm")},
		{"cold / warm, to the process's exit", "≤ 2x", "x", ratioOf("BenchmarkFirstCall", "cold-exit/warm")},
		{"one warm one-shot `toolhost call`, CPU (its own, and the session daemon's with the sandbox's)", "≤ 50 ms", "ms", ratioOf("BenchmarkFirstCall", "warm-cpu-ms")},
	}},
	{pkg: "./internal/sandbox/local", bench: "^BenchmarkCreateVsBwrap$", benchtime: "20x", figures: []figure{
		{"create → first command / bare bwrap, wall", "≤ 2x", "x", ratioOf("BenchmarkCreateVsBwrap", "create/bwrap")},
		{"create → first command / bare bwrap, CPU", "—", "x", ratioOf("BenchmarkCreateVsBwrap", "cpu-create/bwrap")},
	}},
	{pkg: "./internal/snapshot", bench: "^BenchmarkRestore$/^(chunked|tar-xzf)$", benchtime: "1x", figures: []figure{
		{"restore / `tar xzf` (benchTree, the bench dir's filesystem)", "≤ 0.5", "x", pair("BenchmarkRestore/chunked", "BenchmarkRestore/tar-xzf", "ns/op")},
	}},
	{pkg: "./internal/snapshot", bench: "^BenchmarkSave$/^second/", benchtime: "5x", figures: []figure{
		{"second save after a one-line edit, time", "< 50 ms", "ms", nsToMs("BenchmarkSave/second/chunked")},
		{"second save: its walk alone (the floor without a journal)", "—", "ms", nsToMs("BenchmarkSave/second/walk")},
	}},
	{pkg: "./internal/host", bench: "^BenchmarkReadFile4KRatio$", benchtime: "200x", figures: []figure{
		{"read_file 4 KB plugin / native", "≤ 1.2x", "x", ratioOf("BenchmarkReadFile4KRatio", "ratio")},
	}},
	{pkg: "./internal/egress", bench: "^BenchmarkGatewayConnectThroughput$", benchtime: "4x", figures: []figure{
		{"download via CONNECT / direct", "≥ 0.9", "x", ratioOf("BenchmarkGatewayConnectThroughput", "tunnel/direct")},
	}},
	{pkg: "./internal/egress", bench: "^BenchmarkGatewayForwardThroughput$", benchtime: "4x", figures: []figure{
		{"download via the forward proxy (plain http) / direct", "≥ 0.8", "x", ratioOf("BenchmarkGatewayForwardThroughput", "proxy/direct")},
	}},
}

func main() {
	repeats := flag.Int("repeats", 3, "repeats of every figure")
	only := flag.String("only", "", "only the figures whose name matches this regexp")
	out := flag.String("out", "", "also write the table (Markdown) here")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := check(ctx, *repeats, *only, *out); err != nil {
		fmt.Fprintln(os.Stderr, "bench-check:", err)
		os.Exit(1)
	}
}

func check(ctx context.Context, repeats int, only, outPath string) error {
	var re *regexp.Regexp
	if only != "" {
		var err error
		if re, err = regexp.Compile(only); err != nil {
			return fmt.Errorf("-only: %w", err)
		}
	}
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	var todo []run
	for _, r := range runs {
		var fs []figure
		for _, f := range r.figures {
			if re == nil || re.MatchString(f.name) {
				fs = append(fs, f)
			}
		}
		if len(fs) > 0 {
			r.figures = fs
			todo = append(todo, r)
		}
	}
	bin := filepath.Join(root, "bin", "bench-check")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	// Build every test binary first, so that no build runs between the repeats.
	built := map[string]string{}
	for _, r := range todo {
		if r.pkg == "duel" || built[r.pkg] != "" {
			continue
		}
		exe := filepath.Join(bin, strings.ReplaceAll(strings.TrimPrefix(r.pkg, "./"), "/", "_")+".test")
		fmt.Fprintf(os.Stderr, "building %s\n", r.pkg)
		cmd := exec.CommandContext(ctx, "go", "test", "-c", "-o", exe, r.pkg)
		cmd.Dir, cmd.Stdout, cmd.Stderr = root, os.Stderr, os.Stderr
		cmd.WaitDelay = waitDelay
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("building the benchmarks of %s: %w", r.pkg, err)
		}
		built[r.pkg] = exe
	}
	git := exec.CommandContext(ctx, "git", "-C", root, "rev-parse", "--short", "HEAD")
	git.WaitDelay = waitDelay
	commit, _ := git.Output()
	started, loadBefore := time.Now().UTC(), loadavg()
	values := map[string][]float64{}
	for i := range repeats {
		for _, r := range todo {
			fmt.Fprintf(os.Stderr, "repeat %d/%d: %s %s (load %s)\n", i+1, repeats, r.pkg, r.bench, loadavg())
			res, err := measure(ctx, root, built[r.pkg], r)
			if err != nil {
				return err
			}
			for _, f := range r.figures {
				v, err := f.value(res)
				if err != nil {
					return fmt.Errorf("%s: %w", f.name, err)
				}
				values[f.name] = append(values[f.name], v)
			}
		}
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "bench-check %s, commit %s, %s–%s UTC, load average (1/5/15 min) %s before, %s after; %d repeats\n\n",
		started.Format("2006-01-02"), strings.TrimSpace(string(commit)), started.Format("15:04"),
		time.Now().UTC().Format("15:04"), loadBefore, loadavg(), repeats)
	tw := tabwriter.NewWriter(&b, 0, 0, 1, ' ', 0)
	fmt.Fprintln(tw, "| figure\t| goal\t| min\t| median\t| max\t| repeats\t|")
	fmt.Fprintln(tw, "|---\t|---\t|---\t|---\t|---\t|---\t|")
	for _, r := range todo {
		for _, f := range r.figures {
			v := slices.Clone(values[f.name])
			slices.Sort(v)
			each := make([]string, len(values[f.name]))
			for i, x := range values[f.name] {
				each[i] = num(x, f.unit)
			}
			fmt.Fprintf(tw, "| %s\t| %s\t| %s\t| %s\t| %s\t| %s\t|\n", f.name, f.goal,
				num(v[0], f.unit), num(median(v), f.unit), num(v[len(v)-1], f.unit), strings.Join(each, ", "))
		}
	}
	tw.Flush()
	os.Stdout.Write(b.Bytes())
	if outPath != "" {
		return os.WriteFile(outPath, b.Bytes(), 0o644)
	}
	return nil
}

// measure runs one repeat of r and returns its results.
func measure(ctx context.Context, root, exe string, r run) (results, error) {
	var cmd *exec.Cmd
	var outFile string
	if r.pkg == "duel" {
		f, err := os.CreateTemp("", "duel-*.txt")
		if err != nil {
			return nil, err
		}
		f.Close()
		outFile = f.Name()
		defer os.Remove(outFile)
		cmd = exec.CommandContext(ctx, "go", "run", ".", "-rounds", "1", "-out", outFile)
		cmd.Dir = filepath.Join(root, "bench", "duel")
	} else {
		cmd = exec.CommandContext(ctx, exe, "-test.run", "^$", "-test.bench", r.bench,
			"-test.benchtime", r.benchtime, "-test.count", "1", "-test.timeout", "60m")
		cmd.Dir = filepath.Join(root, r.pkg) // as go test runs it: testdata is relative
	}
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, os.Stderr
	cmd.WaitDelay = waitDelay
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s %s: %w\n%s", r.pkg, r.bench, err, stdout.String())
	}
	src := io.Reader(&stdout)
	if outFile != "" {
		b, err := os.ReadFile(outFile)
		if err != nil {
			return nil, err
		}
		src = bytes.NewReader(b)
	}
	res := parse(src)
	if len(res) == 0 {
		return nil, fmt.Errorf("%s %s printed no benchmark result:\n%s", r.pkg, r.bench, stdout.String())
	}
	return res, nil
}

// parse reads go test -bench output: "BenchmarkX/sub-2  N  v unit  v unit ...".
func parse(r io.Reader) results {
	res := results{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 || !strings.HasPrefix(fields[0], "Benchmark") {
			continue
		}
		name := fields[0]
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i]
			}
		}
		m := map[string]float64{}
		for i := 2; i+1 < len(fields); i += 2 {
			if v, err := strconv.ParseFloat(fields[i], 64); err == nil {
				m[fields[i+1]] = v
			}
		}
		res[name] = m
	}
	return res
}

func median(s []float64) float64 {
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

func num(v float64, unit string) string {
	if unit == "ms" {
		return fmt.Sprintf("%.1f ms", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// loadavg is /proc/loadavg's three averages ("?" where there is none).
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], "/")
}

// moduleRoot is the directory of the go.mod above the working directory.
func moduleRoot() (string, error) {
	cmd := exec.Command("go", "env", "GOMOD")
	cmd.WaitDelay = waitDelay
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("run it inside the toolhost module (make bench-check)")
	}
	return filepath.Dir(mod), nil
}
