//go:build linux

package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/toolhost/toolhost/internal/daemon"
	"github.com/toolhost/toolhost/internal/sessionapi"
	"github.com/toolhost/toolhost/internal/testenv"
)

// Plain calls served by the session daemon (serve.daemon_calls): runBinIn turns them off
// for every other test; these turn them on, each in its own runtime directory.

// daemonCalls is the environment of a call that may run in, and start, e's daemon;
// inProcess that of one that may not.
func (e *sessionEnv) daemonCalls() []string {
	return append(append([]string{}, e.env...), "TOOLHOST_SERVE_DAEMON_CALLS=true")
}

func (e *sessionEnv) inProcess() []string {
	return append(append([]string{}, e.env...), "TOOLHOST_SERVE_DAEMON_CALLS=false")
}

// info asks e's daemon what it is; ok is false when none answers.
func (e *sessionEnv) info() (sessionapi.Info, bool) {
	cl := e.client()
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := cl.Info(ctx)
	return info, err == nil
}

// awaitTakesCalls waits (a hang bound, not a timing) for e's daemon to take one-shot
// calls.
func (e *sessionEnv) awaitTakesCalls() sessionapi.Info {
	e.t.Helper()
	var info sessionapi.Info
	if !testenv.Eventually(func() bool {
		var ok bool
		info, ok = e.info()
		return ok && info.TakesCalls
	}) {
		e.t.Fatalf("no session daemon takes calls after %s (last answer %+v)", testenv.HangBound, info)
	}
	return info
}

// TestCallDaemon: a plain call that finds no daemon runs in its own process and starts
// one; the next calls run in it (its count of one-shot calls says so), print what a
// call's own process prints, and share the project's private workspace with calls run
// in their own processes, both ways.
func TestCallDaemon(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	e := newSessionEnv(t)
	on, off := e.daemonCalls(), e.inProcess()
	r := runCLI(t, on, "call", "write_file", `{"path":"a.txt","content":"from a process\n"}`)
	if r.code != 0 {
		t.Fatalf("the first call: %s", r)
	}
	info := e.awaitTakesCalls() // the call started it
	if info.OneShots != 0 {
		t.Fatalf("the daemon ran %d calls before any was sent to it", info.OneShots)
	}

	// Written in a process of its own, read in the daemon.
	r = runCLI(t, on, "call", "read_file", `{"path":"a.txt"}`)
	if r.code != 0 || !strings.Contains(r.stdout, "from a process") {
		t.Fatalf("read_file in the daemon: %s", r)
	}
	if info, _ := e.info(); info.OneShots != 1 {
		t.Fatalf("the daemon ran %d one-shot calls, want 1 (the read_file)", info.OneShots)
	}
	// Written in the daemon (no read first: the guard is off, as in a call's process),
	// read in a process of its own, which leaves the daemon alone.
	r = runCLI(t, on, "call", "write_file", `{"path":"b.txt","content":"from the daemon\n"}`)
	if r.code != 0 {
		t.Fatalf("write_file in the daemon: %s", r)
	}
	r = runCLI(t, off, "call", "read_file", `{"path":"b.txt"}`)
	if r.code != 0 || !strings.Contains(r.stdout, "from the daemon") {
		t.Fatalf("read_file in its own process: %s", r)
	}
	if info, _ := e.info(); info.OneShots != 2 {
		t.Fatalf("the daemon ran %d one-shot calls, want 2 (serve.daemon_calls=false must not use it)", info.OneShots)
	}

	// The same call prints the same bytes either way, on a host directory too.
	ws := t.TempDir()
	for _, args := range [][]string{
		{"call", "bash", `{"command":"printf '<&>'; ls; echo $HOME"}`},
		{"call", "write_file", `{"path":"c.txt","content":"x"}`, "--workspace", ws},
		{"call", "read_file", `{"path":"c.txt"}`, "--workspace", ws},
	} {
		before, _ := e.info()
		served := runCLI(t, on, args...)
		own := runCLI(t, off, args...)
		after, _ := e.info()
		if served.code != 0 || served.stdout != own.stdout || served.code != own.code {
			t.Errorf("%v: the daemon's answer and the process's differ:\n%s\n%s", args, served, own)
		}
		if after.OneShots != before.OneShots+1 {
			t.Errorf("%v: the daemon ran %d one-shot calls, want 1", args, after.OneShots-before.OneShots)
		}
	}
	if b, err := os.ReadFile(filepath.Join(ws, "c.txt")); err != nil || string(b) != "x" {
		t.Errorf("c.txt in the workspace: %q, %v", b, err)
	}

	// An unknown tool: exit 2 and the same line, through the daemon as in a process.
	before, _ := e.info()
	served := runCLI(t, on, "call", "no_such_tool", `{}`)
	own := runCLI(t, off, "call", "no_such_tool", `{}`)
	after, _ := e.info()
	oneLineError(t, served, 2, `unknown tool "no_such_tool"`)
	if served.stderr != own.stderr || own.code != 2 {
		t.Errorf("an unknown tool through the daemon and in a process differ:\n%s\n%s", served, own)
	}
	if after.OneShots != before.OneShots+1 {
		t.Errorf("the unknown tool did not reach the daemon (%d calls)", after.OneShots-before.OneShots)
	}
	// A workspace the daemon refuses itself, whatever the client checked: its own data
	// dir's parent is not a workspace (CheckWorkspace).
	cl := e.client()
	defer cl.Close()
	_, err := cl.OneShot(context.Background(), sessionapi.OneShotRequest{Project: "default", Workspace: filepath.Dir(testDataDir), Tool: "bash", Input: []byte(`{"command":"true"}`)})
	if sessionapi.Status(err) != 400 {
		t.Errorf("a one-shot call on the data dir's parent: %v (status %d), want 400", err, sessionapi.Status(err))
	}
	_, err = cl.OneShot(context.Background(), sessionapi.OneShotRequest{Project: "default", Workspace: "relative/dir", Tool: "bash", Input: []byte(`{"command":"true"}`)})
	if sessionapi.Status(err) != 400 {
		t.Errorf("a one-shot call on a relative workspace: %v (status %d), want 400", err, sessionapi.Status(err))
	}
}

// TestCallDaemonOtherConfig: a daemon that runs another configuration is not used (the
// call runs, in its own process), and an opted-out call that finds no daemon starts none.
func TestCallDaemonOtherConfig(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	e := newSessionEnv(t)
	r := runCLI(t, e.inProcess(), "call", "bash", `{"command":"true"}`)
	if r.code != 0 {
		t.Fatalf("%s", r)
	}
	// daemon.Start creates the log before it starts the process: no log, no daemon.
	if _, err := os.Stat(daemon.LogPath(e.dir)); !os.IsNotExist(err) {
		t.Fatalf("serve.daemon_calls=false started a session daemon (its log: %v)", err)
	}
	if _, ok := e.info(); ok {
		t.Fatal("serve.daemon_calls=false started a session daemon")
	}

	r = runCLI(t, e.daemonCalls(), "call", "bash", `{"command":"true"}`)
	if r.code != 0 {
		t.Fatalf("%s", r)
	}
	e.awaitTakesCalls()
	other := append(e.daemonCalls(), "TOOLHOST_LIMITS_MEMORY_MIB=1000") // another digest
	r = runCLI(t, other, "call", "bash", `{"command":"echo other"}`)
	if r.code != 0 || !strings.Contains(r.stdout, "other") {
		t.Fatalf("a call with another configuration: %s", r)
	}
	if info, _ := e.info(); info.OneShots != 0 {
		t.Fatalf("the daemon ran a call of another configuration (%d one-shot calls)", info.OneShots)
	}
	r = runCLI(t, e.daemonCalls(), "call", "bash", `{"command":"echo same"}`)
	if r.code != 0 || !strings.Contains(r.stdout, "same") {
		t.Fatalf("a call with the daemon's configuration: %s", r)
	}
	if info, _ := e.info(); info.OneShots != 1 {
		t.Fatalf("the daemon ran %d one-shot calls, want 1", info.OneShots)
	}
}

// TestCallDaemonDiesMidCall: a daemon that dies while it runs a call fails the call with
// an error that says it may have run; the call is not run again in the caller's process.
func TestCallDaemonDiesMidCall(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	e := newSessionEnv(t)
	if r := runCLI(t, e.daemonCalls(), "call", "bash", `{"command":"true"}`); r.code != 0 {
		t.Fatalf("%s", r)
	}
	info := e.awaitTakesCalls()
	ws := t.TempDir()
	done := make(chan runResult, 1)
	go func() {
		done <- runCLI(t, e.daemonCalls(), "call", "bash", `{"command":"echo ran >> runs; sleep 600"}`, "--workspace", ws)
	}()
	if !testenv.Eventually(func() bool {
		b, _ := os.ReadFile(filepath.Join(ws, "runs"))
		return len(b) > 0
	}) {
		t.Fatalf("the call did not start in the daemon after %s", testenv.HangBound)
	}
	if err := syscall.Kill(info.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var r runResult
	select {
	case r = <-done:
	case <-time.After(testenv.HangBound):
		t.Fatalf("the call did not end after its daemon died (%s)", testenv.HangBound)
	}
	oneLineError(t, r, 1, "may have run")
	if b, _ := os.ReadFile(filepath.Join(ws, "runs")); string(b) != "ran\n" {
		t.Errorf("the command ran %q times, want once", b)
	}
}

// TestCallDaemonLeaseHeld: a project open elsewhere (a session another daemon holds, on
// the same store) fails a call the daemon runs as it fails one in its own process: exit
// 1, saying where the project is open.
func TestCallDaemonLeaseHeld(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	e := newSessionEnv(t)
	rt2, err := os.MkdirTemp("", "th-rt-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(rt2) })
	holder := sessionEnvIn(t, rt2) // another daemon on the same store
	// A call that answers starts this environment's daemon (one that fails starts none).
	if r := runCLI(t, e.daemonCalls(), "call", "bash", `{"command":"true"}`, "--workspace", t.TempDir()); r.code != 0 {
		t.Fatalf("a call before the project is open elsewhere: %s", r)
	}
	e.awaitTakesCalls()
	if r := holder.run("session", "start"); r.code != 0 {
		t.Fatalf("session start: %s", r)
	}
	served := runCLI(t, e.daemonCalls(), "call", "bash", `{"command":"true"}`)
	own := runCLI(t, e.inProcess(), "call", "bash", `{"command":"true"}`)
	const want = "project default is open on host"
	oneLineError(t, served, 1, want)
	oneLineError(t, own, 1, want)
	if info, _ := e.info(); info.OneShots != 1 {
		t.Errorf("the daemon ran %d one-shot calls, want 1", info.OneShots)
	}
}
