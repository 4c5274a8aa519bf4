// Package sandboxtest is the conformance suite every sandbox provider runs: the behaviour
// of sandbox.Provider and sandbox.Sandbox that the host, sessions and snapshots rely on.
// Exec (status, streams, argv as data, working directory, environment), timeouts and
// cancellation killing the whole process group, output capped at the source with head
// and tail kept, background processes that outlive their call, files and their errors,
// listing, archive and extract (hostile archives refused), previews, lifetime (end time,
// extension, expiry, Close), concurrency, host workspaces (mounted or refused), and the
// optional abilities (port listing, handoff) when the provider has them.
//
// Commands are POSIX sh scripts that use simple commands, quotes, $VAR, ;, &&, & and the
// redirections >, >> and >&2, with echo, cat, pwd, sleep and python3 -m http.server:
// what any Linux sandbox has, and what the in-memory sandbox implements.
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
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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
	t.Run("List", func(t *testing.T) { t.Parallel(); testList(t, p) })
	t.Run("ArchiveExtract", func(t *testing.T) { t.Parallel(); testArchive(t, p) })
	t.Run("ExtractRefusesHostile", func(t *testing.T) { t.Parallel(); testHostileArchive(t, p) })
	t.Run("Preview", func(t *testing.T) { t.Parallel(); testPreview(t, p) })
	t.Run("Lifetime", func(t *testing.T) { t.Parallel(); testLifetime(t, p) })
	t.Run("Expiry", func(t *testing.T) { t.Parallel(); testExpiry(t, p) })
	t.Run("Closed", func(t *testing.T) { t.Parallel(); testClosed(t, p) })
	t.Run("Concurrency", func(t *testing.T) { t.Parallel(); testConcurrency(t, p) })
	t.Run("HostWorkspace", func(t *testing.T) { t.Parallel(); testHostWorkspace(t, p) })
	t.Run("Handoff", func(t *testing.T) { t.Parallel(); testHandoff(t, p) })
	t.Run("ProcessLister", func(t *testing.T) { t.Parallel(); testProcessLister(t, p) })
	t.Run("ArchiveReporter", func(t *testing.T) { t.Parallel(); testArchiveReporter(t, p) })
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
}

func testContext(t *testing.T, p sandbox.Provider) {
	sb := create(t, p, sandbox.CreateOptions{})
	// A deadline of ctx ends the command like a timeout.
	dctx, dcancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer dcancel()
	res, _ := sb.Exec(dctx, sandbox.ExecRequest{Argv: []string{"sleep", "60"}})
	if !res.TimedOut || res.ExitCode != -1 {
		t.Errorf("ctx deadline: %+v, want TimedOut", res)
	}
	// Cancelling ctx ends it too, and the error says so.
	cctx, ccancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, ccancel)
	res, err := sb.Exec(cctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "sleep 60 & sleep 60"}})
	if !res.TimedOut || !errors.Is(err, context.Canceled) {
		t.Errorf("ctx cancelled: %+v %v, want TimedOut and context.Canceled", res, err)
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
}

func testBackground(t *testing.T, p sandbox.Provider) {
	sb := create(t, p, sandbox.CreateOptions{})
	cctx, cancel := context.WithCancel(context.Background())
	pr, err := sb.Start(cctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo started; sleep 1; echo alive > alive.txt; sleep 60"}})
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
	// Its output goes to its log.
	if !testenv.Eventually(func() bool { return strings.Contains(string(sh(t, sb, "cat "+pr.LogPath).Stdout), "started") }) {
		t.Errorf("the log %s never showed the process's output", pr.LogPath)
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
	lr, err := sb.List(ctx, sandbox.ListRequest{Path: "."})
	if err != nil || paths(lr) != "a.txt b node_modules" || lr.Truncated {
		t.Errorf("List .: %q %v", paths(lr), err)
	} else if !lr.Entries[1].IsDir() || lr.Entries[0].IsDir() || lr.Entries[0].Size != int64(len("a.txt")) {
		t.Errorf("List .: entries %+v", lr.Entries)
	}
	lr, err = sb.List(ctx, sandbox.ListRequest{Path: ".", Recursive: true})
	if want := "a.txt b b/c.txt b/d b/d/e.txt b/node_modules b/node_modules/x.js node_modules node_modules/pkg node_modules/pkg/i.js"; err != nil || paths(lr) != want {
		t.Errorf("List recursive:\n got %q\nwant %q (%v)", paths(lr), want, err)
	}
	// Skip: the directory is listed, not descended into.
	lr, err = sb.List(ctx, sandbox.ListRequest{Path: sandbox.WorkspaceRoot, Recursive: true, Skip: []string{"node_modules"}})
	if want := "a.txt b b/c.txt b/d b/d/e.txt b/node_modules node_modules"; err != nil || paths(lr) != want {
		t.Errorf("List with Skip:\n got %q\nwant %q (%v)", paths(lr), want, err)
	}
	lr, err = sb.List(ctx, sandbox.ListRequest{Path: ".", Recursive: true, Limit: 3})
	if err != nil || len(lr.Entries) != 3 || !lr.Truncated || paths(lr) != "a.txt b b/c.txt" {
		t.Errorf("List with Limit 3: %q truncated %v %v", paths(lr), lr.Truncated, err)
	}
	lr, err = sb.List(ctx, sandbox.ListRequest{Path: "b"})
	if err != nil || paths(lr) != "c.txt d node_modules" {
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

// mktar builds a tar.gz of entries in order.
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
	files := map[string]string{"README.md": "# hi\n", "src/main.go": "package main\n", "src/deep/a/b.txt": "deep\n", "empty": ""}
	for name, body := range files {
		write(t, src, name, body)
	}
	write(t, src, "node_modules/pkg/index.js", "left out\n")
	write(t, src, "src/.git/HEAD", "left out too, at any depth\n")

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
	// Explicit excludes replace the defaults.
	var only bytes.Buffer
	if err := src.Archive(ctx, &only, []string{"src"}); err != nil {
		t.Fatal(err)
	}
	if g := untar(t, only.Bytes()); g["node_modules/pkg/index.js"] != "left out\n" || g["src/main.go"] != "" {
		t.Errorf("excludes [src]: %v", slices.Sorted(maps.Keys(g)))
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
	var again bytes.Buffer
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
		hdr  *tar.Header
	}{
		{"a name with ..", &tar.Header{Name: "../escaped.txt", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "x"}},
		{"an absolute name", &tar.Header{Name: "/tmp/escaped.txt", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "x"}},
		{"a link out", &tar.Header{Name: "out", Typeflag: tar.TypeSymlink, Linkname: "/etc"}},
		{"a link up", &tar.Header{Name: "up", Typeflag: tar.TypeSymlink, Linkname: "../../.."}},
		{"a device", &tar.Header{Name: "dev", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3}},
		{"a fifo", &tar.Header{Name: "fifo", Typeflag: tar.TypeFifo, Mode: 0o666}},
	} {
		t.Run(c.what, func(t *testing.T) {
			sb := create(t, p, sandbox.CreateOptions{})
			arc := mktar(&tar.Header{Name: "fine.txt", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "fine"}, c.hdr)
			if err := sb.Extract(ctx, bytes.NewReader(arc)); err == nil {
				t.Errorf("Extract of an archive with %s: no error", c.what)
			}
			name := path.Base(c.hdr.Name)
			if fi, err := sb.Stat(ctx, name); err == nil && name != "fine.txt" {
				t.Errorf("the refused entry is in the workspace: %+v", fi)
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
	if err := sb.SetTimeout(ctx, 100*365*24*time.Hour); err == nil {
		t.Error("SetTimeout of a century: accepted past any maximum lifetime")
	}
	if res := sh(t, sb, "echo alive"); string(res.Stdout) != "alive\n" {
		t.Errorf("after a refused extension the sandbox should work: %q", res.Stdout)
	}
}

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
	} {
		if !errors.Is(err, sandbox.ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", what, err)
		}
	}
}

func testConcurrency(t *testing.T, p sandbox.Provider) {
	sb := create(t, p, sandbox.CreateOptions{})
	ctx := ctxFor(t)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			name := fmt.Sprintf("c/%d.txt", i)
			want := strings.Repeat(fmt.Sprint(i), 1000)
			if err := sb.WriteFile(ctx, name, []byte(want)); err != nil {
				t.Errorf("write %s: %v", name, err)
				return
			}
			res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"cat", name}})
			if err != nil || string(res.Stdout) != want {
				t.Errorf("cat %s: %d bytes %v", name, len(res.Stdout), err)
			}
			if b, err := sb.ReadFile(ctx, name, 0); err != nil || string(b) != want {
				t.Errorf("read %s: %v", name, err)
			}
		})
	}
	wg.Wait()
	if lr, err := sb.List(ctx, sandbox.ListRequest{Path: "c"}); err != nil || len(lr.Entries) != 8 {
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
