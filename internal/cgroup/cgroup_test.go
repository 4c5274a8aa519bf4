//go:build linux

package cgroup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/toolhost/toolhost/internal/testenv"
)

// skipf skips for a capability the machine lacks, or fails under CI=true, where every
// capability the tests need must be there.
func skipf(t testing.TB, format string, args ...any) {
	t.Helper()
	testenv.Skipf(t, format, args...)
}

// hostEnv is the real system as Open sees it, with options for the fallback paths.
func hostEnv(t testing.TB) env {
	t.Helper()
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	sc, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	return env{fs: osFS{}, mountinfo: mi, selfCgroup: sc, pid: os.Getpid()}
}

// newManager opens a Manager under a name private to this test process and removes its
// directories when the test ends (after the groups, whose cleanups run first).
func newManager(t testing.TB, e env) *Manager {
	t.Helper()
	if os.Geteuid() != 0 {
		skipf(t, "cgroup tests need root (to create cgroups on this host)")
	}
	m, err := open(e, fmt.Sprintf("toolhost-test-%d", os.Getpid()), slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() {
		for _, d := range m.dirs() {
			if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.EBUSY) {
				t.Errorf("remove manager directory: %v", err)
			}
		}
	})
	t.Logf("support: %s", m.Support())
	return m
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func newGroup(t testing.TB, m *Manager, l Limits) *Group {
	t.Helper()
	g, err := m.Create(strings.ReplaceAll(t.Name(), "/", "_"), l)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := g.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return g
}

func need(t testing.TB, m *Manager, mech Mechanism, what string) {
	t.Helper()
	if !mech.OK() {
		skipf(t, "no %s limit on this host: %s (support: %s)", what, mech.Why, m.Support())
	}
}

// syncBuffer is an output buffer the test reads while the command writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start runs argv inside g and returns the command and its combined output.
func start(t testing.TB, g *Group, argv ...string) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	out := &syncBuffer{}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := g.Start(cmd); err != nil {
		t.Fatalf("Start %v: %v", argv, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd, out
}

// waitCmd waits for cmd with a deadline, killing it past the deadline.
func waitCmd(t testing.TB, cmd *exec.Cmd, d time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }() // owned by waitCmd, which receives its result
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%v still running after %s", cmd.Args, d)
		return nil
	}
}

func TestSupportReportsEveryResource(t *testing.T) {
	m := newManager(t, hostEnv(t))
	s := m.Support()
	for name, mech := range map[string]Mechanism{"memory": s.Memory, "pids": s.Pids, "cpu": s.CPU, "kill": s.Kill} {
		if mech.OK() == (mech.Why != "") {
			t.Errorf("%s: By %q and Why %q: exactly one must be set", name, mech.By, mech.Why)
		}
		if !strings.Contains(s.String(), name+": "+mech.String()) {
			t.Errorf("String() %q lacks %s", s, name)
		}
	}
	// This host's configuration, when it is the one the package was written on: v1
	// controllers, a controller-less cgroup2 tree at /sys/fs/cgroup/unified.
	if fieldsOf(os.ReadFile("/sys/fs/cgroup/unified/cgroup.controllers")) != nil && fileExists("/sys/fs/cgroup/memory/memory.limit_in_bytes") {
		if !strings.HasPrefix(s.Memory.By, "cgroup v1 memory") || s.Pids.By != "cgroup v1 pids" || s.Kill.By != "cgroup v2 cgroup.kill" {
			t.Errorf("hybrid host, support = %s", s)
		}
	}
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func TestStartPlacesProcessInEveryTree(t *testing.T) {
	m := newManager(t, hostEnv(t))
	g := newGroup(t, m, Limits{MemoryBytes: 256 << 20, Pids: 64, CPUs: 1})
	cmd, _ := start(t, g, "sleep", "60")
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	trees := 0
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if strings.HasSuffix(line, "/"+g.dir) {
			trees++
		}
	}
	if want := len(g.v1) + btoi(g.v2 != ""); trees != want {
		t.Errorf("child in the group in %d trees, want %d:\n%s", trees, want, b)
	}
	// The thread that forked went back: no thread of the test process is in the group.
	tasks, _ := filepath.Glob("/proc/self/task/*/cgroup")
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err == nil && bytes.Contains(b, []byte("/"+g.dir)) {
			t.Errorf("host thread %s stayed in the group:\n%s", f, b)
		}
	}
	procs, err := g.Procs()
	if err != nil || len(procs) != 1 || procs[0] != cmd.Process.Pid {
		t.Errorf("Procs = %v, %v; want [%d]", procs, err, cmd.Process.Pid)
	}
	if d := g.v1dirOf(m.cpu); d != "" {
		if b, _ := os.ReadFile(d + "/cpu.cfs_quota_us"); strings.TrimSpace(string(b)) != "100000" {
			t.Errorf("cpu.cfs_quota_us = %q, want 100000", b)
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestPidsLimitFailsForksInside(t *testing.T) {
	m := newManager(t, hostEnv(t))
	need(t, m, m.Support().Pids, "pids")
	dash, err := exec.LookPath("dash") // Debian's /bin/sh: gives up at the first failed fork, unlike bash, which retries for seconds
	if err != nil {
		skipf(t, "dash not installed: %v", err)
	}
	g := newGroup(t, m, Limits{Pids: 16})
	// 40 background sleeps at most: bounded, never a fork bomb.
	cmd, out := start(t, g, dash, "-c", `i=0; while [ $i -lt 40 ]; do sleep 5 >/dev/null 2>&1 & i=$((i+1)); done; echo started $i`)
	err = waitCmd(t, cmd, 30*time.Second)
	if err == nil || strings.Contains(out.String(), "started 40") {
		t.Fatalf("all 40 forks succeeded under a limit of 16 (err %v): %s", err, out)
	}
	st, serr := g.Stats()
	if serr != nil {
		t.Fatal(serr)
	}
	if st.PidsRefused == 0 {
		t.Errorf("Stats.PidsRefused = 0 after refused forks; output %q", out)
	}
	if st.Pids > 16 {
		t.Errorf("%d processes in a group limited to 16", st.Pids)
	}
	t.Logf("shell: %v, %q; stats %+v", err, strings.TrimSpace(out.String()), st)
	// The host keeps forking.
	if err := exec.Command("true").Run(); err != nil {
		t.Errorf("the test process cannot fork: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.Kill(ctx); err != nil {
		t.Fatalf("Kill: %v", err)
	}
}

func TestMemoryLimitKillsOnlyTheSandboxProcess(t *testing.T) {
	m := newManager(t, hostEnv(t))
	need(t, m, m.Support().Memory, "memory")
	const limit = 64 << 20
	g := newGroup(t, m, Limits{MemoryBytes: limit})
	// bash holds a 200 MB command substitution in memory.
	cmd, out := start(t, g, "bash", "-c", `x=$(head -c 200000000 /dev/zero | tr '\0' a); echo survived ${#x}`)
	err := waitCmd(t, cmd, 60*time.Second)
	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if err == nil || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("the allocating shell was not killed: %v, %q", err, out)
	}
	st, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.OOMKills < 1 {
		t.Errorf("Stats.OOMKills = %d after an OOM kill", st.OOMKills)
	}
	if n, err := g.OOMKills(); err != nil || n != st.OOMKills {
		t.Errorf("OOMKills() = %d, %v; Stats said %d", n, err, st.OOMKills)
	}
	if st.MemoryPeak > limit {
		t.Errorf("memory peak %d above the limit %d", st.MemoryPeak, limit)
	}
	t.Logf("stats %+v", st)
}

func TestTmpfsPagesAreCharged(t *testing.T) {
	m := newManager(t, hostEnv(t))
	need(t, m, m.Support().Memory, "memory")
	if _, err := exec.LookPath("mount"); err != nil {
		skipf(t, "mount(8) not installed: %v", err)
	}
	g := newGroup(t, m, Limits{MemoryBytes: 64 << 20})
	// A tmpfs of its own in a private mount namespace (Go makes the new namespace's mounts
	// private), 1 GiB by size, so only the memory limit can stop the 100 MiB write; the
	// tmpfs and its pages go when the namespace's last process does.
	dir := t.TempDir()
	script := `mount -t tmpfs -o size=1g toolhost-test "$1" || exit 99
head -c 104857600 /dev/zero > "$1/f"; echo "head=$?"; stat -c "size=%s" "$1/f"`
	var out bytes.Buffer
	cmd := exec.Command("sh", "-c", script, "sh", dir)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	if err := g.Start(cmd); err != nil {
		t.Fatalf("Start: %v", err)
	}
	err := waitCmd(t, cmd, 60*time.Second)
	if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() == 99 {
		t.Fatalf("mount tmpfs: %s", out.String())
	}
	if strings.Contains(out.String(), "head=0") || strings.Contains(out.String(), "size=104857600") {
		t.Fatalf("100 MiB written to tmpfs under a 64 MiB limit: %v %q", err, out.String())
	}
	st, serr := g.Stats()
	if serr != nil {
		t.Fatal(serr)
	}
	if st.OOMKills == 0 && !strings.Contains(out.String(), "head=") {
		t.Errorf("writer neither killed nor failed: %v %q %+v", err, out.String(), st)
	}
	t.Logf("writer: %v %q; stats %+v", err, strings.TrimSpace(out.String()), st)
}

// killTree starts a dozen processes in g: direct children, a nested tree, a process in
// its own session and an orphan reparented away from the shell.
func killTree(t *testing.T, g *Group) {
	t.Helper()
	script := `for i in 1 2 3 4; do sleep 60 & done
sh -c 'sleep 60 & sleep 60 & sh -c "sleep 60 & sleep 60 & wait" & wait' &
setsid sleep 60 &
sh -c 'sleep 60 & exit 0'
echo ready
wait`
	cmd, out := start(t, g, "sh", "-c", script)
	var procs []int
	if !testenv.Eventually(func() bool {
		var err error
		if procs, err = g.Procs(); err != nil {
			t.Fatal(err)
		}
		return len(procs) >= 12 && strings.Contains(out.String(), "ready")
	}) {
		t.Fatalf("only %d processes started: %q", len(procs), out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.Kill(ctx); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	left, err := g.Procs()
	if err != nil || len(left) != 0 {
		t.Fatalf("after Kill: procs %v, %v", left, err)
	}
	_ = waitCmd(t, cmd, 10*time.Second)
	for _, p := range procs {
		if p == cmd.Process.Pid {
			continue // our child, reaped above
		}
		// Reparented to init or a subreaper, which reaps: gone from /proc, or a zombie.
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p)); err == nil && !bytes.Contains(b, []byte(") Z ")) {
			t.Errorf("process %d survived Kill: %s", p, b)
		}
	}
}

// v1Manager is a Manager on the v1 hierarchies only, with or without the freezer; the
// test skips when the host has no such hierarchy.
func v1Manager(t *testing.T, freezer bool) *Manager {
	t.Helper()
	e := hostEnv(t)
	e.noV2 = true
	if !freezer {
		e.without = []string{"freezer"}
	}
	m := newManager(t, e)
	switch {
	case freezer && m.freez == nil:
		skipf(t, "no v1 freezer hierarchy: %s", m.Support())
	case len(m.hier) == 0:
		skipf(t, "no v1 hierarchy: %s", m.Support())
	}
	return m
}

func TestKillEmptiesGroup(t *testing.T) {
	t.Run("default", func(t *testing.T) {
		killTree(t, newGroup(t, newManager(t, hostEnv(t)), Limits{Pids: 64}))
	})
	t.Run("v1-freezer", func(t *testing.T) {
		m := v1Manager(t, true)
		if m.Support().Kill.By != "cgroup v1 freezer and SIGKILL" {
			t.Errorf("kill mechanism %q", m.Support().Kill)
		}
		killTree(t, newGroup(t, m, Limits{Pids: 64}))
	})
	t.Run("v1-signals", func(t *testing.T) {
		m := v1Manager(t, false)
		if m.Support().Kill.By != "SIGKILL to cgroup.procs" {
			t.Errorf("kill mechanism %q", m.Support().Kill)
		}
		killTree(t, newGroup(t, m, Limits{Pids: 64}))
	})
}

// TestFreezeStopsEveryProcess: once Freeze returns, no process of the group writes
// again (two writers, one forked from the other), and Kill ends the frozen group without
// letting any of them run: the files hold what they held at the freeze.
func TestFreezeStopsEveryProcess(t *testing.T) {
	run := func(t *testing.T, m *Manager) {
		g := newGroup(t, m, Limits{Pids: 64})
		dir := t.TempDir()
		script := `w() { i=0; while :; do i=$((i+1)); echo $i > "$1.new"; mv "$1.new" "$1"; done; }
w ` + dir + `/a & w ` + dir + `/b & echo ready; wait`
		cmd, out := start(t, g, "sh", "-c", script)
		read := func() string {
			a, _ := os.ReadFile(dir + "/a")
			b, _ := os.ReadFile(dir + "/b")
			return string(a) + "|" + string(b)
		}
		if !testenv.Eventually(func() bool {
			return strings.Contains(out.String(), "ready") && !strings.HasPrefix(read(), "|") && !strings.HasSuffix(read(), "|")
		}) {
			t.Fatalf("writers did not start: %q", out)
		}
		ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
		defer cancel()
		if err := g.Freeze(ctx); err != nil {
			t.Fatalf("Freeze: %v", err)
		}
		at := read()
		time.Sleep(100 * time.Millisecond)
		if now := read(); now != at {
			t.Fatalf("a frozen group went on writing: %q then %q", at, now)
		}
		if err := g.Kill(ctx); err != nil {
			t.Fatalf("Kill of a frozen group: %v", err)
		}
		if left, err := g.Procs(); err != nil || len(left) != 0 {
			t.Fatalf("after Kill: procs %v, %v", left, err)
		}
		_ = waitCmd(t, cmd, 10*time.Second)
		if now := read(); now != at {
			t.Fatalf("a process of the frozen group ran before it died: %q then %q", at, now)
		}
	}
	t.Run("default", func(t *testing.T) {
		run(t, newManager(t, hostEnv(t)))
	})
	t.Run("v1-freezer", func(t *testing.T) {
		m := v1Manager(t, true)
		run(t, m)
	})
	t.Run("none", func(t *testing.T) {
		m := v1Manager(t, false)
		g := newGroup(t, m, Limits{Pids: 64})
		if err := g.Freeze(context.Background()); !errors.Is(err, ErrNoFreezer) {
			t.Fatalf("Freeze without a freezer: %v, want ErrNoFreezer", err)
		}
	})
}

func TestCPUQuotaThrottles(t *testing.T) {
	m := newManager(t, hostEnv(t))
	need(t, m, m.Support().CPU, "cpu")
	g := newGroup(t, m, Limits{CPUs: 0.05})
	// Half a second of spinning under a quota of 5 ms per 100 ms period.
	cmd, out := start(t, g, "timeout", "0.5", "sh", "-c", "while :; do :; done")
	_ = waitCmd(t, cmd, 30*time.Second)
	dir := g.v2
	if d := g.v1dirOf(m.cpu); d != "" {
		dir = d
	}
	b, err := os.ReadFile(dir + "/cpu.stat")
	if err != nil {
		t.Fatal(err)
	}
	var throttled int64
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "nr_throttled "); ok {
			throttled, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if throttled == 0 {
		t.Errorf("a spinning shell under a 0.05 CPU quota was never throttled: cpu.stat %q, output %q", b, out)
	}
}

func TestCloseRemovesDirectories(t *testing.T) {
	m := newManager(t, hostEnv(t))
	g, err := m.Create("close-test", Limits{MemoryBytes: 128 << 20, Pids: 32, CPUs: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	dirs := []string{}
	if g.v2 != "" {
		dirs = append(dirs, g.v2)
	}
	for _, d := range g.v1 {
		dirs = append(dirs, d.dir)
	}
	if len(dirs) == 0 {
		t.Fatal("group has no directory")
	}
	cmd, _ := start(t, g, "sh", "-c", "sleep 60 & sleep 60 & wait")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	_ = waitCmd(t, cmd, 10*time.Second)
	for _, d := range dirs {
		if _, err := os.Stat(d); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s still there after Close: %v", d, err)
		}
	}
	if err := g.Close(ctx); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := g.Add(os.Getpid()); !errors.Is(err, ErrClosed) {
		t.Errorf("Add after Close: %v, want ErrClosed", err)
	}
}

func TestAddMovesRunningProcess(t *testing.T) {
	m := newManager(t, hostEnv(t))
	g := newGroup(t, m, Limits{Pids: 8})
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if err := g.Add(cmd.Process.Pid); err != nil {
		t.Fatalf("Add: %v", err)
	}
	if !g.member(cmd.Process.Pid) {
		t.Fatalf("process %d not in the group after Add", cmd.Process.Pid)
	}
	st, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if m.Support().Pids.OK() && st.Pids != 1 {
		t.Errorf("Stats.Pids = %d, want 1", st.Pids)
	}
}

func TestPruneRemovesGroupsOfDeadOwners(t *testing.T) {
	m := newManager(t, hostEnv(t))
	live := newGroup(t, m, Limits{})
	// A group "left" by a process that has exited: a real child's pid and start time.
	child := exec.Command("true")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	st, err := processStart(child.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	dead := owner{child.Process.Pid, st}
	g := &Group{m: m, id: "stale", dir: "stale@" + dead.String(), v2fd: -1}
	if err := g.create(Limits{Pids: 8}); err != nil {
		t.Fatalf("create stale group: %v", err)
	}
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	// A process left running inside it, which Prune must kill.
	cmd, _ := start(t, g, "sleep", "60")
	g.closeFD() // the dead owner's descriptor is gone with it

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.Prune(ctx); err != nil {
		t.Fatalf("Prune: %v", err)
	}
	_ = waitCmd(t, cmd, 10*time.Second)
	for _, d := range m.dirs() {
		if fileExists(d + "/" + g.dir) {
			t.Errorf("stale group %s survived Prune", d+"/"+g.dir)
		}
	}
	// The live group lives in the trees its limits need (and the kill's).
	for _, d := range append([]string{live.v2}, v1Dirs(live)...) {
		if d != "" && !fileExists(d) {
			t.Errorf("Prune removed the live group %s", d)
		}
	}
}

func v1Dirs(g *Group) []string {
	var out []string
	for _, d := range g.v1 {
		out = append(out, d.dir)
	}
	return out
}

func TestCreateRejectsBadInput(t *testing.T) {
	m := newManager(t, hostEnv(t))
	for _, id := range []string{"", ".hidden", "a/b", "a@b", strings.Repeat("x", 101)} {
		if _, err := m.Create(id, Limits{}); err == nil {
			t.Errorf("Create(%q) succeeded", id)
		}
	}
	for _, l := range []Limits{{MemoryBytes: -1}, {Pids: -1}, {CPUs: -1}} {
		if _, err := m.Create("bad-limits", l); err == nil {
			t.Errorf("Create with %+v succeeded", l)
		}
	}
}

// BenchmarkCreateStartClose is the cgroup share of a sandbox's creation and teardown:
// Create with the default limits, Start of a short process, Close.
func BenchmarkCreateStartClose(b *testing.B) {
	m := newManager(b, hostEnv(b))
	b.Logf("support: %s", m.Support())
	ctx := context.Background()
	for i := 0; b.Loop(); i++ {
		g, err := m.Create("bench-"+strconv.Itoa(i), DefaultLimits())
		if err != nil {
			b.Fatal(err)
		}
		cmd := exec.Command("/bin/true")
		if err := g.Start(cmd); err != nil {
			b.Fatal(err)
		}
		_ = cmd.Wait()
		if err := g.Close(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStartWithoutGroup is the baseline of BenchmarkCreateStartClose: the same
// process started and waited for outside any group.
func BenchmarkStartWithoutGroup(b *testing.B) {
	for b.Loop() {
		cmd := exec.Command("/bin/true")
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		_ = cmd.Wait()
	}
}

// BenchmarkCreateClose is Create and Close alone.
func BenchmarkCreateClose(b *testing.B) {
	m := newManager(b, hostEnv(b))
	ctx := context.Background()
	for i := 0; b.Loop(); i++ {
		g, err := m.Create("bench-"+strconv.Itoa(i), DefaultLimits())
		if err != nil {
			b.Fatal(err)
		}
		if err := g.Close(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// errText says "permission denied" where the kernel's EPERM does not, and only there.
func TestErrTextPermission(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{&fs.PathError{Op: "write", Path: "cgroup.procs", Err: syscall.EPERM}, "write cgroup.procs: operation not permitted (permission denied)"},
		{&fs.PathError{Op: "write", Path: "cgroup.procs", Err: syscall.EACCES}, "write cgroup.procs: permission denied"},
		{&fs.PathError{Op: "write", Path: "cgroup.procs", Err: syscall.ENOENT}, "write cgroup.procs: no such file or directory"},
	} {
		if got := errText(c.err); got != c.want {
			t.Errorf("%q, want %q", got, c.want)
		}
	}
}
