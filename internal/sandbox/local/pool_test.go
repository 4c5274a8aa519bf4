//go:build linux

package local

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/core/sandbox/sandboxtest"
	"github.com/toolhost/toolhost/internal/egress"
	"github.com/toolhost/toolhost/internal/lockfile"
	"github.com/toolhost/toolhost/internal/testenv"
)

// newPooled is a provider that keeps one spare of the default configuration.
func newPooled(t testing.TB, cfg Config) *Provider {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Skipf(t, "spare sandboxes need root (the host mounts each workspace for its sandbox)")
	}
	if cfg.Pool == 0 {
		cfg.Pool = 1
	}
	p := newProvider(t, cfg)
	p.Warm(sandbox.CreateOptions{})
	return p
}

// spareIDs waits (a hang bound) until the pool holds n spares of opts' configuration and
// returns their ids.
func spareIDs(t testing.TB, p *Provider, opts sandbox.CreateOptions, n int) []string {
	t.Helper()
	var ids []string
	if !testenv.Eventually(func() bool {
		p.pool.mu.Lock()
		defer p.pool.mu.Unlock()
		ids = ids[:0]
		for _, s := range p.pool.spares[keyOf(template(opts))] {
			ids = append(ids, s.id)
		}
		return len(ids) >= n
	}) {
		t.Fatalf("the pool holds %d spares, want %d", len(ids), n)
	}
	return slices.Clone(ids)
}

func create(t testing.TB, p *Provider, opts sandbox.CreateOptions) *Sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
	defer cancel()
	sb, err := p.Create(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close(context.Background()) })
	return sb.(*Sandbox)
}

func out(t testing.TB, sb sandbox.Sandbox, script string) string {
	t.Helper()
	res := sh(t, sb, script)
	if res.ExitCode != 0 {
		t.Fatalf("%s: exit %d: %s %s", script, res.ExitCode, res.Stdout, res.Stderr)
	}
	return strings.TrimSpace(string(res.Stdout))
}

// A spare is a whole sandbox, limits and filter in force, that gets its workspace when it is
// taken: the workspace is at /home/user (nosuid, nodev, no host path in mountinfo), the
// agent serves it, and the pool makes the next spare. A taken sandbox is never given again.
func TestPoolTakeOver(t *testing.T) {
	p := newPooled(t, Config{})
	ctx := context.Background()
	spare := spareIDs(t, p, sandbox.CreateOptions{}, 1)[0]

	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "seed.txt"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sb := create(t, p, sandbox.CreateOptions{Workspace: ws})
	if sb.ID() != spare {
		t.Fatalf("Create made %s; the spare was %s", sb.ID(), spare)
	}
	if got := out(t, sb, "cat seed.txt; echo made here > made.txt; pwd"); got != "from the host\n/home/user" {
		t.Fatalf("the workspace in the spare: %q", got)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "made.txt")); err != nil || string(b) != "made here\n" {
		t.Fatalf("a file made in the taken spare, on the host: %q, %v", b, err)
	}
	if b, err := sb.ReadFile(ctx, "seed.txt", 1<<10); err != nil || string(b) != "from the host\n" {
		t.Fatalf("the agent reads the attached workspace: %q, %v", b, err)
	}
	// The filter and the limits were in force before it was taken.
	if got := out(t, sb, "grep -c '^Seccomp:.2' /proc/self/status; ulimit -n"); got != "1\n"+strconv.FormatInt(p.limits.OpenFiles, 10) {
		t.Errorf("seccomp and open files in the taken spare: %q", got)
	}
	mi := out(t, sb, "grep ' /home/user ' /proc/self/mountinfo | tail -1")
	if !strings.Contains(mi, "nosuid") || !strings.Contains(mi, "nodev") {
		t.Errorf("the workspace mount in the spare is not nosuid,nodev: %s", mi)
	}

	// The pool makes the next spare; the taken one is not among them.
	next := spareIDs(t, p, sandbox.CreateOptions{}, 1)
	if slices.Contains(next, spare) {
		t.Fatal("a taken sandbox is a spare again")
	}
	// A private workspace (a volume as root) is attached the same way.
	sb2 := create(t, p, sandbox.CreateOptions{})
	if sb2.ID() != next[0] {
		t.Fatalf("Create made %s; the spare was %s", sb2.ID(), next[0])
	}
	if got := out(t, sb2, "ls -A | wc -l; echo x > f && cat f"); got != "0\nx" {
		t.Fatalf("a private workspace in a spare: %q", got)
	}
	// As a sandbox started on its workspace: its mountinfo names no host path.
	if got := out(t, sb2, `grep -c -E '/tmp/|/var/tmp|/root|/work|toolhost-' /proc/self/mountinfo || true`); got != "0" {
		t.Errorf("mountinfo of a taken spare names a host path: %s", out(t, sb2, "cat /proc/self/mountinfo"))
	}
	// Closed, the taken sandbox leaves nothing: its slot is gone.
	if err := sb2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(p.wsDir, slotsDir, slotPrefix+sb2.ID())); err == nil {
		t.Error("the slot of a closed sandbox is still there")
	}
}

// A host directory attached to a spare keeps its owners, as on a sandbox started on it:
// the idmapped mount is what the slot shows. Files the sandbox makes are the directory
// owner's; nothing is re-owned.
func TestPoolHostDirOwnersKept(t *testing.T) {
	p := newPooled(t, Config{})
	spare := spareIDs(t, p, sandbox.CreateOptions{}, 1)[0]
	dir := t.TempDir()
	before := ownedTree(t, dir)
	sb := create(t, p, sandbox.CreateOptions{Workspace: dir})
	if sb.ID() != spare {
		t.Fatalf("Create made %s; the spare was %s", sb.ID(), spare)
	}
	if !sb.ws.idmap {
		t.Fatal("the host directory was not staged through an idmapped mount")
	}
	if got := out(t, sb, "echo more >> a.txt; echo new > new.txt; mkdir d; stat -c %u a.txt new.txt d other.txt"); got != "1000\n1000\n1000\n65534" {
		t.Fatalf("owners inside the taken spare: %q", got)
	}
	for name, e := range before {
		if now := lstat(t, name); now != e {
			t.Errorf("%s changed: %+v -> %+v", name, e, now)
		}
	}
	for _, name := range []string{"new.txt", "d"} {
		var st syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(dir, name), &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != ownerID || st.Gid != ownerID {
			t.Errorf("%s made by the taken spare belongs to %d:%d on the host, want the directory owner's %d", name, st.Uid, st.Gid, ownerID)
		}
	}
}

// A spare made for one egress policy is never given to a sandbox with another: each
// session's egress (its gateway and policy) is a configuration of its own. The sandbox of
// the other policy starts afresh and is held to that policy; the spare goes to its own.
func TestPoolEgressPolicyKeyed(t *testing.T) {
	e := newEgressNet(t)
	p := newPooled(t, Config{})
	_, optsA := e.session(t, egress.Spec{Allow: []string{"registry.test"}}, egress.SessionConfig{})
	_, optsB := e.session(t, egress.Spec{Allow: []string{"other.test"}}, egress.SessionConfig{})
	_, optsA2 := e.session(t, egress.Spec{Allow: []string{"registry.test"}}, egress.SessionConfig{})
	if keyOf(optsA) == keyOf(optsB) || keyOf(optsA) == keyOf(optsA2) || keyOf(optsA) == keyOf(sandbox.CreateOptions{}) {
		t.Fatal("two egress values share a pool key")
	}
	p.Warm(optsA)
	spare := spareIDs(t, p, optsA, 1)[0]
	for name, opts := range map[string]sandbox.CreateOptions{"another policy": optsB, "the same policy of another session": optsA2} {
		sb := create(t, p, opts)
		if sb.ID() == spare {
			t.Fatalf("%s was given the spare made for policy A", name)
		}
	}
	sbB := create(t, p, optsB)
	if res := run(t, sbB, "b", "curl -sS --max-time 60 http://registry.test/hello"); strings.Contains(string(res.Stdout), "hello from") {
		t.Errorf("a sandbox of policy B reached registry.test: %q", res.Stdout)
	}
	sbA := create(t, p, optsA)
	if sbA.ID() != spare {
		t.Fatalf("policy A's Create made %s; its spare was %s", sbA.ID(), spare)
	}
	if res := run(t, sbA, "a", "curl -sS --max-time 60 http://registry.test/hello"); string(res.Stdout) != "hello from registry.test" {
		t.Errorf("the taken spare of policy A: %q %q", res.Stdout, res.Stderr)
	}
	if res := run(t, sbA, "a2", "curl -sS --max-time 60 http://other.test/hello"); strings.Contains(string(res.Stdout), "hello from") {
		t.Errorf("the taken spare of policy A reached other.test: %q", res.Stdout)
	}
	// A closing session's configuration is dropped with its spares.
	spareIDs(t, p, optsA, 1)
	p.Unwarm(optsA)
	p.pool.mu.Lock()
	left := len(p.pool.spares[keyOf(template(optsA))])
	p.pool.mu.Unlock()
	if left != 0 {
		t.Errorf("%d spares of an unwarmed configuration kept", left)
	}
}

// Handoff to a spare: the old sandbox ends, the workspace moves with every file, and no
// process of the old one is left.
func TestPoolHandoff(t *testing.T) {
	p := newPooled(t, Config{})
	ctx := context.Background()
	old := create(t, p, sandbox.CreateOptions{})
	out(t, old, "echo kept > kept.txt")
	if _, err := old.Start(ctx, sandbox.ExecRequest{Argv: []string{"sleep", "600"}}); err != nil {
		t.Fatal(err)
	}
	spare := spareIDs(t, p, sandbox.CreateOptions{}, 1)[0]
	next, err := p.Handoff(ctx, old, sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { next.Close(context.Background()) })
	if next.ID() != spare {
		t.Fatalf("the handoff went to %s; the spare was %s", next.ID(), spare)
	}
	if got := out(t, next, "cat kept.txt; pgrep -c sleep || true"); got != "kept\n0" {
		t.Fatalf("after the handoff: %q", got)
	}
	if _, err := old.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err == nil {
		t.Fatal("the old sandbox still runs commands after the handoff")
	}
	// Handed on again (the next spare): the workspace leaves the slot it was on.
	spareIDs(t, p, sandbox.CreateOptions{}, 1)
	third, err := p.Handoff(ctx, next, sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { third.Close(context.Background()) })
	if got := out(t, third, "cat kept.txt"); got != "kept" {
		t.Fatalf("after the second handoff: %q", got)
	}
}

// Close drains the pool: no spare's process, slot or cgroup stays.
func TestPoolDrainedOnClose(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Skipf(t, "spare sandboxes need root (the host mounts each workspace for its sandbox)")
	}
	testenv.NeedBwrap(t)
	p, err := New(Config{RunDir: testenv.RunDir(t), Pool: 2})
	if err != nil {
		t.Fatal(err)
	}
	p.Warm(sandbox.CreateOptions{})
	p.Warm(sandbox.CreateOptions{Network: sandbox.NetworkHost})
	ids := append(spareIDs(t, p, sandbox.CreateOptions{}, 2), spareIDs(t, p, sandbox.CreateOptions{Network: sandbox.NetworkHost}, 1)...)
	var pids []int
	p.pool.mu.Lock()
	for _, ss := range p.pool.spares {
		for _, s := range ss {
			pids = append(pids, s.cmd.Process.Pid, s.initPID)
		}
	}
	p.pool.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil && !strings.Contains(string(b), ") Z ") {
			t.Errorf("spare process %d still runs after Close", pid)
		}
	}
	for _, id := range ids {
		if _, err := os.Stat(filepath.Join(p.wsDir, slotsDir, slotPrefix+id)); err == nil {
			t.Errorf("the slot of spare %s is still there after Close", id)
		}
		if _, err := os.Stat(filepath.Join(p.sbDir, id)); err == nil {
			t.Errorf("the run dir of spare %s is still there after Close", id)
		}
	}
}

// prune removes a slot a dead process left (its lock file free) and never one a live
// process holds.
func TestPoolPruneSlots(t *testing.T) {
	p := newPooled(t, Config{})
	live := spareIDs(t, p, sandbox.CreateOptions{}, 1)[0]
	dir := filepath.Join(p.wsDir, slotsDir)
	// A dead process's slot: a mounted tmpfs and a lock file nobody holds.
	dead := filepath.Join(dir, slotPrefix+"local-deadbeef0000")
	if err := os.Mkdir(dead, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("none", dead, "tmpfs", 0, "size=4k"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dead, syscall.MNT_DETACH); _ = os.Remove(dead) })
	l, err := lockfile.Create(dead+lockSuffix, []byte("slot"))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(); err != nil { // the process "died": its lock is free, its file stays
		t.Fatal(err)
	}
	p.pruneSlots()
	if _, err := os.Stat(dead); err == nil {
		t.Error("a dead process's slot was not removed")
	}
	if _, err := os.Stat(dead + lockSuffix); err == nil {
		t.Error("a dead process's slot lock file was not removed")
	}
	if _, err := os.Stat(filepath.Join(dir, slotPrefix+live)); err != nil {
		t.Errorf("prune removed a live spare's slot: %v", err)
	}
	sb := create(t, p, sandbox.CreateOptions{})
	if sb.ID() != live {
		t.Fatalf("Create made %s; the spare was %s", sb.ID(), live)
	}
	if got := out(t, sb, "echo ok"); got != "ok" {
		t.Fatalf("the spare after a prune: %q", got)
	}
}

// The conformance suite with spares: its parts create sandboxes in parallel, some taken
// from the pool, some started; every part holds either way.
func TestConformancePooled(t *testing.T) {
	sandboxtest.Run(t, newPooled(t, Config{}))
}

// The maker may ask for the next configuration after close took the spares away (seen
// under make test at load 12: "assignment to entry in nil map"): it gets none and stops.
func TestPoolNextAfterClose(t *testing.T) {
	sp := &sparePool{size: 1, spares: map[poolKey][]*Sandbox{}}
	sp.configs = append(sp.configs, template(sandbox.CreateOptions{}))
	if _, ok := sp.next(); !ok {
		t.Fatal("an open pool without spares has nothing to make")
	}
	sp.mu.Lock()
	sp.closed, sp.spares = true, nil // what close does before it stops the maker
	sp.mu.Unlock()
	if opts, ok := sp.next(); ok {
		t.Fatalf("a closed pool asks for a spare of %+v", opts)
	}
}
