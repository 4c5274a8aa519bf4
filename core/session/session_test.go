package session_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/core/sandbox/local"
	"github.com/toolhost/toolhost/core/session"
	"github.com/toolhost/toolhost/core/snapshot"
	"github.com/toolhost/toolhost/core/store/dir"
	"github.com/toolhost/toolhost/host"
	"github.com/toolhost/toolhost/internal/testplugins"
)

func provider(t testing.TB) *local.Provider {
	t.Helper()
	if _, err := os.Stat(local.BwrapPath); err != nil {
		t.Skipf("bubblewrap is not installed at %s (make test installs it): %v", local.BwrapPath, err)
	}
	p, err := local.New(local.Config{RunDir: t.TempDir(), MaxLifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func snapshots(t testing.TB) *snapshot.Manager {
	t.Helper()
	st, err := dir.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m, err := snapshot.New(snapshot.Config{Store: st, Backoff: 10 * time.Millisecond, TempDir: t.TempDir(),
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func toolHost(t testing.TB) *host.Host {
	t.Helper()
	var specs []host.PluginSpec
	for _, b := range testplugins.Builtins {
		p, err := testplugins.Build(b.Pkg)
		if err != nil {
			t.Fatal(err)
		}
		spec := host.PluginSpec{Path: p}
		for _, g := range b.Grants {
			spec.Grants = append(spec.Grants, abi.Capability(g))
		}
		specs = append(specs, spec)
	}
	h, err := host.New(context.Background(), host.Config{DataDir: testplugins.DataDir(), Plugins: specs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(context.Background()) })
	return h
}

func open(t testing.TB, cfg session.Config) *session.Session {
	t.Helper()
	s, err := session.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return s
}

func text(r abi.Result) string {
	var b strings.Builder
	for _, c := range r.Content {
		b.WriteString(c.Text)
	}
	return b.String()
}

// TestRotationIsInvisible runs a loop of tool calls on sandboxes that may live only 2.5 s:
// the session must save, replace and restore them at least three times while every call
// succeeds and every file written survives.
func TestRotationIsInvisible(t *testing.T) {
	for _, restore := range []bool{false, true} {
		t.Run(map[bool]string{false: "handoff", true: "restore"}[restore], func(t *testing.T) {
			testRotation(t, restore)
		})
	}
}

func testRotation(t *testing.T, restore bool) {
	s := open(t, session.Config{
		Provider: provider(t), ProjectID: "rotation", Snapshots: snapshots(t),
		TTL: 2500 * time.Millisecond, MaxLifetime: 2500 * time.Millisecond, KeepaliveMargin: time.Second,
		RetryInterval: 100 * time.Millisecond, RestoreOnRotate: restore,
	})
	hs := toolHost(t).OpenSession(s)
	ctx := context.Background()
	want := map[string]string{}
	deadline := time.Now().Add(60 * time.Second)
	for i := 0; s.Rotations() < 3; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("only %d rotations after %d calls", s.Rotations(), i)
		}
		name := fmt.Sprintf("work/file-%03d.txt", i)
		content := fmt.Sprintf("call %d at %s\n", i, time.Now().Format(time.RFC3339Nano))
		in, _ := json.Marshal(map[string]string{"path": name, "content": content})
		res, err := hs.Dispatch(ctx, "write_file", in)
		if err != nil || res.IsError {
			t.Fatalf("call %d (rotation %d): write_file failed: %q %v", i, s.Rotations(), text(res), err)
		}
		want[name] = content
		res, err = hs.Dispatch(ctx, "bash", json.RawMessage(`{"command":"ls work | wc -l"}`))
		if err != nil || res.IsError || !strings.Contains(text(res), fmt.Sprintf("\n%d\n", len(want))) {
			t.Fatalf("call %d (rotation %d): bash sees the wrong files: %q %v", i, s.Rotations(), text(res), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for name, content := range want {
		in, _ := json.Marshal(map[string]string{"path": name})
		res, err := hs.Dispatch(ctx, "read_file", in)
		if err != nil || res.IsError || !strings.Contains(text(res), strings.TrimSuffix(content, "\n")) {
			t.Fatalf("after %d rotations %s reads %q, %v; want %q", s.Rotations(), name, text(res), err, content)
		}
	}
	t.Logf("%d files written across %d rotations", len(want), s.Rotations())
}

// flakySnapshots fails every Save while fail is set.
type flakySnapshots struct {
	*snapshot.Manager
	fail atomic.Bool
}

func (f *flakySnapshots) Save(ctx context.Context, project string, pack func(io.Writer) error) (snapshot.Info, error) {
	if f.fail.Load() {
		return snapshot.Info{}, fmt.Errorf("%w: injected", snapshot.ErrSaveFailed)
	}
	return f.Manager.Save(ctx, project, pack)
}

// TestFailedSaveKeepsTheOnlyCopy: when the snapshot cannot be saved, the sandbox that
// holds the only copy of the work is not torn down; once saving works again, rotation
// goes ahead and nothing is lost.
func TestFailedSaveKeepsTheOnlyCopy(t *testing.T) {
	snaps := &flakySnapshots{Manager: snapshots(t)}
	snaps.fail.Store(true)
	s := open(t, session.Config{
		Provider: provider(t), ProjectID: "flaky", Snapshots: snaps,
		TTL: 6 * time.Second, MaxLifetime: 6 * time.Second, KeepaliveMargin: 5 * time.Second,
		RetryInterval: 200 * time.Millisecond,
	})
	ctx := context.Background()
	first := s.SandboxID()
	if err := s.WriteFile(ctx, "/home/user/precious.txt", []byte("only copy")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // rotation is due and keeps failing
	if _, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil {
		t.Fatalf("a call while saves fail: %v", err)
	}
	if s.SandboxID() != first || s.Rotations() != 0 {
		t.Fatalf("the sandbox was replaced although its snapshot failed")
	}
	if _, err := s.Commit(ctx, "phase 1"); !errors.Is(err, snapshot.ErrSaveFailed) {
		t.Fatalf("commit while saves fail: %v, want ErrSaveFailed", err)
	}
	snaps.fail.Store(false)
	deadline := time.Now().Add(10 * time.Second)
	for s.Rotations() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no rotation after saves work again")
		}
		if _, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil {
			t.Fatalf("call: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	b, err := s.ReadFile(ctx, "/home/user/precious.txt", 0)
	if err != nil || string(b) != "only copy" || s.SandboxID() == first {
		t.Fatalf("after rotation: %q %v (sandbox %s, first %s)", b, err, s.SandboxID(), first)
	}
	if _, err := s.Commit(ctx, "phase 2"); err != nil {
		t.Fatalf("the next commit after recovery: %v", err)
	}
}

// TestWakeRestoresNewestSnapshot: a new session for a project starts from its newest
// snapshot.
func TestWakeRestoresNewestSnapshot(t *testing.T) {
	p, snaps := provider(t), snapshots(t)
	ctx := context.Background()
	cfg := session.Config{Provider: p, ProjectID: "wake", Snapshots: snaps}
	s1 := open(t, cfg)
	if err := s1.WriteFile(ctx, "/home/user/app/index.html", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	if _, err := s1.Commit(ctx, "first"); err != nil {
		t.Fatal(err)
	}
	if err := s1.WriteFile(ctx, "/home/user/app/index.html", []byte("v2")); err != nil {
		t.Fatal(err)
	}
	var committed []string
	cfg2 := cfg
	cfg.AfterCommit = func(_ context.Context, label string, info snapshot.Info) { committed = append(committed, label) }
	_ = cfg2
	if _, err := s1.Commit(ctx, "second"); err != nil {
		t.Fatal(err)
	}
	s1.Close(ctx)

	s2 := open(t, cfg)
	b, err := s2.ReadFile(ctx, "/home/user/app/index.html", 0)
	if err != nil || string(b) != "v2" {
		t.Fatalf("woken session reads %q, %v; want v2", b, err)
	}
	if _, err := s2.Commit(ctx, "third"); err != nil || len(committed) != 1 || committed[0] != "third" {
		t.Fatalf("AfterCommit saw %v (%v)", committed, err)
	}
}

// TestDeadSandboxRecovers: a sandbox killed under the session is replaced from the newest
// snapshot on the next call, which succeeds.
// agentPID finds the host pid of the agent of the session's current sandbox: the process
// named toolhost-agent in the sandbox's cgroup (named after the sandbox).
func agentPID(t *testing.T, s *session.Session) int {
	t.Helper()
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/toolhost/" + s.SandboxID() + "@*/cgroup.procs")
	dirs2, _ := filepath.Glob("/sys/fs/cgroup/*/*/*/toolhost/" + s.SandboxID() + "@*/cgroup.procs")
	for _, f := range append(dirs, dirs2...) {
		b, _ := os.ReadFile(f)
		for _, field := range strings.Fields(string(b)) {
			pid, _ := strconv.Atoi(field)
			if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) == "toolhost-agent" {
				return pid
			}
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("no cgroup lists the agent of sandbox %s", s.SandboxID())
	}
	t.Skipf("no cgroup lists the agent of sandbox %s (no cgroups here?)", s.SandboxID())
	return 0
}

// A sandbox that dies (its agent killed from outside: nothing inside can) is replaced, and
// a local workspace is handed over: even the work since the last commit is kept.
func TestDeadSandboxRecovers(t *testing.T) {
	s := open(t, session.Config{Provider: provider(t), ProjectID: "dead", Snapshots: snapshots(t)})
	ctx := context.Background()
	if err := s.WriteFile(ctx, "/home/user/a.txt", []byte("saved")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if err := s.WriteFile(ctx, "/home/user/b.txt", []byte("not committed")); err != nil {
		t.Fatal(err)
	}
	before := s.SandboxID()
	if err := syscall.Kill(agentPID(t, s), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"a.txt", "b.txt"} {
		if _, err := s.ReadFile(ctx, "/home/user/"+f, 0); err != nil {
			t.Fatalf("%s after the sandbox died: %v", f, err)
		}
	}
	if s.SandboxID() == before {
		t.Fatal("the dead sandbox was not replaced")
	}
}

// An agent that stops answering (SIGSTOP from outside) fails the command in flight within
// its timeout plus a grace, with an error that says what happened; the session replaces
// the sandbox, keeps the files, and the next call works.
func TestUnresponsiveSandboxIsReplaced(t *testing.T) {
	s := open(t, session.Config{Provider: provider(t), ProjectID: "stopped", Snapshots: snapshots(t)})
	ctx := context.Background()
	if err := s.WriteFile(ctx, "/home/user/work.txt", []byte("not committed")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(agentPID(t, s), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	_, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}, Timeout: time.Second})
	if !errors.Is(err, session.ErrReplaced) || !errors.Is(err, sandbox.ErrUnresponsive) {
		t.Fatalf("a command on a stopped agent: %v", err)
	}
	res, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"cat", "work.txt"}, Timeout: 10 * time.Second})
	if err != nil || string(res.Stdout) != "not committed" {
		t.Fatalf("after the replacement: %q %v", res.Stdout, err)
	}
}
