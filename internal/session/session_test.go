//go:build linux

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
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/host"
	"github.com/toolhost/toolhost/internal/sandbox/local"
	"github.com/toolhost/toolhost/internal/session"
	"github.com/toolhost/toolhost/internal/session/sessiontest"
	"github.com/toolhost/toolhost/internal/snapshot"
	"github.com/toolhost/toolhost/internal/store/dir"
	"github.com/toolhost/toolhost/internal/testenv"
	"github.com/toolhost/toolhost/internal/testplugins"
)

// provider is a local provider; a pool of n keeps n spares per configuration.
func provider(t testing.TB, pool ...int) *local.Provider {
	t.Helper()
	testenv.NeedBwrap(t)
	n := 0
	if len(pool) > 0 {
		n = pool[0]
	}
	p, err := local.New(local.Config{RunDir: testenv.RunDir(t), MaxLifetime: time.Hour, Pool: n})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(context.Background()) }) // after the sandboxes (registered later)
	return p
}

func snapshots(t testing.TB) *snapshot.Manager {
	t.Helper()
	m, _ := snapshotsOn(t, nil)
	return m
}

// downStore is a real directory store that can be taken down: while down, every request
// fails as an unreachable S3 store's would.
type downStore struct {
	store.Store
	down atomic.Bool
}

func (d *downStore) err() error {
	if d.down.Load() {
		return fmt.Errorf("injected: %w", store.ErrUnreachable)
	}
	return nil
}

func (d *downStore) Put(ctx context.Context, key string, r io.Reader, o store.PutOptions) (store.ObjectInfo, error) {
	if err := d.err(); err != nil {
		return store.ObjectInfo{}, err
	}
	return d.Store.Put(ctx, key, r, o)
}

func (d *downStore) List(ctx context.Context, o store.ListOptions) (store.ListPage, error) {
	if err := d.err(); err != nil {
		return store.ListPage{}, err
	}
	return d.Store.List(ctx, o)
}

// snapshotsOn is a Manager on a directory store, through wrap when given.
func snapshotsOn(t testing.TB, wrap func(store.Store) store.Store) (*snapshot.Manager, store.Store) {
	t.Helper()
	var st store.Store
	d, err := dir.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	st = d
	if wrap != nil {
		st = wrap(st)
	}
	m, err := snapshot.New(snapshot.Config{Store: st, Backoff: time.Millisecond, TempDir: t.TempDir(),
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return m, st
}

// clocked is a session on real local sandboxes whose lifetimes follow a fake clock.
type clocked struct {
	clock    *sessiontest.Clock
	provider *sessiontest.Provider
	logs     *logBuf
}

func newClocked(t testing.TB, maxLifetime time.Duration) *clocked {
	t.Helper()
	clk := sessiontest.NewClock(time.Now())
	return &clocked{clock: clk, provider: &sessiontest.Provider{Inner: provider(t), Clock: clk, MaxLifetime: maxLifetime}, logs: &logBuf{}}
}

// config fills in the clock, the provider and a logger that records.
func (c *clocked) config(cfg session.Config) session.Config {
	cfg.Clock, cfg.Provider = c.clock, c.provider
	cfg.Logger = slog.New(slog.NewTextHandler(c.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return cfg
}

// logBuf collects log records as text.
type logBuf struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
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

func open(t testing.TB, cfg session.Config) *session.Workspace {
	t.Helper()
	s, err := session.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return s
}

// TestRotationIsInvisible runs a loop of tool calls on sandboxes that live 10 minutes on
// a fake clock moved 50 s per call: the session cannot extend them (their maximum lifetime
// is their TTL), so it saves, replaces and restores them at least three times while every
// call succeeds and every file written survives. No sleeping: the clock decides.
func TestRotationIsInvisible(t *testing.T) {
	for _, restore := range []bool{false, true} {
		t.Run(map[bool]string{false: "handoff", true: "restore"}[restore], func(t *testing.T) {
			testRotation(t, restore)
		})
	}
}

func testRotation(t *testing.T, restore bool) {
	c := newClocked(t, 10*time.Minute)
	s := open(t, c.config(session.Config{
		ProjectID: "rotation", Snapshots: snapshots(t),
		TTL: 10 * time.Minute, MaxLifetime: 10 * time.Minute, KeepaliveMargin: 2 * time.Minute,
		RetryInterval: 10 * time.Second, RestoreOnRotate: restore,
	}))
	hs := toolHost(t).OpenSession(s)
	ctx := context.Background()
	want := map[string]string{}
	for i := 0; s.Rotations() < 3; i++ {
		if i == 60 {
			t.Fatalf("only %d rotations after %d calls (%s of clock)", s.Rotations(), i, 50*time.Second*time.Duration(i))
		}
		name := fmt.Sprintf("work/file-%03d.txt", i)
		content := fmt.Sprintf("call %d at %s\n", i, c.clock.Now().Format(time.RFC3339Nano))
		in, _ := json.Marshal(map[string]string{"path": name, "content": content})
		res, err := hs.Dispatch(ctx, "write_file", in)
		if err != nil || res.IsError {
			t.Fatalf("call %d (rotation %d): write_file failed: %q %v\n%s", i, s.Rotations(), testenv.ResultText(res), err, c.logs)
		}
		want[name] = content
		res, err = hs.Dispatch(ctx, "bash", json.RawMessage(`{"command":"ls work | wc -l"}`))
		if err != nil || res.IsError || !strings.Contains(testenv.ResultText(res), fmt.Sprintf("\n%d\n", len(want))) {
			t.Fatalf("call %d (rotation %d): bash sees the wrong files: %q %v", i, s.Rotations(), testenv.ResultText(res), err)
		}
		c.clock.Advance(50 * time.Second)
	}
	for name, content := range want {
		in, _ := json.Marshal(map[string]string{"path": name})
		res, err := hs.Dispatch(ctx, "read_file", in)
		if err != nil || res.IsError || !strings.Contains(testenv.ResultText(res), strings.TrimSuffix(content, "\n")) {
			t.Fatalf("after %d rotations %s reads %q, %v; want %q", s.Rotations(), name, testenv.ResultText(res), err, content)
		}
	}
	sandboxes := c.provider.Sandboxes()
	if len(sandboxes) != 4 {
		t.Errorf("%d sandboxes for 3 rotations", len(sandboxes))
	}
	for _, sb := range sandboxes {
		if sb.Expired() {
			t.Errorf("sandbox %s reached its end before the session moved on", sb.ID())
		}
	}
	if strings.Contains(c.logs.String(), "ended before it was saved") || strings.Contains(c.logs.String(), "ended on its own") {
		t.Errorf("a sandbox died under the session:\n%s", c.logs)
	}
	t.Logf("%d files written across %d rotations", len(want), s.Rotations())
}

// TestFailedSaveKeepsTheOnlyCopy: while the snapshot cannot be saved and the end is not
// near, the sandbox that holds the only copy of the work is not torn down; once saving
// works again, rotation goes ahead and nothing is lost.
func TestFailedSaveKeepsTheOnlyCopy(t *testing.T) {
	c := newClocked(t, time.Hour)
	var down *downStore
	snaps, _ := snapshotsOn(t, func(st store.Store) store.Store { down = &downStore{Store: st}; return down })
	s := open(t, c.config(session.Config{
		ProjectID: "flaky", Snapshots: snaps,
		TTL: time.Hour, MaxLifetime: time.Hour, KeepaliveMargin: 10 * time.Minute, LastCallMargin: time.Minute,
		RetryInterval: 30 * time.Second,
	}))
	ctx := context.Background()
	first := s.SandboxID()
	if err := s.WriteFile(ctx, "/home/user/precious.txt", []byte("only copy")); err != nil {
		t.Fatal(err)
	}
	down.down.Store(true)
	c.clock.Advance(52 * time.Minute) // 8 minutes left: rotation is due and fails
	for range 8 {
		if _, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil {
			t.Fatalf("a call while saves fail: %v", err)
		}
		c.clock.Advance(40 * time.Second)
	}
	if s.SandboxID() != first || s.Rotations() != 0 {
		t.Fatalf("the sandbox was replaced although its snapshot failed and its end is not near")
	}
	if n := strings.Count(c.logs.String(), "rotation postponed: snapshot failed"); n < 2 {
		t.Errorf("%d postponed rotations logged", n)
	}
	if _, err := s.Commit(ctx, "phase 1"); !errors.Is(err, snapshot.ErrSaveFailed) {
		t.Fatalf("commit while saves fail: %v, want ErrSaveFailed", err)
	}
	down.down.Store(false)
	for i := 0; s.Rotations() == 0; i++ {
		if i == 10 {
			t.Fatal("no rotation after saves work again")
		}
		c.clock.Advance(30 * time.Second)
		if _, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil {
			t.Fatalf("call: %v", err)
		}
	}
	b, err := s.ReadFile(ctx, "/home/user/precious.txt", 0)
	if err != nil || string(b) != "only copy" || s.SandboxID() == first {
		t.Fatalf("after rotation: %q %v (sandbox %s, first %s)", b, err, s.SandboxID(), first)
	}
	if _, err := s.Commit(ctx, "phase 2"); err != nil {
		t.Fatalf("the next commit after recovery: %v", err)
	}
}

// TestFailingSavesStillRotateBeforeTheEnd: the store is down for good. The session
// postpones while it can, and at the last call it rotates all the same, before the
// sandbox's end, without losing the work since the last snapshot: by handing the
// workspace over, or (restore path) from the archive it packed to this host's disk. It
// says so loudly; and once the store is back, the work reaches it, so a new session wakes
// with it.
//
// "chained" is an E2B sandbox's case in "e2b,local": the chain can hand over
// local sandboxes, not this one, so the session must take the restore path (and keep the
// archive on this host) from the start, not count on a handoff that cannot happen.
func TestFailingSavesStillRotateBeforeTheEnd(t *testing.T) {
	for _, mode := range []string{"handoff", "restore", "chained"} {
		t.Run(mode, func(t *testing.T) {
			restore := mode != "handoff"
			c := newClocked(t, time.Hour)
			var down *downStore
			snaps, _ := snapshotsOn(t, func(st store.Store) store.Store { down = &downStore{Store: st}; return down })
			cfg := c.config(session.Config{
				ProjectID: "doomed", Snapshots: snaps, RestoreOnRotate: mode == "restore",
				TTL: time.Hour, MaxLifetime: time.Hour, KeepaliveMargin: 10 * time.Minute, LastCallMargin: 2 * time.Minute,
				RetryInterval: 30 * time.Second,
			})
			if mode == "chained" {
				c.provider.Inner = noHandoff{c.provider.Inner}
				cfg.Provider = sandbox.NewChain(cfg.Logger,
					sandbox.Named{Name: "remote", Provider: c.provider}, sandbox.Named{Name: "local", Provider: provider(t)})
			}
			s := open(t, cfg)
			ctx := context.Background()
			if _, err := s.Commit(ctx, "before the outage"); err != nil {
				t.Fatal(err)
			}
			down.down.Store(true)
			if err := s.WriteFile(ctx, "/home/user/unsaved.txt", []byte("work since the last snapshot")); err != nil {
				t.Fatal(err)
			}
			first := c.provider.Last()
			// Walk the clock to the sandbox's end, a call every 20 s.
			for c.clock.Now().Before(first.EndsAt()) && s.Rotations() == 0 {
				c.clock.Advance(20 * time.Second)
				if _, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil {
					t.Fatalf("a call %s before the end: %v", first.EndsAt().Sub(c.clock.Now()), err)
				}
			}
			if s.Rotations() != 1 || first.Expired() {
				t.Fatalf("rotations %d; the first sandbox expired: %v\n%s", s.Rotations(), first.Expired(), c.logs)
			}
			if left := first.EndsAt().Sub(c.clock.Now()); left <= 0 || left > 2*time.Minute {
				t.Errorf("rotated %s before the end, want within the last-call margin", left)
			}
			if !strings.Contains(c.logs.String(), "LAST CALL") {
				t.Errorf("the forced rotation is not said loudly:\n%s", c.logs)
			}
			b, err := s.ReadFile(ctx, "/home/user/unsaved.txt", 0)
			if err != nil || string(b) != "work since the last snapshot" {
				t.Fatalf("after the forced rotation: %q %v", b, err)
			}
			// The store comes back; the work reaches it (the local copy, or the next commit).
			down.down.Store(false)
			if restore {
				if !testenv.Eventually(func() bool {
					if strings.Contains(c.logs.String(), "is now in the store") {
						return true
					}
					c.clock.Advance(30 * time.Second) // the keepalive loop offers it again
					return false
				}) {
					t.Fatalf("the local snapshot never reached the store:\n%s", c.logs)
				}
			} else if _, err := s.Commit(ctx, "after the outage"); err != nil {
				t.Fatal(err)
			}
			if testing.Verbose() {
				t.Logf("logs:\n%s", c.logs)
			}
			if mode == "chained" && strings.Contains(c.logs.String(), "handoff failed") {
				t.Errorf("the session tried to hand a remote sandbox over:\n%s", c.logs)
			}
			s.Close(ctx)
			s2 := open(t, cfg)
			if b, err := s2.ReadFile(ctx, "/home/user/unsaved.txt", 0); err != nil || string(b) != "work since the last snapshot" {
				t.Errorf("a new session wakes without the work: %q %v", b, err)
			}
		})
	}
}

// noHandoff is a provider that cannot hand a workspace over (a remote one).
type noHandoff struct{ sandbox.Provider }

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
func agentPID(t *testing.T, s *session.Workspace) int {
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
	testenv.Skipf(t, "no cgroup lists the agent of sandbox %s (no cgroups here?)", s.SandboxID())
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

// fetch is a bash command that fetches a page served in the sandbox, waiting up to 10 s for
// the server to answer.
const fetch = `{"command":"for i in $(seq 100); do python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8000/index.html').read().decode())\" 2>/dev/null && exit 0; sleep 0.1; done; exit 1"}`

// startedAs reads the id, pid and log of a background start's result.
func startedAs(t *testing.T, res string) (id, pid, log string) {
	t.Helper()
	m := regexp.MustCompile(`id (\S+), pid (\d+), log (\S+)`).FindStringSubmatch(res)
	if m == nil {
		t.Fatalf("not a background start: %q", res)
	}
	return m[1], m[2], strings.TrimRight(m[3], ".,")
}

// A background server started through bash survives three rotations on both paths: it is
// restarted in each new sandbox under its id and log file and answers again; a process
// the agent killed is not restarted; and the next tool result says so, once.
func TestBackgroundProcessesSurviveRotation(t *testing.T) {
	for _, restore := range []bool{false, true} {
		t.Run(map[bool]string{false: "handoff", true: "restore"}[restore], func(t *testing.T) {
			s := open(t, session.Config{Provider: provider(t), ProjectID: "bg", Snapshots: snapshots(t), RestoreOnRotate: restore})
			hs := toolHost(t).OpenSession(s)
			ctx := context.Background()
			call := func(tool, in string) abi.Result {
				t.Helper()
				res, err := hs.Dispatch(ctx, tool, json.RawMessage(in))
				if err != nil || res.IsError {
					t.Fatalf("%s %s: %q %v", tool, in, testenv.ResultText(res), err)
				}
				return res
			}
			call("write_file", `{"path":"index.html","content":"<h1>still serving</h1>"}`)
			id, _, logPath := startedAs(t, testenv.ResultText(call("bash", `{"command":"python3 -m http.server 8000 --bind 127.0.0.1","background":true}`)))
			killedID, killedPID, _ := startedAs(t, testenv.ResultText(call("bash", `{"command":"sleep 1000","background":true}`)))
			call("bash", `{"command":"kill `+killedPID+`"}`)
			if got := testenv.ResultText(call("bash", fetch)); !strings.Contains(got, "still serving") {
				t.Fatalf("the server does not answer: %q", got)
			}
			for r := 1; r <= 3; r++ {
				if err := s.Rotate(ctx); err != nil {
					t.Fatal(err)
				}
				res := call("bash", fetch)
				if !strings.Contains(testenv.ResultText(res), "still serving") {
					t.Fatalf("rotation %d: the server does not answer: %q", r, testenv.ResultText(res))
				}
				if len(res.Content) != 2 {
					t.Fatalf("rotation %d: the first result after it has no notice: %+v", r, res.Content)
				}
				notice := res.Content[1].Text
				if !strings.Contains(notice, id+", now pid ") || !strings.Contains(notice, "log "+logPath+":") ||
					!strings.Contains(notice, "python3 -m http.server 8000") || strings.Contains(notice, killedID) {
					t.Errorf("rotation %d: notice %q", r, notice)
				}
				if res := call("bash", `{"command":"cat `+logPath+` | head -c 2000; ps -eo args= | grep -c '^sleep 1000' || true"}`); len(res.Content) != 1 ||
					!strings.Contains(testenv.ResultText(res), "GET /index.html") || !strings.HasSuffix(strings.TrimSuffix(testenv.ResultText(res), "\n[exit 0]"), "\n0") {
					t.Errorf("rotation %d: the next result (log, killed process): %+v", r, res.Content)
				}
			}
			if s.Rotations() != 3 {
				t.Errorf("%d rotations", s.Rotations())
			}
		})
	}
}

// A commit of a workspace holding what a snapshot cannot store (a path longer than 4,096
// bytes, made by one mkdir loop, and a FIFO) succeeds, says what it left out, and
// restores.
func TestCommitReportsUnstorableEntries(t *testing.T) {
	p, snaps := provider(t), snapshots(t)
	cfg := session.Config{Provider: p, ProjectID: "odd", Snapshots: snaps}
	s := open(t, cfg)
	ctx := context.Background()
	res, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"bash", "-c",
		`echo kept > keep.txt && mkfifo pipe && d=$(printf 'd%.0s' $(seq 200)) && for i in $(seq 25); do mkdir $d && cd $d; done && echo lost > deep.txt`}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%v %s %s", err, res.Stdout, res.Stderr)
	}
	info, err := s.Commit(ctx, "odd entries")
	if err != nil {
		t.Fatalf("a commit with unstorable entries failed: %v", err)
	}
	var reasons []string
	for _, sk := range info.Skips {
		reasons = append(reasons, sk.Path+": "+sk.Reason)
	}
	if info.Skipped < 2 || !strings.Contains(strings.Join(reasons, "|"), "longer than 4096") || !strings.Contains(strings.Join(reasons, "|"), "pipe: not a regular file") {
		t.Errorf("commit's report: skipped %d: %q", info.Skipped, reasons)
	}
	s.Close(ctx)
	s2 := open(t, cfg)
	if b, err := s2.ReadFile(ctx, "/home/user/keep.txt", 0); err != nil || string(b) != "kept\n" {
		t.Errorf("restored keep.txt: %q %v", b, err)
	}
}

// When a sandbox dies and its work cannot be handed over (the restore path), the newest
// snapshot is restored and the next tool result tells the agent that the changes since it
// are lost.
func TestLostWorkIsToldToTheAgent(t *testing.T) {
	s := open(t, session.Config{Provider: provider(t), ProjectID: "lost", Snapshots: snapshots(t), RestoreOnRotate: true})
	hs := toolHost(t).OpenSession(s)
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
	if err := syscall.Kill(agentPID(t, s), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The command that meets the death either does not finish (and says so) or, when the
	// sandbox was found ended before the command went out, runs on the new one; either way
	// the result tells what happened to the files.
	res, err := hs.Dispatch(ctx, "bash", json.RawMessage(`{"command":"ls"}`))
	out := testenv.ResultText(res)
	if err != nil || strings.Contains(out, "files are kept") ||
		(res.IsError && !strings.Contains(out, "ended")) ||
		(!res.IsError && (!strings.Contains(out, "a.txt") || strings.Contains(out, "b.txt"))) {
		t.Fatalf("the call that met the death: %q %v", out, err)
	}
	if n := len(res.Content); n != 2 || !strings.Contains(res.Content[1].Text, "changes made since it are lost") {
		t.Errorf("the agent is not told its work was lost: %+v", res.Content)
	}
	res, err = hs.Dispatch(ctx, "bash", json.RawMessage(`{"command":"ls"}`))
	if err != nil || res.IsError || !strings.Contains(testenv.ResultText(res), "a.txt") || strings.Contains(testenv.ResultText(res), "b.txt") || len(res.Content) != 1 {
		t.Fatalf("after the death: %+v %v", res.Content, err)
	}
}

// A rotation with a provider that keeps spares takes one: the workspace is attached to a
// sandbox started before the rotation, every file is kept, the background process is
// restarted there, and the old sandbox is gone.
func TestRotationTakesASpare(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Skipf(t, "spare sandboxes need root (the host mounts each workspace for its sandbox)")
	}
	p := provider(t, 1)
	s := open(t, session.Config{Provider: p, ProjectID: "spare", Snapshots: snapshots(t), TTL: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	ctx := context.Background()
	if res, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"bash", "-c", "echo kept > kept.txt"}}); err != nil || res.ExitCode != 0 {
		t.Fatalf("%+v %v", res, err)
	}
	if _, err := s.Start(ctx, sandbox.ExecRequest{Argv: []string{"sleep", "600"}}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "a spare sandbox", func() bool { return p.Spares(sandbox.CreateOptions{}) > 0 })
	before := s.SandboxID()
	rotated := time.Now()
	if err := s.Rotate(ctx); err != nil {
		t.Fatal(err)
	}
	if s.SandboxID() == before {
		t.Fatal("the rotation kept the sandbox")
	}
	if !s.StartedAt().Before(rotated) {
		t.Errorf("the sandbox after the rotation started at %s, after the rotation began (%s): it was not a spare", s.StartedAt(), rotated)
	}
	res, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"bash", "-c", "cat kept.txt; pgrep -xc sleep"}})
	if err != nil || string(res.Stdout) != "kept\n1\n" {
		t.Fatalf("after the rotation: %q %q %v", res.Stdout, res.Stderr, err)
	}
}
