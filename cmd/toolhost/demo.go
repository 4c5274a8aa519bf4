package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/host"
)

// expect is what a demo step's result should be.
type expect int

const (
	expectOK    expect = iota // is_error false
	expectError               // is_error true: the demo shows a failure the model would see
	expectAny                 // either; the step only shows what happens
)

// demoStep is one step of the demo session. A step is a tool call (tool and input) or, for
// what is not a tool call (a snapshot commit, a sandbox rotation, ...), a run function.
// Later features add steps by appending to demoSteps.
type demoStep struct {
	title  string
	tool   string
	input  func(st *demoState) any
	expect expect
	// after sees the result of a tool call, e.g. to remember a background process's log.
	after func(st *demoState, res abi.Result)
	// run is a step that is not a tool call: it returns what to print.
	run func(ctx context.Context, st *demoState) (string, error)
}

// demoState is what the steps share. A step that replaces the sandbox sets both sandbox
// and session; the demo closes the sandbox that is current when it ends.
type demoState struct {
	cli       *cli // configuration, logger, output
	host      *host.Host
	sandbox   sandbox.Sandbox
	session   *host.Session
	workspace string            // host directory mounted at /home/user
	vars      map[string]string // values steps hand to later steps
}

const demoScript = `#!/usr/bin/env bash
# greet prints a greeting for every name it is given.
greet() {
  echo "Hello, $1!"
}

for name in "$@"; do
  greet "$name"
done
`

// demoSteps is the scripted session.
func demoSteps() []demoStep {
	in := func(kv ...any) func(*demoState) any { return func(*demoState) any { return obj(kv) } }
	return []demoStep{
		{title: "write a small script", tool: "write_file",
			input: in("path", "src/greet.sh", "content", demoScript)},
		{title: "write a README", tool: "write_file",
			input: in("path", "README.md", "content", "# demo\n\nRun `bash src/greet.sh NAME...` to greet people.\n")},
		{title: "read the script back", tool: "read_file",
			input: in("path", "src/greet.sh")},
		{title: "edit it", tool: "edit_file",
			input: in("path", "src/greet.sh", "old_string", `echo "Hello, $1!"`, "new_string", `echo "Hello, $1, from the sandbox!"`)},
		{title: "an edit whose old_string is not there (the model is told why)", tool: "edit_file", expect: expectError,
			input: in("path", "src/greet.sh", "old_string", "Goodbye", "new_string", "Farewell")},
		{title: "read a file that does not exist", tool: "read_file", expect: expectError,
			input: in("path", "src/missing.txt")},
		{title: "search the workspace", tool: "grep",
			input: in("pattern", "greet", "output_mode", "content")},
		{title: "find files by pattern", tool: "glob",
			input: in("pattern", "**/*.sh")},
		{title: "run the script", tool: "bash",
			input: in("command", "bash src/greet.sh Ada Grace")},
		{title: "look around the sandbox", tool: "bash",
			input: in("command", `echo "user: $(id -un) ($(id -u)), cwd: $PWD"; echo "/: $(ls / | tr '\n' ' ')"; ls /root 2>&1 | head -1; true`)},
		{title: "start a background process", tool: "bash",
			input: in("command", `for i in $(seq 1 5); do echo "tick $i"; echo $i > ticks.txt; sleep 0.1; done; echo finished`, "background", true),
			after: func(st *demoState, res abi.Result) {
				if m := logPathRE.FindString(resultText(res)); m != "" {
					st.vars["bg_log"] = strings.TrimRight(m, ".")
				}
			}},
		{title: "wait for it, then read the file it wrote", tool: "bash",
			input: in("command", `sleep 1; echo "ticks.txt: $(cat ticks.txt)"`)},
		{title: "read its log", tool: "bash",
			input: func(st *demoState) any {
				p := st.vars["bg_log"]
				if p == "" {
					p = "/tmp/no-log-path-in-the-background-result"
				}
				return obj{"command", "tail -n 20 " + p}
			}},
		{title: "a command that outlives its timeout", tool: "bash", expect: expectAny,
			input: in("command", "echo started; sleep 30; echo never printed", "timeout", 1)},
		{title: "a tool that does not exist", tool: "deploy", expect: expectError,
			input: in()},
		{title: "the workspace, seen from the host", run: listWorkspace},
	}
}

// listWorkspace is a step that is not a tool call: what the sandbox left in the host
// directory mounted at /home/user.
func listWorkspace(_ context.Context, st *demoState) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "%s:\n", st.workspace)
	err := filepath.WalkDir(st.workspace, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(st.workspace, p)
		fmt.Fprintf(&b, "  %-16s %6d bytes\n", rel, info.Size())
		return nil
	})
	return b.String(), err
}

// obj is a JSON object that keeps its keys in the order given: key, value, key, value...
type obj []any

func (o obj) MarshalJSON() ([]byte, error) {
	var b strings.Builder
	b.WriteByte('{')
	for i := 0; i+1 < len(o); i += 2 {
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := marshalJSON(o[i])
		if err != nil {
			return nil, err
		}
		v, err := marshalJSON(o[i+1])
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return []byte(b.String()), nil
}

// marshalJSON is json.Marshal without escaping <, > and &, and without the newline.
func marshalJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// logPathRE finds the log file of a background process in the bash tool's reply.
var logPathRE = regexp.MustCompile(`/tmp/[^\s'"\x60),;]+`)

func demoCommand() *command {
	cmd := &command{
		words:   []string{"demo"},
		summary: "run a short scripted agent session in a fresh workspace",
		help: `Loads the configured plugins, creates a local sandbox on a new temporary
workspace and makes the calls an agent would: write, read and edit files, grep,
glob, run commands in the foreground and in the background, and a few mistakes.
Prints every call, its result (shortened for display) and its latency. Exits 1
if any step's result is not what the demo expects.`,
		flags: func(fs *pflag.FlagSet) {
			fs.Bool("keep", false, "keep the workspace directory instead of removing it")
			fs.Int("lines", 12, "result lines to show per call (0: all)")
		},
		nargs: [2]int{0, 0},
	}
	cmd.run = runDemo
	return cmd
}

func runDemo(ctx context.Context, c *cli, _ []string) error {
	keep, _ := c.flags.GetBool("keep")
	maxLines, _ := c.flags.GetInt("lines")
	out := c.stdout

	ws, err := os.MkdirTemp("", "toolhost-demo-")
	if err != nil {
		return fmt.Errorf("creating the demo workspace: %w", err)
	}
	if keep {
		defer fmt.Fprintf(out, "\nworkspace kept: %s\n", ws)
	} else {
		defer os.RemoveAll(ws)
	}

	fmt.Fprintf(out, "toolhost demo: workspace %s, mounted at %s in the sandbox\n", ws, sandbox.WorkspaceRoot)
	t0 := time.Now()
	h, err := c.newHost(ctx)
	if err != nil {
		return err
	}
	defer c.closeHost(ctx, h)
	loadTime := time.Since(t0)
	var names []string
	for _, p := range h.Plugins() {
		names = append(names, p.Name+" "+p.Version)
	}
	fmt.Fprintf(out, "loaded %d plugins (%s), %d tools, in %s\n", len(names), strings.Join(names, ", "), len(h.Tools()), ms(loadTime))

	t0 = time.Now()
	sb, err := c.newSandbox(ctx, ws)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "sandbox %s ready in %s (network: %s)\n", sb.ID(), ms(time.Since(t0)), c.cfg.Sandbox.Network)

	st := &demoState{cli: c, host: h, sandbox: sb, session: h.OpenSession(sb), workspace: ws, vars: map[string]string{}}
	// A step may replace the sandbox (a rotation): close whichever is current at the end.
	defer func() { c.closeSandbox(ctx, st.sandbox) }()
	steps := demoSteps()
	var unexpected []string
	var latencies []time.Duration
	for i, step := range steps {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		fmt.Fprintf(out, "\n[%d/%d] %s\n", i+1, len(steps), step.title)
		if step.run != nil {
			t := time.Now()
			text, err := step.run(ctx, st)
			d := time.Since(t)
			if err != nil {
				unexpected = append(unexpected, fmt.Sprintf("step %d (%s): %v", i+1, step.title, err))
				fmt.Fprintf(out, "  FAILED (%s): %v\n", ms(d), err)
				continue
			}
			fmt.Fprintf(out, "  done in %s\n", ms(d))
			printIndented(out, text, maxLines)
			continue
		}

		input, err := marshalJSON(step.input(st))
		if err != nil {
			return fmt.Errorf("demo step %d: %w", i+1, err)
		}
		fmt.Fprintf(out, "  → %s %s\n", step.tool, clip(string(input), 160))
		t := time.Now()
		res, err := st.session.Dispatch(ctx, step.tool, input)
		d := time.Since(t)
		latencies = append(latencies, d)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			unexpected = append(unexpected, fmt.Sprintf("step %d (%s): host error: %v", i+1, step.title, err))
			fmt.Fprintf(out, "  ← HOST ERROR after %s: %s\n", ms(d), oneLine(err))
			continue
		}
		status := "ok"
		if res.IsError {
			status = "is_error"
		}
		note := ""
		if (step.expect == expectOK && res.IsError) || (step.expect == expectError && !res.IsError) {
			note = "  UNEXPECTED"
			unexpected = append(unexpected, fmt.Sprintf("step %d (%s): result %s", i+1, step.title, status))
		} else if step.expect == expectError {
			note = " (expected)"
		}
		fmt.Fprintf(out, "  ← %s in %s%s\n", status, ms(d), note)
		printIndented(out, resultText(res), maxLines)
		if step.after != nil {
			step.after(st, res)
		}
	}

	fmt.Fprintf(out, "\n%d steps, %d tool calls, median latency %s", len(steps), len(latencies), ms(median(latencies)))
	if len(unexpected) == 0 {
		fmt.Fprintf(out, "; every result as expected\n")
		return nil
	}
	fmt.Fprintf(out, "; %d unexpected:\n", len(unexpected))
	for _, u := range unexpected {
		fmt.Fprintf(out, "  - %s\n", u)
	}
	return fmt.Errorf("%d of %d demo steps did not go as expected", len(unexpected), len(steps))
}

// resultText joins a result's blocks for display; images show as a placeholder.
func resultText(res abi.Result) string {
	var parts []string
	for _, c := range res.Content {
		switch c.Type {
		case abi.ContentText:
			parts = append(parts, c.Text)
		case abi.ContentImage:
			mt, n := "", 0
			if c.Source != nil {
				mt, n = c.Source.MediaType, len(c.Source.Data)*3/4
			}
			parts = append(parts, fmt.Sprintf("[image %s, about %s]", mt, humanBytes(int64(n))))
		default:
			parts = append(parts, "["+c.Type+" block]")
		}
	}
	return strings.Join(parts, "\n")
}

// printIndented prints text indented, at most maxLines lines (0: all) of at most 160
// characters each, saying what it left out.
func printIndented(w io.Writer, text string, maxLines int) {
	text = strings.TrimRight(text, "\n")
	if text == "" {
		fmt.Fprintf(w, "    (empty)\n")
		return
	}
	lines := strings.Split(text, "\n")
	shown := lines
	if maxLines > 0 && len(lines) > maxLines {
		shown = lines[:maxLines]
	}
	for _, l := range shown {
		fmt.Fprintf(w, "    %s\n", clip(l, 160))
	}
	if len(shown) < len(lines) {
		n := len(lines) - len(shown)
		fmt.Fprintf(w, "    … %d more %s\n", n, plural(n, "line", "lines"))
	}
}

// clip cuts s to max characters, marking the cut.
func clip(s string, max int) string {
	r := []rune(s)
	if len(r) <= max {
		return s
	}
	return string(r[:max-1]) + "…"
}

func ms(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%d µs", d.Microseconds())
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
