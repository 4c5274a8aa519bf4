package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/experimental"
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
	// after sees the result of a tool call, e.g. to remember a background process's log or
	// to check an image. Its text is printed; an error makes the step unexpected.
	after func(st *demoState, res abi.Result) (string, error)
	// run is a step that is not a tool call: it returns what to print.
	run func(ctx context.Context, st *demoState) (string, error)
}

// demoState is what the steps share. The tools run in sess, whose sandboxes have private
// workspaces, so a rotation really moves the work.
type demoState struct {
	cli      *cli // configuration, logger, output
	th       *toolhost.Toolhost
	provider *agingProvider
	sess     *toolhost.Session
	vars     map[string]string // values steps hand to later steps
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

// demoPatch changes the README and adds a usage page, in one apply_patch call.
const demoPatch = "*** Begin Patch\n" +
	"*** Update File: README.md\n" +
	"@@\n" +
	" Run `bash src/greet.sh NAME...` to greet people.\n" +
	"+See docs/USAGE.md for examples.\n" +
	"*** Add File: docs/USAGE.md\n" +
	"+# Usage\n" +
	"+\n" +
	"+    bash src/greet.sh Ada Grace\n" +
	"*** End Patch\n"

// demoSteps is the scripted session.
func demoSteps() []demoStep {
	steps := []demoStep{
		{title: "write a small script", tool: "write_file",
			input: in("path", "src/greet.sh", "content", demoScript)},
		{title: "write a README", tool: "write_file",
			input: in("path", "README.md", "content", "# demo\n\nRun `bash src/greet.sh NAME...` to greet people.\n")},
		{title: "read the script back", tool: "read_file",
			input: in("path", "src/greet.sh")},
		{title: "edit it", tool: "edit_file",
			input: in("path", "src/greet.sh", "old_string", `echo "Hello, $1!"`, "new_string", `echo "Hello, $1, from the sandbox!"`)},
		{title: "change two files in one patch (all or nothing)", tool: "apply_patch",
			input: in("input", demoPatch)},
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
		{title: "reach a site the network policy does not name (the model reads why)", tool: "bash", expect: expectAny,
			input: in("command", `python3 -c 'import urllib.request; urllib.request.urlopen("https://example.com", timeout=20)' 2>&1 | tail -n 1`),
			after: func(st *demoState, res abi.Result) (string, error) {
				if st.cli.cfg.Sandbox.Network != toolhost.NetworkEgress {
					return "", nil
				}
				const want = "[egress refused 1 destination: example.com is not an allowed domain"
				if !strings.Contains(resultText(res), want) {
					return "", fmt.Errorf("the result does not end with the gateway's note %q", want)
				}
				return "", nil
			}},
		{title: "start a background process", tool: "bash",
			input: in("command", `for i in $(seq 1 5); do echo "tick $i"; echo $i > ticks.txt; sleep 0.1; done; echo finished`, "background", true),
			after: func(st *demoState, res abi.Result) (string, error) {
				if m := logPathRE.FindString(resultText(res)); m != "" {
					st.vars["bg_log"] = strings.TrimRight(m, ".")
				}
				return "", nil
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
		{title: "the shell keeps its place: cd into src", tool: "bash",
			input: in("command", "cd src && ls")},
		{title: "the next call starts where the last ended", tool: "bash",
			input: in("command", "pwd; bash greet.sh Linus; cd ..")},
		{title: "a command that outlives its timeout", tool: "bash", expect: expectAny,
			input: in("command", "echo started; sleep 30; echo never printed", "timeout", 1)},
		{title: "a tool that does not exist", tool: "deploy", expect: expectError,
			input: in()},
		{title: "the workspace, as a snapshot packs it", run: func(ctx context.Context, st *demoState) (string, error) {
			return listArchive(ctx, experimental.Sandbox(st.sess), st.cli.cfg.Snapshot.Excludes)
		}},
	}
	return append(steps, projectSteps()...)
}

// in is a step's fixed input: key, value, key, value...
func in(kv ...any) func(*demoState) any { return func(*demoState) any { return obj(kv) } }

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
		summary: "run a scripted agent session: tools, a screenshot, a commit, a rotation, a wake",
		help: `Loads the configured plugins, opens a session for the configured project (a
local sandbox with a private workspace, restored from the project's newest
snapshot if it has one) and makes the calls an agent would: write, read and edit
files, grep, glob, run commands in the foreground and in the background, and a few
mistakes. Then the session's own work: a dev server in the sandbox and
take_screenshot of its page, a phase commit (a snapshot), the screenshots the
session took on its own, a sandbox rotation under a tool call, and a fresh session
that wakes from the newest snapshot. Prints every step, its result (shortened for
display; images as their size) and its latency. Exits 1 if any step's result is
not what the demo expects, a missing browser included.`,
		flags: func(fs *pflag.FlagSet) {
			fs.Bool("keep", false, "at the end, restore the newest snapshot into a new directory and keep it")
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
	project := c.cfg.Project

	t0 := time.Now()
	th, err := c.newToolhost(ctx)
	if err != nil {
		return err
	}
	defer c.closeToolhost(ctx, th)
	loadTime := time.Since(t0)
	fmt.Fprintf(out, "toolhost demo: project %s, store %s; each sandbox has a private workspace at %s\n", project, th.Storage().Where(), sandbox.WorkspaceRoot)
	var names []string
	for _, p := range th.Plugins() {
		names = append(names, p.Name+" "+p.Version)
	}
	fmt.Fprintf(out, "loaded %d plugins (%s), %d tools, in %s\n", len(names), strings.Join(names, ", "), len(th.Tools()), ms(loadTime))

	p, err := th.Provider(ctx)
	if err != nil {
		return err
	}
	st := &demoState{cli: c, th: th, provider: &agingProvider{Provider: p},
		vars: map[string]string{"started": time.Now().UTC().Truncate(time.Second).Format(time.RFC3339)}}
	t0 = time.Now()
	sess, err := th.Open(ctx, toolhost.SessionOptions{Provider: st.provider})
	if err != nil {
		return err
	}
	defer c.closeSession(ctx, sess)
	st.sess = sess
	woke := "a new project: the workspace starts empty"
	if in, ok := sess.Woke(); ok {
		// The steps write files as an agent new to the project would, and write_file
		// refuses to overwrite a file the session has not read: a second run would fail
		// on the first run's files. So the demo starts from an empty workspace; the
		// snapshot stays in the store.
		if err := clearWorkspace(ctx, experimental.Sandbox(sess)); err != nil {
			return err
		}
		woke = "woke from snapshot " + in.Key + "; the demo empties the workspace to start afresh (the snapshot stays in the store)"
	}
	fmt.Fprintf(out, "session ready in %s: sandbox %s (network: %s), %s\n", ms(time.Since(t0)), currentSandbox(sess), c.cfg.Sandbox.Network, woke)
	if !c.cfg.Screenshot.Enabled {
		fmt.Fprintf(out, "screenshots are off (screenshot.enabled: false): the screenshot steps will fail\n")
	}

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
		res, err := st.sess.Dispatch(ctx, step.tool, input)
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
			why := ""
			if res.IsError {
				why = ": " + firstLine(resultText(res), 240)
			}
			unexpected = append(unexpected, fmt.Sprintf("step %d (%s): result %s%s", i+1, step.title, status, why))
		} else if step.expect == expectError {
			note = " (expected)"
		}
		fmt.Fprintf(out, "  ← %s in %s%s\n", status, ms(d), note)
		printIndented(out, resultText(res), maxLines)
		if step.after != nil && note != "  UNEXPECTED" {
			text, err := step.after(st, res)
			if text != "" {
				printIndented(out, text, maxLines)
			}
			if err != nil {
				unexpected = append(unexpected, fmt.Sprintf("step %d (%s): %v", i+1, step.title, err))
				fmt.Fprintf(out, "  UNEXPECTED: %s\n", oneLine(err))
			}
		}
	}

	if keep {
		if dir, err := keepWorkspace(ctx, st); err != nil {
			fmt.Fprintf(out, "\nworkspace not kept: %v\n", err)
		} else {
			fmt.Fprintf(out, "\nworkspace kept: %s\n", dir)
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

// clearWorkspace removes everything in the sandbox's workspace.
func clearWorkspace(ctx context.Context, sb sandbox.Sandbox) error {
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"find", sandbox.WorkspaceRoot, "-mindepth", "1", "-delete"}, Timeout: time.Minute})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("exit %d: %s", res.ExitCode, res.Stderr)
	}
	if err != nil {
		return fmt.Errorf("demo: empty the woken workspace: %w", err)
	}
	return nil
}
