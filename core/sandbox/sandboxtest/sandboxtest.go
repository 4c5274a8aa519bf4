// Package sandboxtest is the conformance suite every sandbox provider runs: the behaviour
// of sandbox.Provider and sandbox.Sandbox that the host, sessions and snapshots rely on.
// Exec (status, streams, argv as data, working directory, environment, a command killed
// by a signal), timeouts and cancellation killing the whole process group, output capped
// at the source with head and tail kept, background processes that outlive their call,
// files and their errors, links and FIFOs the file API will not follow out or open,
// listing, archive and extract (modes and times kept, what a restore would refuse left
// out, hostile archives refused), previews, lifetime (end time, extension, shortening,
// expiry, Close), what Create refuses, concurrency, host workspaces (mounted or refused),
// and the optional abilities (port listing, process listing, archive reports, handoff,
// reconnecting to, listing and killing sandboxes by ID) when the provider has them.
//
// Commands are POSIX sh scripts that use simple commands, quotes, $VAR, $1, ;, &&, || and
// &, the redirections >, >> and >&2, and kill -9 $$, with echo, cat, pwd, sleep, yes,
// mkdir -p, ln -s, mkfifo, chmod (octal modes) and python3 -m http.server: what any Linux
// sandbox has, and what the in-memory sandbox implements.
package sandboxtest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/testenv"
)

// Run runs the suite against p, its parts in parallel. Each part creates its own
// sandboxes and closes them; p must be usable until Run's test and its cleanups end.
func Run(t *testing.T, p sandbox.Provider) {
	t.Run("Exec", func(t *testing.T) { t.Parallel(); testExec(t, p) })
	t.Run("TimeoutKillsProcessGroup", func(t *testing.T) { t.Parallel(); testTimeout(t, p) })
	t.Run("ContextEndsCommand", func(t *testing.T) { t.Parallel(); testContext(t, p) })
	t.Run("OutputCap", func(t *testing.T) { t.Parallel(); testOutputCap(t, p) })
	t.Run("Background", func(t *testing.T) { t.Parallel(); testBackground(t, p) })
	t.Run("Files", func(t *testing.T) { t.Parallel(); testFiles(t, p) })
	t.Run("FilesStayInWorkspace", func(t *testing.T) { t.Parallel(); testFilesStayInWorkspace(t, p) })
	t.Run("List", func(t *testing.T) { t.Parallel(); testList(t, p) })
	t.Run("ArchiveExtract", func(t *testing.T) { t.Parallel(); testArchive(t, p) })
	t.Run("ExtractRefusesHostile", func(t *testing.T) { t.Parallel(); testHostileArchive(t, p) })
	t.Run("Preview", func(t *testing.T) { t.Parallel(); testPreview(t, p) })
	t.Run("Lifetime", func(t *testing.T) { t.Parallel(); testLifetime(t, p) })
	t.Run("Expiry", func(t *testing.T) { t.Parallel(); testExpiry(t, p) })
	t.Run("Shortened", func(t *testing.T) { t.Parallel(); testShortened(t, p) })
	t.Run("Extended", func(t *testing.T) { t.Parallel(); testExtended(t, p) })
	t.Run("Closed", func(t *testing.T) { t.Parallel(); testClosed(t, p) })
	t.Run("CreateRefuses", func(t *testing.T) { t.Parallel(); testCreateRefuses(t, p) })
	t.Run("Concurrency", func(t *testing.T) { t.Parallel(); testConcurrency(t, p) })
	t.Run("HostWorkspace", func(t *testing.T) { t.Parallel(); testHostWorkspace(t, p) })
	t.Run("Handoff", func(t *testing.T) { t.Parallel(); testHandoff(t, p) })
	t.Run("ProcessLister", func(t *testing.T) { t.Parallel(); testProcessLister(t, p) })
	t.Run("ArchiveReporter", func(t *testing.T) { t.Parallel(); testArchiveReporter(t, p) })
	t.Run("Reconnect", func(t *testing.T) { t.Parallel(); testReconnect(t, p) })
}

// bound is how long the suite waits for anything before it calls it broken: a liveness
// bound, far above what a working provider takes, never a performance assertion.
const bound = 60 * time.Second

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*bound)
	t.Cleanup(cancel)
	return ctx
}

// create makes a sandbox for one test and closes it at the end.
func create(t *testing.T, p sandbox.Provider, opts sandbox.CreateOptions) sandbox.Sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	sb, err := p.Create(ctx, opts)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		defer cancel()
		if err := sb.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return sb
}

// sh runs a script with sh -c and fails the test on a transport error.
func sh(t *testing.T, sb sandbox.Sandbox, script string) sandbox.ExecResult {
	t.Helper()
	res, err := sb.Exec(ctxFor(t), sandbox.ExecRequest{Argv: []string{"sh", "-c", script}, Timeout: bound})
	if err != nil {
		t.Fatalf("sh -c %q: %v", script, err)
	}
	return res
}

// witness starts a background process in sb that writes witness-N.txt after secs seconds,
// and waits until it has: the proof that secs seconds of the sandbox's own time have
// passed, ordered after everything started before it, without the test sleeping.
func witness(t *testing.T, sb sandbox.Sandbox, secs int) {
	t.Helper()
	name := fmt.Sprintf("witness-%d.txt", time.Now().UnixNano())
	if _, err := sb.Start(ctxFor(t), sandbox.ExecRequest{Argv: []string{"sh", "-c", fmt.Sprintf("sleep %d; echo done > %s", secs, name)}}); err != nil {
		t.Fatalf("starting the witness: %v", err)
	}
	if !testenv.Eventually(func() bool { _, err := sb.Stat(ctxFor(t), name); return err == nil }) {
		t.Fatalf("the witness never wrote %s", name)
	}
}

func write(t *testing.T, sb sandbox.Sandbox, p, content string) {
	t.Helper()
	if err := sb.WriteFile(ctxFor(t), p, []byte(content)); err != nil {
		t.Fatalf("WriteFile %s: %v", p, err)
	}
}

func read(t *testing.T, sb sandbox.Sandbox, p string) string {
	t.Helper()
	b, err := sb.ReadFile(ctxFor(t), p, 0)
	if err != nil {
		t.Fatalf("ReadFile %s: %v", p, err)
	}
	return string(b)
}

func testExec(t *testing.T, p sandbox.Provider) {
	sb := create(t, p, sandbox.CreateOptions{Env: map[string]string{"FROM_CREATE": "c1"}})
	ctx := ctxFor(t)
	res := sh(t, sb, `echo out; echo err >&2; exit 7`)
	if res.ExitCode != 7 || string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" || res.TimedOut {
		t.Errorf("exit 7: %+v stdout=%q stderr=%q", res, res.Stdout, res.Stderr)
	}
	if res := sh(t, sb, "true && echo and || echo or"); res.ExitCode != 0 || string(res.Stdout) != "and\n" {
		t.Errorf("true && ...: %+v %q", res, res.Stdout)
	}
	// argv runs without a shell: what looks like shell syntax is data.
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"echo", "$HOME", "a b", ";", "$(id)"}})
	if err != nil || string(res.Stdout) != "$HOME a b ; $(id)\n" {
		t.Errorf("argv: %q %v", res.Stdout, err)
	}
	if res := sh(t, sb, "pwd"); string(res.Stdout) != sandbox.WorkspaceRoot+"\n" {
		t.Errorf("default working directory %q, want %s", res.Stdout, sandbox.WorkspaceRoot)
	}
	write(t, sb, "sub/dir/f.txt", "x")
	for _, cwd := range []string{"sub/dir", sandbox.WorkspaceRoot + "/sub/dir"} {
		res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"pwd"}, Cwd: cwd})
		if err != nil || string(res.Stdout) != sandbox.WorkspaceRoot+"/sub/dir\n" {
			t.Errorf("Cwd %s: %q %v", cwd, res.Stdout, err)
		}
	}
	if _, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"pwd"}, Cwd: "missing"}); err == nil {
		t.Error("a missing working directory: no error")
	}
	if _, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"no-such-program-here"}}); err == nil {
		t.Error("an unknown program: no error")
	}
	res, err = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", `echo "$HOME|$FROM_CREATE|$FROM_EXEC"`},
		Env: map[string]string{"FROM_EXEC": "e1"}})
	if err != nil || string(res.Stdout) != sandbox.WorkspaceRoot+"|c1|e1\n" {
		t.Errorf("environment: %q %v; want HOME, CreateOptions.Env and ExecRequest.Env", res.Stdout, err)
	}
	// Processes and the file API see the same files.
	write(t, sb, "in.txt", "from the file API\n")
	if res := sh(t, sb, "cat in.txt; echo from a process > out.txt"); string(res.Stdout) != "from the file API\n" {
		t.Errorf("cat of a written file: %q", res.Stdout)
	}
	if got := read(t, sb, "out.txt"); got != "from a process\n" {
		t.Errorf("a file a process wrote: %q", got)
	}
	// stdin is empty: a reader gets EOF instead of waiting.
	if res := sh(t, sb, "cat; echo done"); string(res.Stdout) != "done\n" {
		t.Errorf("stdin: %q", res.Stdout)
	}
	if res.Duration <= 0 {
		t.Errorf("Duration %s", res.Duration)
	}
	// The arguments after sh -c SCRIPT NAME are data to the script as well.
	res, err = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", `echo "$1"`, "sh", "$(not expanded) 'quoted' ; $HOME"}})
	if err != nil || string(res.Stdout) != "$(not expanded) 'quoted' ; $HOME\n" {
		t.Errorf("a script's argument: %q %v", res.Stdout, err)
	}
	if _, err := sb.Exec(ctx, sandbox.ExecRequest{}); err == nil {
		t.Error("an empty argv: no error")
	}
	// A command killed by a signal exits -1, and that is no timeout.
	if res := sh(t, sb, "kill -9 $$"); res.ExitCode != -1 || res.TimedOut {
		t.Errorf("a shell that killed itself: %+v, want exit -1 and not TimedOut", res)
	}
	// A sandbox created without a timeout lives the provider's default, some time.
	if !sb.EndsAt().After(sb.StartedAt()) {
		t.Errorf("a sandbox created without a timeout ends at %s, started at %s", sb.EndsAt(), sb.StartedAt())
	}
}

func testTimeout(t *testing.T, p sandbox.Provider) {
	sb := create(t, p, sandbox.CreateOptions{})
	ctx := ctxFor(t)
	// The partial output comes back, the status says killed. The timeout leaves a loaded
	// machine time to start the shell and let it print.
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo before; sleep 60; echo after"}, Timeout: 3 * time.Second})
	if err != nil || !res.TimedOut || res.ExitCode != -1 || string(res.Stdout) != "before\n" {
		t.Fatalf("a command past its timeout: %+v stdout=%q %v; want TimedOut, exit -1, the output so far", res, res.Stdout, err)
	}
	// The whole process group dies: a child that would write later never does.
	res, err = sb.Exec(ctx, sandbox.ExecRequest{
		Argv:    []string{"sh", "-c", `sh -c "sleep 4; echo late > late.txt" & sleep 60`},
		Timeout: 3 * time.Second,
	})
	if err != nil || !res.TimedOut {
		t.Fatalf("a command with a child past its timeout: %+v %v", res, err)
	}
	// A witness started after the kill outlasts the child's sleep: once it has written,
	// the child, had it survived, would have written too.
	witness(t, sb, 5)
	if _, err := sb.Stat(ctx, "late.txt"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("a child of a timed-out command survived it (late.txt: %v)", err)
	}
	// A background job still running when the command ends does not hold the call.
	if res := sh(t, sb, "sleep 60 & echo hi"); string(res.Stdout) != "hi\n" || res.ExitCode != 0 || res.TimedOut {
		t.Errorf("a command that leaves a job behind: %+v %q", res, res.Stdout)
	}
	deadAtReturn(t, sb)
}

// deadAtReturn: when Exec returns a timed-out command, its children are dead already, not
// dying: a server the command started no longer listens. It is seen in the sandbox's
// port listing, so only where the sandbox lists its ports.
func deadAtReturn(t *testing.T, sb sandbox.Sandbox) {
	t.Helper()
	ctx := ctxFor(t)
	if _, err := sandbox.Ports(ctx, sb); errors.Is(err, sandbox.ErrUnsupported) {
		return
	}
	const port = 8125
	listening := func() bool {
		ports, err := sandbox.Ports(ctx, sb)
		return err == nil && slices.ContainsFunc(ports, func(lp sandbox.ListeningPort) bool { return lp.Port == port })
	}
	// The timeout must strike while the server listens, which the test sees as it polls:
	// on a machine too loaded to start the server in time, again with a longer timeout.
	for timeout := 3 * time.Second; ; timeout *= 2 {
		var seen atomic.Bool
		stop, polled := make(chan struct{}), make(chan struct{})
		go func() { // owned here: stopped and waited for when Exec returns
			defer close(polled)
			for !seen.Load() {
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
				seen.Store(listening())
			}
		}()
		res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", fmt.Sprintf("python3 -m http.server %d & sleep 60", port)}, Timeout: timeout})
		close(stop)
		<-polled
		if err != nil || !res.TimedOut {
			t.Fatalf("a command that starts a server and sleeps, past its timeout: %+v %v", res, err)
		}
		if seen.Load() {
			if listening() {
				t.Errorf("a server started by a timed-out command still listens on %d when Exec has returned: the process group was not dead yet", port)
			}
			return
		}
		if timeout >= 24*time.Second {
			t.Fatalf("python3 -m http.server never listened on %d within a %s timeout", port, timeout)
		}
	}
}

func testContext(t *testing.T, p sandbox.Provider) {
	sb := create(t, p, sandbox.CreateOptions{})
	// A deadline of ctx ends the command like a timeout, its whole process group with it.
	// The deadline leaves a loaded machine time to start the child.
	dctx, dcancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer dcancel()
	res, _ := sb.Exec(dctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", `sh -c "sleep 4; echo late > late-deadline.txt" & sleep 60`}})
	if !res.TimedOut || res.ExitCode != -1 {
		t.Errorf("ctx deadline: %+v, want TimedOut", res)
	}
	// Cancelling ctx ends it too, once its child runs, and the error says so.
	cctx, ccancel := context.WithCancel(context.Background())
	defer ccancel()
	cancelled := make(chan struct{})
	go func() { // owned here: ends with the command, waited for below
		defer close(cancelled)
		testenv.Eventually(func() bool { return cctx.Err() != nil || statErr(sb, "child-started.txt") == nil })
		ccancel()
	}()
	res, err := sb.Exec(cctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", `sh -c "echo > child-started.txt; sleep 3; echo late > late-cancel.txt" & sleep 60`}})
	ccancel()
	<-cancelled
	if !res.TimedOut || !errors.Is(err, context.Canceled) {
		t.Errorf("ctx cancelled: %+v %v, want TimedOut and context.Canceled", res, err)
	}
	// A witness started now outlasts both children's sleeps: once it has written, a child
	// that survived would have written too.
	witness(t, sb, 5)
	for _, late := range []string{"late-deadline.txt", "late-cancel.txt"} {
		if err := statErr(sb, late); !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("a child of a command whose ctx ended survived it (%s: %v)", late, err)
		}
	}
	// The sandbox carries on.
	if res := sh(t, sb, "echo still here"); string(res.Stdout) != "still here\n" {
		t.Errorf("after a cancelled command: %q", res.Stdout)
	}
}

// bigFile is n bytes of numbered lines: head and tail can be told apart.
func bigFile(n int) []byte {
	var b bytes.Buffer
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "line %08d of the big file\n", i)
	}
	return b.Bytes()[:n]
}

func testOutputCap(t *testing.T, p sandbox.Provider) {
	sb := create(t, p, sandbox.CreateOptions{})
	ctx := ctxFor(t)
	big := bigFile(1 << 20)
	if err := sb.WriteFile(ctx, "big.txt", big); err != nil {
		t.Fatal(err)
	}
	check := func(what string, got []byte, cut int64, limit int) {
		t.Helper()
		if len(got) > limit || int64(len(got))+cut != int64(len(big)) {
			t.Errorf("%s: kept %d bytes and cut %d of %d, want at most %d kept and the rest counted", what, len(got), cut, len(big), limit)
			return
		}
		// The head and the tail are kept, the middle dropped.
		if q := limit / 4; !bytes.HasPrefix(got, big[:q]) || !bytes.HasSuffix(got, big[len(big)-q:]) {
			t.Errorf("%s: the kept bytes are not the stream's head and tail", what)
		}
	}
	const limit = 64 << 10
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"cat", "big.txt"}, MaxOutputBytes: limit})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("cat: %+v %v", res, err)
	}
	check("stdout", res.Stdout, res.StdoutCut, limit)
	res, err = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "cat big.txt >&2"}, MaxOutputBytes: limit})
	if err != nil {
		t.Fatal(err)
	}
	check("stderr", res.Stderr, res.StderrCut, limit)
	res, err = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"cat", "big.txt"}})
	if err != nil {
		t.Fatal(err)
	}
	check("the default bound", res.Stdout, res.StdoutCut, sandbox.DefaultMaxOutputBytes)
	// Under the bound, everything.
	res, err = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"echo", "short"}, MaxOutputBytes: limit})
	if err != nil || string(res.Stdout) != "short\n" || res.StdoutCut != 0 {
		t.Errorf("short output: %q cut %d %v", res.Stdout, res.StdoutCut, err)
	}
	// A stream that never ends is capped all the same: its timeout ends it (leaving a
	// loaded machine time to start it), head and tail kept, the rest counted.
	res, err = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"yes"}, Timeout: 3 * time.Second, MaxOutputBytes: limit})
	if err != nil || !res.TimedOut || len(res.Stdout) != limit || res.StdoutCut <= 0 {
		t.Errorf("yes past its timeout: %v, TimedOut %v, kept %d bytes and cut %d; want %d kept and more cut", err, res.TimedOut, len(res.Stdout), res.StdoutCut, limit)
	} else if !bytes.HasPrefix(res.Stdout, []byte("y\ny\n")) || !bytes.HasSuffix(res.Stdout, []byte("y\n")) && !bytes.HasSuffix(res.Stdout, []byte("y")) {
		t.Errorf("yes: the kept bytes are not the head and tail of its lines")
	}
}

func testBackground(t *testing.T, p sandbox.Provider) {
	sb := create(t, p, sandbox.CreateOptions{})
	cctx, cancel := context.WithCancel(context.Background())
	pr, err := sb.Start(cctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo started; echo oops >&2; sleep 1; echo alive > alive.txt; sleep 60"}})
	cancel() // the process outlives the call that started it
	if err != nil {
		t.Fatal(err)
	}
	if pr.ID == "" || pr.PID <= 0 || !path.IsAbs(pr.LogPath) {
		t.Errorf("Process %+v: want an ID, a PID and an absolute log path", pr)
	}
	if !testenv.Eventually(func() bool { _, err := sb.Stat(ctxFor(t), "alive.txt"); return err == nil }) {
		t.Fatal("the background process never wrote alive.txt")
	}
	// Its output goes to its log, both streams in the order written.
	var log string
	if !testenv.Eventually(func() bool { log = string(sh(t, sb, "cat "+pr.LogPath).Stdout); return log == "started\noops\n" }) {
		t.Errorf("the log %s holds %q, want the process's stdout and stderr, started and oops", pr.LogPath, log)
	}
	pr2, err := sb.Start(ctxFor(t), sandbox.ExecRequest{Argv: []string{"sh", "-c", "pwd > where.txt"}, Cwd: "sub", Env: map[string]string{"X": "1"}})
	if err == nil {
		t.Errorf("Start in a missing directory: %+v, no error", pr2)
	}
	write(t, sb, "sub/keep", "")
	pr2, err = sb.Start(ctxFor(t), sandbox.ExecRequest{Argv: []string{"sh", "-c", `echo "$X" > where.txt; pwd >> where.txt`}, Cwd: "sub", Env: map[string]string{"X": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if pr2.ID == pr.ID {
		t.Errorf("two processes share the ID %s", pr.ID)
	}
	want := "1\n" + sandbox.WorkspaceRoot + "/sub\n"
	if !testenv.Eventually(func() bool { b, _ := sb.ReadFile(ctxFor(t), "sub/where.txt", 0); return string(b) == want }) {
		b, _ := sb.ReadFile(ctxFor(t), "sub/where.txt", 0)
		t.Errorf("a background process's environment and directory: %q, want %q", b, want)
	}
}

// testProcessLister: a sandbox that lists its background processes lists one that runs,
// under the ID Start gave it, through a wrapper, and not once it has exited.
func testProcessLister(t *testing.T, p sandbox.Provider) {
	sb := create(t, p, sandbox.CreateOptions{})
	pl, ok := sandbox.As[sandbox.ProcessLister](wrapper{sb})
	if !ok {
		return // an optional ability
	}
	ctx := ctxFor(t)
	long, err := sb.Start(ctx, sandbox.ExecRequest{Argv: []string{"sleep", "60"}})
	if err != nil {
		t.Fatal(err)
	}
	short, err := sb.Start(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo done > done.txt"}})
	if err != nil {
		t.Fatal(err)
	}
	ids := func() []string {
		procs, err := pl.Processes(ctx)
		if err != nil {
			t.Fatalf("Processes: %v", err)
		}
		var out []string
		for _, pr := range procs {
			out = append(out, pr.ID)
			if pr.ID == long.ID && pr.PID != long.PID {
				t.Errorf("process %s: pid %d, Start said %d", pr.ID, pr.PID, long.PID)
			}
		}
		return out
	}
	if !testenv.Eventually(func() bool { got := ids(); return slices.Contains(got, long.ID) && !slices.Contains(got, short.ID) }) {
		t.Errorf("Processes: %v, want %s (running) and not %s (exited)", ids(), long.ID, short.ID)
	}
	if res := sh(t, sb, "cat done.txt"); string(res.Stdout) != "done\n" {
		t.Errorf("the short process did not run: %q", res.Stdout)
	}
}

// testArchiveReporter: a sandbox that reports on its archives writes what Archive writes
// and counts what it stored.
func testArchiveReporter(t *testing.T, p sandbox.Provider) {
	sb := create(t, p, sandbox.CreateOptions{})
	ar, ok := sandbox.As[sandbox.ArchiveReporter](wrapper{sb})
	if !ok {
		return // an optional ability
	}
	write(t, sb, "a.txt", "hello\n")
	write(t, sb, "d/b.txt", "world!\n")
	var buf bytes.Buffer
	rep, err := ar.ArchiveReport(ctxFor(t), &buf, []string{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Files != 2 || rep.Bytes != int64(len("hello\n")+len("world!\n")) || rep.Skipped != 0 {
		t.Errorf("report %+v: want 2 files of 13 bytes, none skipped", rep)
	}
	if m := untar(t, buf.Bytes()); m["a.txt"] != "hello\n" || m["d/b.txt"] != "world!\n" {
		t.Errorf("the reported archive holds %v", m)
	}
}

func testFiles(t *testing.T, p sandbox.Provider) {
	sb := create(t, p, sandbox.CreateOptions{})
	ctx := ctxFor(t)
	if lr, err := sb.List(ctx, sandbox.ListRequest{Path: ".", Recursive: true}); err != nil || len(lr.Entries) != 0 {
		t.Errorf("a fresh workspace holds %q (%v), want nothing", paths(lr), err)
	}
	write(t, sb, "deep/er/f.txt", "hello")
	if got := read(t, sb, sandbox.WorkspaceRoot+"/deep/er/f.txt"); got != "hello" {
		t.Errorf("read back by absolute path: %q", got)
	}
	every := make([]byte, 256)
	for i := range every {
		every[i] = byte(i)
	}
	if err := sb.WriteFile(ctx, "bin.dat", every); err != nil {
		t.Fatal(err)
	}
	if b, err := sb.ReadFile(ctx, "bin.dat", 0); err != nil || !bytes.Equal(b, every) {
		t.Errorf("binary round trip: %v", err)
	}
	write(t, sb, "deep/er/f.txt", "replaced")
	if got := read(t, sb, "deep/er/f.txt"); got != "replaced" {
		t.Errorf("overwrite: %q", got)
	}
	if err := sb.WriteFile(ctx, "empty", nil); err != nil {
		t.Fatal(err)
	}
	if b, err := sb.ReadFile(ctx, "empty", 0); err != nil || len(b) != 0 {
		t.Errorf("empty file: %q %v", b, err)
	}
	if b, err := sb.ReadFile(ctx, "deep/er/f.txt", 8); err != nil || string(b) != "replaced" {
		t.Errorf("a file exactly at the limit: %q %v", b, err)
	}
	for _, c := range []struct {
		what string
		err  error
		want error
	}{
		{"read over the limit", readErr(sb, "deep/er/f.txt", 7), sandbox.ErrTooLarge},
		{"read of a missing file", readErr(sb, "nope", 0), sandbox.ErrNotFound},
		{"read of a directory", readErr(sb, "deep", 0), sandbox.ErrIsDir},
		{"write over a directory", sb.WriteFile(ctx, "deep", []byte("x")), sandbox.ErrIsDir},
		{"write below a file", sb.WriteFile(ctx, "deep/er/f.txt/x", []byte("x")), sandbox.ErrNotDir},
		{"stat of a missing path", statErr(sb, "missing"), sandbox.ErrNotFound},
	} {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: %v, want %v", c.what, c.err, c.want)
		}
	}
	for _, out := range []string{"../x", "/etc/passwd", "deep/../../x", sandbox.WorkspaceRoot + "x/y"} {
		if err := readErr(sb, out, 0); !errors.Is(err, sandbox.ErrOutside) {
			t.Errorf("read %s: %v, want ErrOutside", out, err)
		}
		if err := sb.WriteFile(ctx, out, []byte("x")); !errors.Is(err, sandbox.ErrOutside) {
			t.Errorf("write %s: %v, want ErrOutside", out, err)
		}
		if err := statErr(sb, out); !errors.Is(err, sandbox.ErrOutside) {
			t.Errorf("stat %s: %v, want ErrOutside", out, err)
		}
	}
	fi, err := sb.Stat(ctx, "deep/er/f.txt")
	if err != nil || fi.Size != 8 || !fi.Mode.IsRegular() || fi.Path != "deep/er/f.txt" || fi.ModTime.IsZero() {
		t.Errorf("Stat of a file: %+v %v", fi, err)
	}
	if fi, err := sb.Stat(ctx, "deep"); err != nil || !fi.IsDir() {
		t.Errorf("Stat of a directory: %+v %v", fi, err)
	}
	// A rewrite keeps the file's permission bits: a script stays executable.
	if res := sh(t, sb, "chmod 755 deep/er/f.txt"); res.ExitCode != 0 {
		t.Fatalf("chmod: %+v %q", res, res.Stderr)
	}
	write(t, sb, "deep/er/f.txt", "again")
	if fi, err := sb.Stat(ctx, "deep/er/f.txt"); err != nil || fi.Mode.Perm() != 0o755 || fi.Size != 5 {
		t.Errorf("a rewritten file of mode 755: %+v %v", fi, err)
	}
	// A big file goes both ways whole (16 MiB that do not compress).
	big := make([]byte, 16<<20)
	rand.NewChaCha8([32]byte{'s', 'a', 'n', 'd', 'b', 'o', 'x'}).Read(big)
	if err := sb.WriteFile(ctx, "big.bin", big); err != nil {
		t.Fatal(err)
	}
	if b, err := sb.ReadFile(ctx, "big.bin", 0); err != nil || !bytes.Equal(b, big) {
		t.Errorf("16 MiB written and read back: %d bytes, equal %v, %v", len(b), bytes.Equal(b, big), err)
	}
}

// testFilesStayInWorkspace: the file API follows links only while they stay in the
// workspace, never writes through one that leads out, and never opens a FIFO (whose open
// waits for the other end). The links and the FIFO are made by the sandbox's own
// processes, as a hostile command would make them.
func testFilesStayInWorkspace(t *testing.T, p sandbox.Provider) {
	sb := create(t, p, sandbox.CreateOptions{})
	ctx := ctxFor(t)
	setup := `echo secret > /tmp/outside.txt && ln -s /tmp/outside.txt out && ln -s ../../../../tmp/outside.txt rel &&
		ln -s /tmp tmpdir && ln -s /etc/passwd passwd && echo inside > a.txt && ln -s a.txt in && mkdir d &&
		ln -s ../a.txt d/up && ln -s loop1 loop2 && ln -s loop2 loop1 &&
		ln -s /nowhere dangling && mkfifo fifo`
	if res := sh(t, sb, setup); res.ExitCode != 0 {
		t.Fatalf("making the links: %+v %q", res, res.Stderr)
	}
	for _, pth := range []string{"out", "rel", "passwd", "tmpdir/outside.txt", sandbox.WorkspaceRoot + "/tmpdir/outside.txt"} {
		if b, err := sb.ReadFile(ctx, pth, 0); !errors.Is(err, sandbox.ErrOutside) {
			t.Errorf("ReadFile %s: %q %v, want ErrOutside", pth, b, err)
		}
	}
	for _, pth := range []string{"out", "rel", "tmpdir/new.txt"} {
		if err := sb.WriteFile(ctx, pth, []byte("overwritten")); !errors.Is(err, sandbox.ErrOutside) {
			t.Errorf("WriteFile %s: %v, want ErrOutside", pth, err)
		}
	}
	if res := sh(t, sb, "cat /tmp/outside.txt; cat /tmp/new.txt"); string(res.Stdout) != "secret\n" || res.ExitCode == 0 {
		t.Errorf("outside the workspace after the refused writes: %q (exit %d), want the secret unchanged and no new file", res.Stdout, res.ExitCode)
	}
	for _, pth := range []string{"in", "d/up"} {
		if got, err := sb.ReadFile(ctx, pth, 0); err != nil || string(got) != "inside\n" {
			t.Errorf("ReadFile of %s, a link inside the workspace: %q %v", pth, got, err)
		}
	}
	// A write through a link inside replaces the file it names; the link stays.
	write(t, sb, "in", "through the link\n")
	if got := read(t, sb, "a.txt"); got != "through the link\n" {
		t.Errorf("the file a link names after a write through it: %q", got)
	}
	if fi, err := sb.Stat(ctx, "in"); err != nil || fi.Mode&os.ModeSymlink == 0 {
		t.Errorf("a link written through: %+v %v, want it still a link", fi, err)
	}
	for _, pth := range []string{"loop1", "dangling"} {
		if _, err := sb.ReadFile(ctx, pth, 0); err == nil {
			t.Errorf("ReadFile of %s: no error", pth)
		}
	}
	// A FIFO is refused, not opened: the calls return within the hang bound.
	fctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	if _, err := sb.ReadFile(fctx, "fifo", 0); !errors.Is(err, sandbox.ErrNotRegular) {
		t.Errorf("ReadFile of a FIFO: %v, want ErrNotRegular", err)
	}
	if err := sb.WriteFile(fctx, "fifo", []byte("x")); !errors.Is(err, sandbox.ErrNotRegular) {
		t.Errorf("WriteFile of a FIFO: %v, want ErrNotRegular", err)
	}
	if fi, err := sb.Stat(ctx, "passwd"); err != nil || fi.Mode&os.ModeSymlink == 0 {
		t.Errorf("Stat of a link out: %+v %v, want the link itself", fi, err)
	}
	lr, err := sb.List(ctx, sandbox.ListRequest{Path: ".", Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range lr.Entries {
		if strings.HasPrefix(e.Path, "tmpdir/") {
			t.Errorf("List followed a link out of the workspace: %s", e.Path)
		}
	}
}

func readErr(sb sandbox.Sandbox, p string, max int64) error {
	_, err := sb.ReadFile(context.Background(), p, max)
	return err
}

func statErr(sb sandbox.Sandbox, p string) error {
	_, err := sb.Stat(context.Background(), p)
	return err
}

func paths(r sandbox.ListResult) string {
	var out []string
	for _, e := range r.Entries {
		out = append(out, e.Path)
	}
	return strings.Join(out, " ")
}

func testList(t *testing.T, p sandbox.Provider) {
	sb := create(t, p, sandbox.CreateOptions{})
	ctx := ctxFor(t)
	for _, f := range []string{"a.txt", "b/c.txt", "b/d/e.txt", "node_modules/pkg/i.js", "b/node_modules/x.js"} {
		write(t, sb, f, f)
	}
	// What a process makes is listed too; a link is listed as a link.
	if res := sh(t, sb, "echo from a process > b/proc.txt && ln -s b link"); res.ExitCode != 0 {
		t.Fatalf("a process making a file and a link: %+v %q", res, res.Stderr)
	}
	lr, err := sb.List(ctx, sandbox.ListRequest{Path: "."})
	if err != nil || paths(lr) != "a.txt b link node_modules" || lr.Truncated {
		t.Errorf("List .: %q %v", paths(lr), err)
	} else if !lr.Entries[1].IsDir() || lr.Entries[0].IsDir() || lr.Entries[0].Size != int64(len("a.txt")) || lr.Entries[2].Mode&os.ModeSymlink == 0 {
		t.Errorf("List .: entries %+v", lr.Entries)
	}
	lr, err = sb.List(ctx, sandbox.ListRequest{Path: ".", Recursive: true})
	if want := "a.txt b b/c.txt b/d b/d/e.txt b/node_modules b/node_modules/x.js b/proc.txt link node_modules node_modules/pkg node_modules/pkg/i.js"; err != nil || paths(lr) != want || lr.Truncated {
		t.Errorf("List recursive:\n got %q\nwant %q (truncated %v, %v)", paths(lr), want, lr.Truncated, err)
	}
	// Skip: the directory is listed, not descended into.
	lr, err = sb.List(ctx, sandbox.ListRequest{Path: sandbox.WorkspaceRoot, Recursive: true, Skip: []string{"node_modules"}})
	if want := "a.txt b b/c.txt b/d b/d/e.txt b/node_modules b/proc.txt link node_modules"; err != nil || paths(lr) != want {
		t.Errorf("List with Skip:\n got %q\nwant %q (%v)", paths(lr), want, err)
	}
	lr, err = sb.List(ctx, sandbox.ListRequest{Path: ".", Recursive: true, Limit: 3})
	if err != nil || len(lr.Entries) != 3 || !lr.Truncated || paths(lr) != "a.txt b b/c.txt" {
		t.Errorf("List with Limit 3: %q truncated %v %v", paths(lr), lr.Truncated, err)
	}
	lr, err = sb.List(ctx, sandbox.ListRequest{Path: "b"})
	if err != nil || paths(lr) != "c.txt d node_modules proc.txt" {
		t.Errorf("List b: %q %v (paths are relative to the listed directory)", paths(lr), err)
	}
	if _, err := sb.List(ctx, sandbox.ListRequest{Path: "a.txt"}); !errors.Is(err, sandbox.ErrNotDir) {
		t.Errorf("List of a file: %v", err)
	}
	if _, err := sb.List(ctx, sandbox.ListRequest{Path: "zzz"}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("List of a missing directory: %v", err)
	}
	if _, err := sb.List(ctx, sandbox.ListRequest{Path: "/etc"}); !errors.Is(err, sandbox.ErrOutside) {
		t.Errorf("List outside: %v", err)
	}
}

// untar reads a tar.gz: name (without "./", directories with a trailing /) -> content or
// link target.
func untar(t *testing.T, b []byte) map[string]string {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("the archive is not gzip: %v", err)
	}
	tr := tar.NewReader(zr)
	m := map[string]string{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return m
		}
		if err != nil {
			t.Fatalf("the archive is not tar: %v", err)
		}
		name := strings.TrimPrefix(hdr.Name, "./")
		switch hdr.Typeflag {
		case tar.TypeDir:
			if name != "" {
				m[strings.TrimSuffix(name, "/")+"/"] = ""
			}
		case tar.TypeSymlink:
			m[name] = "-> " + hdr.Linkname
		case tar.TypeReg:
			data, _ := io.ReadAll(tr)
			m[name] = string(data)
		default:
			t.Errorf("the archive holds %s of type %c", name, hdr.Typeflag)
		}
	}
}

// headers reads a tar.gz's headers by name (without "./" or a trailing /).
func headers(t *testing.T, b []byte) map[string]*tar.Header {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("the archive is not gzip: %v", err)
	}
	tr := tar.NewReader(zr)
	m := map[string]*tar.Header{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return m
		}
		if err != nil {
			t.Fatalf("the archive is not tar: %v", err)
		}
		m[strings.TrimSuffix(strings.TrimPrefix(hdr.Name, "./"), "/")] = hdr
	}
}

// mktar builds a tar.gz of entries in order; a regular file's body is its Linkname.
func mktar(entries ...*tar.Header) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, h := range entries {
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(h.Linkname))
			body := h.Linkname
			h.Linkname = ""
			tw.WriteHeader(h)
			io.WriteString(tw, body)
			continue
		}
		tw.WriteHeader(h)
	}
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

func testArchive(t *testing.T, p sandbox.Provider) {
	src := create(t, p, sandbox.CreateOptions{})
	ctx := ctxFor(t)
	noise := make([]byte, 3<<20) // 3 MiB that do not compress
	rand.NewChaCha8([32]byte{'a', 'r', 'c', 'h', 'i', 'v', 'e'}).Read(noise)
	files := map[string]string{"README.md": "# hi\n", "src/main.go": "package main\n", "src/deep/a/b.txt": "deep\n", "empty": "", "data.bin": string(noise)}
	for name, body := range files {
		write(t, src, name, body)
	}
	write(t, src, "node_modules/pkg/index.js", "left out\n")
	write(t, src, "src/.git/HEAD", "left out too, at any depth\n")
	// What Extract would refuse is left out, so that every archive restores: links out of
	// the workspace and FIFOs.
	if res := sh(t, src, "ln -s /tmp out && ln -s ../../.. up && mkfifo fifo"); res.ExitCode != 0 {
		t.Fatalf("making a link out and a FIFO: %+v %q", res, res.Stderr)
	}

	var buf bytes.Buffer
	if err := src.Archive(ctx, &buf, nil); err != nil {
		t.Fatal(err)
	}
	got := untar(t, buf.Bytes())
	for name, body := range files {
		if got[name] != body {
			t.Errorf("the archive's %s: %q, want %q", name, got[name], body)
		}
	}
	for name := range got {
		if strings.Contains(name, "node_modules") || strings.Contains(name, ".git") {
			t.Errorf("the archive holds %s, which the default excludes leave out", name)
		}
	}
	for _, name := range []string{"out", "up", "fifo"} {
		if _, ok := got[name]; ok {
			t.Errorf("the archive holds %s, which Extract would refuse", name)
		}
	}
	// Explicit excludes replace the defaults.
	var only bytes.Buffer
	if err := src.Archive(ctx, &only, []string{"src"}); err != nil {
		t.Fatal(err)
	}
	if g := untar(t, only.Bytes()); g["node_modules/pkg/index.js"] != "left out\n" || g["src/main.go"] != "" {
		t.Errorf("excludes [src]: %v", slices.Sorted(maps.Keys(g)))
	}
	// No excludes at all: everything.
	var all bytes.Buffer
	if err := src.Archive(ctx, &all, []string{}); err != nil {
		t.Fatal(err)
	}
	if g := untar(t, all.Bytes()); g["node_modules/pkg/index.js"] != "left out\n" || g["src/.git/HEAD"] == "" || g["src/main.go"] != "package main\n" {
		t.Errorf("excludes []: %v", slices.Sorted(maps.Keys(g)))
	}

	// Into a fresh sandbox: the same files.
	dst := create(t, p, sandbox.CreateOptions{})
	if err := dst.Extract(ctx, bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if got := read(t, dst, name); got != body {
			t.Errorf("extracted %s: %q, want %q", name, got, body)
		}
	}
	// Only into an empty workspace.
	if err := dst.Extract(ctx, bytes.NewReader(buf.Bytes())); err == nil {
		t.Error("Extract into a workspace that holds files: no error")
	}
	// Extract keeps what the archive says of permission bits and times, empty directories
	// too, and Archive stores them again.
	when := time.Date(2024, 2, 29, 12, 34, 56, 0, time.UTC)
	kept := create(t, p, sandbox.CreateOptions{})
	modes := map[string]os.FileMode{"empty": os.ModeDir | 0o750, "run.sh": 0o755, "private.txt": 0o600}
	if err := kept.Extract(ctx, bytes.NewReader(mktar(
		&tar.Header{Name: "empty/", Typeflag: tar.TypeDir, Mode: 0o750, ModTime: when},
		&tar.Header{Name: "run.sh", Typeflag: tar.TypeReg, Mode: 0o755, ModTime: when, Linkname: "#!/bin/sh\necho run\n"},
		&tar.Header{Name: "private.txt", Typeflag: tar.TypeReg, Mode: 0o600, ModTime: when, Linkname: "mine\n"},
	))); err != nil {
		t.Fatalf("Extract of modes and times: %v", err)
	}
	for name, mode := range modes {
		if fi, err := kept.Stat(ctx, name); err != nil || fi.Mode != mode || !fi.ModTime.Equal(when) {
			t.Errorf("extracted %s: %+v %v, want mode %v and time %s", name, fi, err, mode, when)
		}
	}
	var again bytes.Buffer
	if err := kept.Archive(ctx, &again, nil); err != nil {
		t.Fatal(err)
	}
	hdrs := headers(t, again.Bytes())
	for name, mode := range modes {
		if h := hdrs[name]; h == nil || os.FileMode(h.Mode).Perm() != mode.Perm() || h.ModTime.Unix() != when.Unix() {
			t.Errorf("archived again, %s: %+v, want mode %v and time %s", name, h, mode.Perm(), when)
		}
	}
	// A link inside the workspace is kept as a link, and stored again as one.
	linked := create(t, p, sandbox.CreateOptions{})
	arc := mktar(
		&tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755},
		&tar.Header{Name: "target.txt", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "pointed at\n"},
		&tar.Header{Name: "link", Typeflag: tar.TypeSymlink, Linkname: "target.txt"},
	)
	if err := linked.Extract(ctx, bytes.NewReader(arc)); err != nil {
		t.Fatalf("Extract with an in-tree link: %v", err)
	}
	if fi, err := linked.Stat(ctx, "link"); err != nil || fi.Mode&os.ModeSymlink == 0 {
		t.Errorf("Stat of the link: %+v %v; want a link, not followed", fi, err)
	}
	if got := read(t, linked, "link"); got != "pointed at\n" {
		t.Errorf("read through the in-tree link: %q", got)
	}
	again.Reset()
	if err := linked.Archive(ctx, &again, nil); err != nil {
		t.Fatal(err)
	}
	if g := untar(t, again.Bytes()); g["link"] != "-> target.txt" {
		t.Errorf("the link archived as %q, want a link to target.txt", g["link"])
	}
}

func testHostileArchive(t *testing.T, p sandbox.Provider) {
	ctx := ctxFor(t)
	for _, c := range []struct {
		what string
		hdrs []*tar.Header
	}{
		{"a name with ..", []*tar.Header{{Name: "../escaped.txt", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "x"}}},
		{"an absolute name", []*tar.Header{{Name: "/tmp/escaped.txt", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "x"}}},
		{"a link out", []*tar.Header{{Name: "out", Typeflag: tar.TypeSymlink, Linkname: "/etc"}}},
		{"a link up", []*tar.Header{{Name: "up", Typeflag: tar.TypeSymlink, Linkname: "../../.."}}},
		{"a file through a link out", []*tar.Header{
			{Name: "lnk", Typeflag: tar.TypeSymlink, Linkname: "/tmp"},
			{Name: "lnk/escaped.txt", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "x"}}},
		{"a file through a chain of links", []*tar.Header{
			{Name: "s", Typeflag: tar.TypeSymlink, Linkname: "."},
			{Name: "s/s/l", Typeflag: tar.TypeSymlink, Linkname: "../.."},
			{Name: "s/s/l/escaped.txt", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "x"}}},
		{"a hard link up", []*tar.Header{{Name: "hl", Typeflag: tar.TypeLink, Linkname: "../../etc/passwd"}}},
		{"a device", []*tar.Header{{Name: "dev", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3}}},
		{"a fifo", []*tar.Header{{Name: "fifo", Typeflag: tar.TypeFifo, Mode: 0o666}}},
	} {
		t.Run(c.what, func(t *testing.T) {
			sb := create(t, p, sandbox.CreateOptions{})
			arc := mktar(append([]*tar.Header{{Name: "fine.txt", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "fine"}}, c.hdrs...)...)
			if err := sb.Extract(ctx, bytes.NewReader(arc)); err == nil {
				t.Errorf("Extract of an archive with %s: no error", c.what)
			}
			if last := c.hdrs[len(c.hdrs)-1]; statErr(sb, last.Name) == nil {
				t.Errorf("the refused entry %s is in the workspace", last.Name)
			}
			if res := sh(t, sb, "cat /tmp/escaped.txt || cat ../escaped.txt"); res.ExitCode == 0 {
				t.Errorf("the archive wrote outside the workspace: %q", res.Stdout)
			}
		})
	}
}

func testPreview(t *testing.T, p sandbox.Provider) {
	sb := create(t, p, sandbox.CreateOptions{})
	ctx := ctxFor(t)
	const port = 8123
	if _, err := sb.PreviewURL(ctx, port); !errors.Is(err, sandbox.ErrPortClosed) {
		t.Errorf("preview of a port nothing listens on: %v, want ErrPortClosed", err)
	}
	for _, bad := range []int{0, -1, 65536} {
		if _, err := sb.PreviewURL(ctx, bad); err == nil {
			t.Errorf("preview of port %d: no error", bad)
		}
	}
	page := "<h1>served from the sandbox</h1>\n"
	write(t, sb, "web/index.html", page)
	if _, err := sb.Start(ctx, sandbox.ExecRequest{Argv: []string{"python3", "-m", "http.server", fmt.Sprint(port)}, Cwd: "web"}); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	var body string
	ok := testenv.Eventually(func() bool {
		u, err := sb.PreviewURL(ctx, port)
		if err != nil {
			return false
		}
		resp, err := client.Get(u.String() + "/index.html")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return resp.StatusCode == http.StatusOK
	})
	if !ok || body != page {
		t.Fatalf("the preview never served the page (last body %q)", body)
	}
	// When the sandbox lists its ports, the server's is among them.
	switch ports, err := sandbox.Ports(ctx, sb); {
	case errors.Is(err, sandbox.ErrUnsupported):
	case err != nil:
		t.Errorf("Ports: %v", err)
	case !slices.ContainsFunc(ports, func(lp sandbox.ListeningPort) bool { return lp.Port == port && lp.PID > 0 }):
		t.Errorf("Ports %+v lack %d", ports, port)
	}
	// Close ends the preview with the sandbox.
	u, err := sb.PreviewURL(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if resp, err := client.Get(u.String() + "/index.html"); err == nil {
		resp.Body.Close()
		t.Errorf("the preview still answers after Close: %s", resp.Status)
	}
}

func testLifetime(t *testing.T, p sandbox.Provider) {
	before := time.Now()
	sb := create(t, p, sandbox.CreateOptions{Timeout: time.Hour})
	after := time.Now()
	ctx := ctxFor(t)
	// Clocks of a remote provider may differ a little from ours.
	const slack = 30 * time.Second
	if s := sb.StartedAt(); s.Before(before.Add(-slack)) || s.After(after.Add(slack)) {
		t.Errorf("StartedAt %s, want between %s and %s", s, before, after)
	}
	if e := sb.EndsAt(); e.Sub(sb.StartedAt()) < time.Hour-slack || e.Sub(sb.StartedAt()) > time.Hour+slack {
		t.Errorf("EndsAt is %s after StartedAt, want the 1h asked for", e.Sub(sb.StartedAt()))
	}
	before = time.Now()
	if err := sb.SetTimeout(ctx, 2*time.Hour); err != nil {
		t.Fatalf("SetTimeout 2h: %v", err)
	}
	if e := sb.EndsAt(); e.Before(before.Add(2*time.Hour-slack)) || e.After(time.Now().Add(2*time.Hour+slack)) {
		t.Errorf("after SetTimeout(2h) EndsAt is %s from now", time.Until(e))
	}
	end := sb.EndsAt()
	err := sb.SetTimeout(ctx, century)
	// codecheck:errtext the refusal is a message the caller reads: it must name the bound
	if err == nil || !strings.Contains(err.Error(), "maximum lifetime") || errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("SetTimeout of a century: %v, want a refusal that names the maximum lifetime", err)
	}
	if !sb.EndsAt().Equal(end) {
		t.Errorf("a refused SetTimeout moved EndsAt from %s to %s", end, sb.EndsAt())
	}
	if res := sh(t, sb, "echo alive"); string(res.Stdout) != "alive\n" {
		t.Errorf("after a refused extension the sandbox should work: %q", res.Stdout)
	}
}

// century is a lifetime past any provider's maximum.
const century = 100 * 365 * 24 * time.Hour

func testExpiry(t *testing.T, p sandbox.Provider) {
	sb := create(t, p, sandbox.CreateOptions{Timeout: 2 * time.Second})
	write(t, sb, "f", "x")
	if !testenv.Eventually(func() bool { return errors.Is(statErr(sb, "f"), sandbox.ErrClosed) }) {
		t.Fatalf("the sandbox is still up %s after its end time", time.Since(sb.EndsAt()))
	}
	if _, err := sb.Exec(ctxFor(t), sandbox.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Exec after the end time: %v, want ErrClosed", err)
	}
}

// testShortened: SetTimeout brings the end closer too, and the sandbox ends then; a
// command still running at that moment fails with ErrClosed, and not ErrNotRun.
func testShortened(t *testing.T, p sandbox.Provider) {
	sb := create(t, p, sandbox.CreateOptions{Timeout: time.Hour})
	ctx := ctxFor(t)
	inflight := make(chan error, 1)
	go func() { // owned here: the sandbox's end ends it, and the test waits for it
		_, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo > running.txt; sleep 60"}})
		inflight <- err
	}()
	testenv.WaitFor(t, "the command to run", func() bool { return statErr(sb, "running.txt") == nil })
	if err := sb.SetTimeout(ctx, time.Second); err != nil {
		t.Fatalf("SetTimeout 1s: %v", err)
	}
	if !testenv.Eventually(func() bool { return errors.Is(statErr(sb, "running.txt"), sandbox.ErrClosed) }) {
		t.Fatalf("the sandbox is still up %s after its shortened end time", time.Since(sb.EndsAt()))
	}
	select {
	case err := <-inflight:
		if !errors.Is(err, sandbox.ErrClosed) {
			t.Errorf("a command running at the end time: %v, want ErrClosed", err)
		}
		if errors.Is(err, sandbox.ErrNotRun) { // a session would run it again
			t.Errorf("a command cut short by the end time says it did not run: %v", err)
		}
	case <-time.After(bound):
		t.Fatalf("a command running at the end time has not returned %s later", bound)
	}
}

// testExtended: an extended sandbox outlives the end it had before.
func testExtended(t *testing.T, p sandbox.Provider) {
	sb := create(t, p, sandbox.CreateOptions{Timeout: time.Hour})
	ctx := ctxFor(t)
	if err := sb.SetTimeout(ctx, 5*time.Second); err != nil {
		t.Fatalf("SetTimeout 5s: %v", err)
	}
	if err := sb.SetTimeout(ctx, time.Hour); err != nil {
		t.Fatalf("SetTimeout 1h after 5s: %v", err)
	}
	// Six seconds of the sandbox's own time: past the end it had.
	witness(t, sb, 6)
	if res := sh(t, sb, "echo alive"); string(res.Stdout) != "alive\n" {
		t.Errorf("past the end it had before its extension: %q", res.Stdout)
	}
}

func testClosed(t *testing.T, p sandbox.Provider) {
	ctx := ctxFor(t)
	sb, err := p.Create(ctx, sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Start(ctx, sandbox.ExecRequest{Argv: []string{"sleep", "60"}}); err != nil {
		t.Fatal(err)
	}
	if err := sb.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := sb.Close(ctx); err != nil {
		t.Errorf("a second Close: %v", err)
	}
	_, errExec := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}})
	_, errStart := sb.Start(ctx, sandbox.ExecRequest{Argv: []string{"true"}})
	_, errRead := sb.ReadFile(ctx, "f", 0)
	_, errList := sb.List(ctx, sandbox.ListRequest{Path: "."})
	_, errPreview := sb.PreviewURL(ctx, 8000)
	for what, err := range map[string]error{
		"Exec": errExec, "Start": errStart, "ReadFile": errRead, "WriteFile": sb.WriteFile(ctx, "f", nil),
		"Stat": statErr(sb, "f"), "List": errList, "Archive": sb.Archive(ctx, io.Discard, nil),
		"Extract": sb.Extract(ctx, bytes.NewReader(mktar())), "PreviewURL": errPreview,
		"SetTimeout": sb.SetTimeout(ctx, time.Minute),
	} {
		if !errors.Is(err, sandbox.ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", what, err)
		}
	}
}

// testCreateRefuses: what Create cannot honour it refuses, and as the caller's mistake:
// not ErrUnavailable, which would send a chain on to its next provider.
func testCreateRefuses(t *testing.T, p sandbox.Provider) {
	ctx := ctxFor(t)
	for what, opts := range map[string]sandbox.CreateOptions{
		"an unknown network mode": {Network: "bridge"},
		"a lifetime of a century": {Timeout: century},
	} {
		sb, err := p.Create(ctx, opts)
		if err == nil {
			sb.Close(ctx)
			t.Errorf("Create with %s: accepted", what)
			continue
		}
		if errors.Is(err, sandbox.ErrUnavailable) {
			t.Errorf("Create with %s: %v, the caller's mistake, not ErrUnavailable", what, err)
		}
	}
}

func testConcurrency(t *testing.T, p sandbox.Provider) {
	sb := create(t, p, sandbox.CreateOptions{})
	ctx := ctxFor(t)
	var wg sync.WaitGroup
	const n = 32
	for i := range n {
		wg.Go(func() {
			res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", `echo "$1"; echo "e$1" >&2`, "sh", fmt.Sprint(i)}})
			if err != nil || string(res.Stdout) != fmt.Sprintf("%d\n", i) || string(res.Stderr) != fmt.Sprintf("e%d\n", i) {
				t.Errorf("exec %d: %q %q %v", i, res.Stdout, res.Stderr, err)
			}
			name := fmt.Sprintf("c/%d.txt", i)
			want := strings.Repeat(fmt.Sprint(i), 1000)
			if err := sb.WriteFile(ctx, name, []byte(want)); err != nil {
				t.Errorf("write %s: %v", name, err)
				return
			}
			res, err = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"cat", name}})
			if err != nil || string(res.Stdout) != want {
				t.Errorf("cat %s: %d bytes %v", name, len(res.Stdout), err)
			}
			if b, err := sb.ReadFile(ctx, name, 0); err != nil || string(b) != want {
				t.Errorf("read %s: %v", name, err)
			}
		})
	}
	// Several sandboxes at once, created, used and closed concurrently.
	for i := range 4 {
		wg.Go(func() {
			other, err := p.Create(ctx, sandbox.CreateOptions{Env: map[string]string{"N": fmt.Sprint(i)}})
			if err != nil {
				t.Errorf("create %d: %v", i, err)
				return
			}
			defer func() {
				if err := other.Close(ctx); err != nil {
					t.Errorf("close %d: %v", i, err)
				}
			}()
			if res, err := other.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", `echo "$N"`}}); err != nil || string(res.Stdout) != fmt.Sprintf("%d\n", i) {
				t.Errorf("sandbox %d: %q %v", i, res.Stdout, err)
			}
		})
	}
	wg.Wait()
	if lr, err := sb.List(ctx, sandbox.ListRequest{Path: "c"}); err != nil || len(lr.Entries) != n {
		t.Errorf("List after concurrent writes: %d entries %v", len(lr.Entries), err)
	}
}

// testHostWorkspace: a host directory is the workspace itself, or refused with
// ErrUnsupported; never silently replaced by an empty one.
func testHostWorkspace(t *testing.T, p sandbox.Provider) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "host.txt"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t)
	sb, err := p.Create(ctx, sandbox.CreateOptions{Workspace: dir})
	if errors.Is(err, sandbox.ErrUnsupported) {
		return
	}
	if err != nil {
		t.Fatalf("Create with a host workspace: %v (a provider that cannot mount one refuses it with ErrUnsupported)", err)
	}
	defer sb.Close(ctx)
	if got := read(t, sb, "host.txt"); got != "from the host\n" {
		t.Errorf("the host file in the sandbox: %q", got)
	}
	write(t, sb, "back.txt", "from the sandbox\n")
	if b, err := os.ReadFile(filepath.Join(dir, "back.txt")); err != nil || string(b) != "from the sandbox\n" {
		t.Errorf("the sandbox's file on the host: %q %v", b, err)
	}
}

// wrapper is a sandbox wrapper that adds nothing: the provider must see through it.
type wrapper struct{ sandbox.Sandbox }

func (w wrapper) Unwrap() sandbox.Sandbox { return w.Sandbox }

// testHandoff: a provider that can hand a workspace over keeps every file, ends the old
// sandbox, and finds its own sandbox under a wrapper.
func testHandoff(t *testing.T, p sandbox.Provider) {
	h, ok := p.(sandbox.Handoff)
	if !ok {
		return // an optional ability
	}
	ctx := ctxFor(t)
	old := create(t, p, sandbox.CreateOptions{})
	write(t, old, "work.txt", "unsaved work\n")
	if _, err := old.Start(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "sleep 2; echo late > late.txt"}}); err != nil {
		t.Fatal(err)
	}
	next, err := h.Handoff(ctx, wrapper{old}, sandbox.CreateOptions{})
	if err != nil {
		t.Fatalf("Handoff of a wrapped sandbox: %v", err)
	}
	t.Cleanup(func() { next.Close(context.Background()) })
	if next.ID() == old.ID() {
		t.Error("Handoff returned the same sandbox")
	}
	if got := read(t, next, "work.txt"); got != "unsaved work\n" {
		t.Errorf("the work after the handoff: %q", got)
	}
	if _, err := old.Stat(ctx, "work.txt"); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("the old sandbox after the handoff: %v, want ErrClosed", err)
	}
	// A witness in the new sandbox, started after the handoff, outlasts the old process's
	// sleep: once it has written, the old process, had it survived, would have written too.
	witness(t, next, 3)
	if _, err := next.Stat(ctx, "late.txt"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("a process of the old sandbox survived the handoff (late.txt: %v)", err)
	}
}

// testReconnect: a sandbox reached again by its ID, as a process that did not create it
// reaches it (the creator's handle is left as a dead process leaves it), is the same
// sandbox: its files, its background processes still running, its server previewed, its
// lifetime known; a Reconnect never reaches a sandbox without the labels asked for, nor
// one that is gone. With Lister and Killer: the sandbox is listed by its labels and
// killed by its ID.
func testReconnect(t *testing.T, p sandbox.Provider) {
	r, ok := sandbox.ProviderAs[sandbox.Reconnector](p)
	if !ok {
		return // an optional ability
	}
	ctx := ctxFor(t)
	label := fmt.Sprintf("reconnect-%d", rand.Int64())
	labels := map[string]string{"sandboxtest": label, "sandboxtest_odd": "a b&c=d/é"}
	first := create(t, p, sandbox.CreateOptions{Labels: labels})
	write(t, first, "work/unsaved.txt", "written before the reconnect\n")
	page := "<h1>still served</h1>\n"
	write(t, first, "web/index.html", page)
	const port = 8124
	server, err := first.Start(ctx, sandbox.ExecRequest{Argv: []string{"python3", "-m", "http.server", fmt.Sprint(port)}, Cwd: "web"})
	if err != nil {
		t.Fatal(err)
	}
	serves := func(sb sandbox.Sandbox) (string, bool) {
		client := &http.Client{Timeout: 10 * time.Second}
		var body string
		ok := testenv.Eventually(func() bool {
			u, err := sb.PreviewURL(ctx, port)
			if err != nil {
				return false
			}
			resp, err := client.Get(u.String() + "/index.html")
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			body = string(b)
			return resp.StatusCode == http.StatusOK
		})
		return body, ok
	}
	if body, ok := serves(first); !ok || body != page {
		t.Fatalf("the server never served before the reconnect (last body %q)", body)
	}

	if _, err := r.Reconnect(ctx, first.ID(), sandbox.ReconnectOptions{Timeout: 10 * time.Minute,
		Labels: map[string]string{"sandboxtest": "another-project"}}); !errors.Is(err, sandbox.ErrForeign) {
		t.Errorf("Reconnect with labels the sandbox lacks: %v, want ErrForeign", err)
	}
	again, err := r.Reconnect(ctx, first.ID(), sandbox.ReconnectOptions{Timeout: 10 * time.Minute, Labels: labels})
	if err != nil {
		t.Fatalf("Reconnect: %v", err)
	}
	if again.ID() != first.ID() {
		t.Errorf("Reconnect(%s) gave sandbox %s", first.ID(), again.ID())
	}
	if got := read(t, again, "work/unsaved.txt"); got != "written before the reconnect\n" {
		t.Errorf("a file written before the reconnect: %q", got)
	}
	if res := sh(t, again, "cat work/unsaved.txt"); string(res.Stdout) != "written before the reconnect\n" {
		t.Errorf("the file through a command: %+v", res)
	}
	if pl, ok := sandbox.As[sandbox.ProcessLister](again); ok {
		procs, err := pl.Processes(ctx)
		if err != nil {
			t.Errorf("Processes: %v", err)
		}
		if !slices.ContainsFunc(procs, func(pi sandbox.ProcessInfo) bool { return pi.ID == server.ID && pi.PID == server.PID }) {
			t.Errorf("Processes after the reconnect: %+v, want %s (pid %d)", procs, server.ID, server.PID)
		}
	}
	if body, ok := serves(again); !ok || body != page {
		t.Errorf("the server started before the reconnect does not answer after it (last body %q)", body)
	}
	if d := again.StartedAt().Sub(first.StartedAt()); d > time.Second || d < -time.Second {
		t.Errorf("StartedAt after the reconnect: %s, the creator saw %s", again.StartedAt(), first.StartedAt())
	}
	if left := time.Until(again.EndsAt()); left < 9*time.Minute {
		t.Errorf("the reconnected sandbox ends in %s, want at least the 10 min asked for (less the test's time)", left)
	}

	if l, ok := sandbox.ProviderAs[sandbox.Lister](p); ok {
		infos, err := l.List(ctx, labels)
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		if len(infos) != 1 || infos[0].ID != first.ID() || infos[0].Labels["sandboxtest_odd"] != labels["sandboxtest_odd"] ||
			infos[0].StartedAt.IsZero() || !infos[0].EndsAt.After(time.Now()) {
			t.Errorf("List(%v): %+v, want only %s with its labels and times", labels, infos, first.ID())
		}
		if infos, err := l.List(ctx, map[string]string{"sandboxtest": label, "sandboxtest_odd": "a b"}); err != nil || len(infos) != 0 {
			t.Errorf("List with a value the sandbox does not have: %+v %v, want none", infos, err)
		}
	}
	if k, ok := sandbox.ProviderAs[sandbox.Killer](p); ok {
		if err := k.Kill(ctx, first.ID()); err != nil {
			t.Fatalf("Kill: %v", err)
		}
		if err := k.Kill(ctx, first.ID()); err != nil {
			t.Errorf("Kill of a sandbox killed already: %v, want none", err)
		}
		if _, err := r.Reconnect(ctx, first.ID(), sandbox.ReconnectOptions{Labels: labels}); !errors.Is(err, sandbox.ErrGone) {
			t.Errorf("Reconnect after Kill: %v, want ErrGone", err)
		}
	}
	if _, err := r.Reconnect(ctx, "no-such-sandbox", sandbox.ReconnectOptions{}); !errors.Is(err, sandbox.ErrGone) && !errors.Is(err, sandbox.ErrForeign) {
		t.Errorf("Reconnect to an ID no sandbox has: %v, want ErrGone or ErrForeign", err)
	}
}
