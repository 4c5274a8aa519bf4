//go:build linux

package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ErrClosed: the group was closed.
var ErrClosed = errors.New("cgroup is closed")

// Group is the control group of one sandbox, present in every tree its Manager uses. Its
// methods are safe for concurrent use; Kill and Close hold the group while they wait.
type Group struct {
	m   *Manager
	id  string // as given to Create
	dir string // directory name in every tree: <id>@<pid>.<start>

	mu     sync.Mutex
	v2     string  // directory in the v2 tree; "" when none (or removed)
	v2fd   int     // open v2 directory for CLONE_INTO_CGROUP; -1 when none
	v1     []v1dir // directories in the v1 hierarchies (removed ones dropped)
	closed bool
}

type v1dir struct {
	h   *hierarchy
	dir string
}

// Create makes the group of sandbox id (letters, digits, '-', '_', '.'; unique among
// this Manager's live groups) and writes its limits. A resource that Support reports as
// unenforced is left unlimited; Create fails with ErrUnavailable only when no cgroup tree
// is usable at all, and otherwise only when the kernel refuses a limit.
func (m *Manager) Create(id string, l Limits) (*Group, error) {
	if !validName(id) || strings.Contains(id, "@") {
		return nil, fmt.Errorf("create cgroup: invalid id %q (letters, digits, '-', '_', '.')", id)
	}
	if err := l.validate(); err != nil {
		return nil, fmt.Errorf("create cgroup %s: %w", id, err)
	}
	if m.v2 == "" && len(m.hier) == 0 {
		return nil, fmt.Errorf("create cgroup %s: %w (%s)", id, ErrUnavailable, m.support)
	}
	g := &Group{m: m, id: id, dir: id + "@" + m.self.String(), v2fd: -1}
	if err := g.create(l); err != nil {
		g.closeFD()
		// Fresh and empty: the directories go at once.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if rerr := g.removeDirs(ctx); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return nil, fmt.Errorf("create cgroup %s: %w", id, err)
	}
	return g, nil
}

func (g *Group) create(l Limits) error {
	m := g.m
	if m.v2 != "" {
		d := m.v2 + "/" + g.dir
		if err := m.fs.mkdir(d); err != nil {
			return err
		}
		g.v2 = d
	}
	for _, h := range m.hier {
		// Only the hierarchies a limit (or the kill) needs: every one a group lives in
		// costs Start a thread migration in and out, and a v1 migration waits for an RCU
		// grace period (milliseconds on a busy host).
		if !(h == m.mem && l.MemoryBytes > 0 || h == m.pids && l.Pids > 0 || h == m.cpu && l.CPUs > 0 || h == m.freez) {
			continue
		}
		d := h.dir + "/" + g.dir
		if err := m.fs.mkdir(d); err != nil {
			return err
		}
		g.v1 = append(g.v1, v1dir{h: h, dir: d})
	}
	var errs []error
	set := func(dir, file, val string) {
		if err := m.fs.writeFile(dir+"/"+file, val); err != nil {
			errs = append(errs, fmt.Errorf("set %s to %s: %w", file, val, err))
		}
	}
	mem, pids := strconv.FormatInt(l.MemoryBytes, 10), strconv.FormatInt(l.Pids, 10)
	if m.v2Mem && l.MemoryBytes > 0 {
		set(g.v2, "memory.max", mem)
		if m.fs.exists(g.v2 + "/memory.swap.max") { // absent without swap accounting
			set(g.v2, "memory.swap.max", "0")
		}
	}
	if m.v2Pids && l.Pids > 0 {
		set(g.v2, "pids.max", pids)
	}
	if m.v2CPU && l.CPUs > 0 {
		set(g.v2, "cpu.max", fmt.Sprintf("%d %d", l.cpuQuota(), cpuPeriod))
	}
	if d := g.v1dirOf(m.mem); d != "" {
		// A new v1 memory group inherits oom_kill_disable from its parent: turn the OOM
		// killer on explicitly, or a group past its limit would hang instead.
		set(d, "memory.oom_control", "0")
		if l.MemoryBytes > 0 {
			set(d, "memory.limit_in_bytes", mem)
			if m.memsw {
				set(d, "memory.memsw.limit_in_bytes", mem)
			} else {
				set(d, "memory.swappiness", "0")
			}
		}
	}
	if d := g.v1dirOf(m.pids); d != "" && l.Pids > 0 {
		set(d, "pids.max", pids)
	}
	if d := g.v1dirOf(m.cpu); d != "" && l.CPUs > 0 {
		set(d, "cpu.cfs_period_us", strconv.Itoa(cpuPeriod))
		set(d, "cpu.cfs_quota_us", strconv.FormatInt(l.cpuQuota(), 10))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if g.v2 != "" {
		fd, err := unix.Open(g.v2, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s: %w", g.v2, err)
		}
		g.v2fd = fd
	}
	return nil
}

// v1dirOf is the group's directory in hierarchy h, or "" when h is nil.
func (g *Group) v1dirOf(h *hierarchy) string {
	for _, d := range g.v1 {
		if d.h == h {
			return d.dir
		}
	}
	return ""
}

// ID is the id given to Create.
func (g *Group) ID() string { return g.id }

// CgroupFD returns an open descriptor of the group's cgroup v2 directory, for
// syscall.SysProcAttr.CgroupFD with UseCgroupFD (the child is cloned straight into the
// group), and true; false when the group has no v2 directory. The descriptor belongs to
// the group and is valid until Close. On a hybrid host the v2 directory carries no limit:
// prefer Start, which also places the child in the v1 hierarchies.
func (g *Group) CgroupFD() (int, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.v2fd, g.v2fd >= 0
}

// Start starts cmd with its process inside the group in every tree from its first
// instruction, so nothing it forks can escape: on v2 through clone3's CLONE_INTO_CGROUP
// (it sets cmd.SysProcAttr.UseCgroupFD and CgroupFD, keeping the other fields), on v1 by
// forking from a thread that joins the group's v1 hierarchies for the duration of the
// fork and returns to its own cgroups right after. The fork happens on the calling
// goroutine's thread, so a caller that locked its OS thread for Pdeathsig keeps the
// guarantee. The thread briefly counts against the group's pids limit and runs under its
// CPU quota while it forks. The v1 moves cost a fraction of a millisecond (each write
// to a v1 tasks file migrates the thread); v2 adds nothing.
func (g *Group) Start(cmd *exec.Cmd) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return fmt.Errorf("start %s in cgroup %s: %w", cmd.Path, g.id, ErrClosed)
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	if g.v2fd >= 0 {
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = g.v2fd
	}
	if len(g.v1) == 0 {
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start %s in cgroup %s: %w", cmd.Path, g.id, err)
		}
		return nil
	}

	runtime.LockOSThread() // nests with a lock the caller holds
	home, err := g.threadHome()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("start %s in cgroup %s: %w", cmd.Path, g.id, err)
	}
	// While this thread is in the group, v1 lists the host's pid in the group's
	// cgroup.procs. Kill cannot run meanwhile (it takes g.mu), and its membership check
	// reads /proc/PID/cgroup, the main thread's view, so it would not signal the host
	// anyway.
	// "0" names the writing thread: the kernel then moves it without taking the global
	// threadgroup rwsem for writing, whose first taking after a quiet spell waits for an
	// RCU grace period (4-22 ms a create at load 10-15 with the tid written, 0.15-0.3 ms
	// with "0"; docs/BENCHMARKS.md). The thread is this goroutine's own, locked, so it
	// cannot exit or exec meanwhile.
	const tid = "0"
	moved := 0
	for _, d := range g.v1 {
		if err = g.m.fs.writeFile(d.dir+"/tasks", tid); err != nil {
			err = fmt.Errorf("move the forking thread into %s: %w", d.dir, err)
			break
		}
		moved++
	}
	if err == nil {
		err = cmd.Start()
	}
	for _, f := range home[:moved] {
		if berr := g.m.fs.writeFile(f, tid); berr != nil {
			// Leave the thread locked: it must not run other goroutines from inside the
			// sandbox's group, and the runtime ends a locked thread with its goroutine.
			g.m.log.Error("a host thread could not leave a sandbox's cgroup", "group", g.id, "tid", unix.Gettid(), "err", berr)
			return fmt.Errorf("start %s in cgroup %s: %w", cmd.Path, g.id, errors.Join(err, fmt.Errorf("return the forking thread to %s: %w", f, berr)))
		}
	}
	runtime.UnlockOSThread()
	if err != nil {
		return fmt.Errorf("start %s in cgroup %s: %w", cmd.Path, g.id, err)
	}
	return nil
}

// threadHome returns, for each of the group's v1 hierarchies in order, the tasks file of
// the cgroup the calling (locked) thread is in now.
func (g *Group) threadHome() ([]string, error) {
	b, err := os.ReadFile("/proc/thread-self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("read the thread's cgroups: %w", err)
	}
	own := parseSelfCgroup(b)
	var home []string
	for _, d := range g.v1 {
		dir, err := d.h.mount.below(own.v1[d.h.ctrl])
		if err != nil {
			return nil, fmt.Errorf("v1 %s: %w", d.h.ctrl, err)
		}
		home = append(home, dir+"/tasks")
	}
	return home, nil
}

// Add moves a running process (all its threads) into the group in every tree. Its
// children forked before the move stay where they are: start processes with Start.
func (g *Group) Add(pid int) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return fmt.Errorf("add process %d to cgroup %s: %w", pid, g.id, ErrClosed)
	}
	p := strconv.Itoa(pid)
	// v1 first, so the limits hold before the process is visible to cgroup.kill.
	for _, d := range g.v1 {
		if err := g.m.fs.writeFile(d.dir+"/cgroup.procs", p); err != nil {
			return fmt.Errorf("add process %d to cgroup %s: %w", pid, g.id, err)
		}
	}
	if g.v2 != "" {
		if err := g.m.fs.writeFile(g.v2+"/cgroup.procs", p); err != nil {
			return fmt.Errorf("add process %d to cgroup %s: %w", pid, g.id, err)
		}
	}
	return nil
}

// Stats is a reading of a group's counters. A field whose resource Support reports as
// unenforced reads zero.
type Stats struct {
	// MemoryCurrent is the memory charged to the group now, in bytes; MemoryPeak the most
	// it held since it was created (zero on v2 kernels before 5.19).
	MemoryCurrent, MemoryPeak int64
	// OOMKills counts processes of the group the OOM killer killed because the group
	// reached its memory limit. Compare readings taken before and after a command to tell
	// that the command was killed for memory.
	OOMKills int64
	// Pids is the number of processes and threads in the group now.
	Pids int64
	// PidsRefused counts forks refused because the group reached its pids limit.
	PidsRefused int64
}

// Stats reads the group's counters.
func (g *Group) Stats() (Stats, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	var s Stats
	if g.closed {
		return s, fmt.Errorf("read cgroup %s: %w", g.id, ErrClosed)
	}
	m := g.m
	var errs []error
	num := func(dir, file string, dst *int64) {
		b, err := m.fs.readFile(dir + "/" + file)
		if err == nil {
			*dst, err = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	key := func(dir, file, k string, dst *int64) {
		if err := m.readKey(path.Join(dir, file), k, dst); err != nil {
			errs = append(errs, err)
		}
	}
	switch {
	case m.v2Mem && g.v2 != "":
		num(g.v2, "memory.current", &s.MemoryCurrent)
		num(g.v2, "memory.peak", &s.MemoryPeak)
	case g.v1dirOf(m.mem) != "":
		d := g.v1dirOf(m.mem)
		num(d, "memory.usage_in_bytes", &s.MemoryCurrent)
		num(d, "memory.max_usage_in_bytes", &s.MemoryPeak)
	}
	if f := g.oomFile(); f != "" {
		key(f, "", "oom_kill", &s.OOMKills)
	}
	switch {
	case m.v2Pids && g.v2 != "":
		num(g.v2, "pids.current", &s.Pids)
		key(g.v2, "pids.events", "max", &s.PidsRefused)
	case g.v1dirOf(m.pids) != "":
		d := g.v1dirOf(m.pids)
		num(d, "pids.current", &s.Pids)
		key(d, "pids.events", "max", &s.PidsRefused)
	}
	if err := errors.Join(errs...); err != nil {
		return s, fmt.Errorf("read cgroup %s: %w", g.id, err)
	}
	return s, nil
}

// OOMKills is Stats' OOMKills alone: one file read instead of Stats' five, for a
// caller that reads it around every command (the local provider's Exec); 0 when the
// group has no memory controller.
func (g *Group) OOMKills() (int64, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return 0, fmt.Errorf("read cgroup %s: %w", g.id, ErrClosed)
	}
	var n int64
	if f := g.oomFile(); f != "" {
		if err := g.m.readKey(f, "oom_kill", &n); err != nil {
			return 0, fmt.Errorf("read cgroup %s: %w", g.id, err)
		}
	}
	return n, nil
}

// oomFile is the file that counts the group's OOM kills (a "oom_kill N" line), or "".
// g.mu is held.
func (g *Group) oomFile() string {
	switch {
	case g.m.v2Mem && g.v2 != "":
		return g.v2 + "/memory.events"
	case g.v1dirOf(g.m.mem) != "":
		return g.v1dirOf(g.m.mem) + "/memory.oom_control"
	}
	return ""
}

// readKey reads the value of the line "k N" of a flat-keyed cgroup file into dst; dst is
// left alone when no line has k.
func (m *Manager) readKey(file, k string, dst *int64) error {
	b, err := m.fs.readFile(file)
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, k+" "); ok {
			if *dst, err = strconv.ParseInt(strings.TrimSpace(v), 10, 64); err != nil {
				return fmt.Errorf("parse %s in %s: %w", k, file, err)
			}
			return nil
		}
	}
	return nil
}

// Procs lists the processes in the group (the union over its trees).
func (g *Group) Procs() ([]int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.procs()
}

func (g *Group) procs() ([]int, error) {
	var pids []int
	read := func(dir string) error {
		b, err := g.m.fs.readFile(dir + "/cgroup.procs")
		if err != nil {
			return err
		}
		for _, f := range strings.Fields(string(b)) {
			if p, err := strconv.Atoi(f); err == nil && !slices.Contains(pids, p) {
				pids = append(pids, p)
			}
		}
		return nil
	}
	if g.v2 != "" {
		if err := read(g.v2); err != nil {
			return nil, err
		}
	}
	for _, d := range g.v1 {
		if err := read(d.dir); err != nil {
			return nil, err
		}
	}
	return pids, nil
}

// Kill sends SIGKILL to every process in the group and waits until the group is empty
// or ctx ends. On v2 it writes cgroup.kill, which also kills what forks meanwhile; on v1
// it freezes the group first when the freezer hierarchy is mounted, so nothing forks
// between the listing and the signals, and repeats until the group is empty. Each
// signal goes through a pidfd and only after checking that the pid still belongs to the
// group, so a recycled pid is never hit.
func (g *Group) Kill(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	return g.kill(ctx)
}

func (g *Group) kill(ctx context.Context) error {
	useKill := g.v2 != "" && g.m.v2Kill
	delay := 500 * time.Microsecond
	for round := 0; ; round++ {
		pids, err := g.procs()
		if err != nil {
			return fmt.Errorf("kill cgroup %s: %w", g.id, err)
		}
		if len(pids) == 0 {
			return nil
		}
		switch {
		case useKill:
			if err := g.m.fs.writeFile(g.v2+"/cgroup.kill", "1"); err != nil {
				return fmt.Errorf("kill cgroup %s: %w", g.id, err)
			}
			if round > 0 { // stragglers, such as processes added to the v1 hierarchies only
				for _, p := range pids {
					g.signal(p)
				}
			}
		default:
			if err := g.freezeAndSignal(ctx, pids); err != nil {
				return fmt.Errorf("kill cgroup %s: %w", g.id, err)
			}
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("kill cgroup %s: %d processes left (%v): %w", g.id, len(pids), pids, ctx.Err())
		case <-t.C:
		}
		delay = min(2*delay, 20*time.Millisecond)
	}
}

// ErrNoFreezer: the group can be neither frozen through cgroup v2 (cgroup.freeze, Linux
// 5.2 and later) nor through a v1 freezer hierarchy.
var ErrNoFreezer = errors.New("no cgroup freezer for the group")

// Freeze stops every process in the group, and every process that joins it later, and
// returns once all of them are stopped, or with an error once ctx ends (the group stays
// freezing then: Kill or Close it). A frozen process is stopped where it would take a
// signal, never inside a system call, and runs no further instruction unless thawed: Kill
// and Close end a frozen group, whose processes die without running again. A group is
// frozen to be killed (a sandbox handing its workspace to the next one stops first and
// dies after, outside the caller's wait); Thaw is for what the caller trusts. It fails
// with ErrNoFreezer when the group has neither a v2 directory with cgroup.freeze nor a
// directory in the v1 freezer hierarchy.
func (g *Group) Freeze(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return fmt.Errorf("freeze cgroup %s: %w", g.id, ErrClosed)
	}
	var file, want string
	switch fz := g.v1dirOf(g.m.freez); {
	case g.v2 != "" && g.m.fs.exists(g.v2+"/cgroup.freeze"):
		if err := g.m.fs.writeFile(g.v2+"/cgroup.freeze", "1"); err != nil {
			return fmt.Errorf("freeze cgroup %s: %w", g.id, err)
		}
		file, want = g.v2+"/cgroup.events", "frozen 1"
	case fz != "":
		if err := g.m.fs.writeFile(fz+"/freezer.state", "FROZEN"); err != nil {
			return fmt.Errorf("freeze cgroup %s: %w", g.id, err)
		}
		file, want = fz+"/freezer.state", "FROZEN"
	default:
		return fmt.Errorf("freeze cgroup %s: %w", g.id, ErrNoFreezer)
	}
	// The kernel stops each task at its next safe point; one in an uninterruptible sleep
	// (a slow disk) holds the group freezing until its system call returns.
	for d := 50 * time.Microsecond; ; d = min(2*d, 5*time.Millisecond) {
		b, err := g.m.fs.readFile(file)
		if err != nil {
			return fmt.Errorf("freeze cgroup %s: %w", g.id, err)
		}
		if slices.Contains(strings.Split(string(b), "\n"), want) {
			return nil
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("freeze cgroup %s: not every process stopped: %w", g.id, ctx.Err())
		case <-t.C:
		}
	}
}

// Thaw lets the processes of a frozen group run again. It is for the processes a caller
// trusts: a sandbox's own killed init, say, has to be reaped by a parent in the group.
func (g *Group) Thaw() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return fmt.Errorf("thaw cgroup %s: %w", g.id, ErrClosed)
	}
	var errs []error
	if g.v2 != "" && g.m.fs.exists(g.v2+"/cgroup.freeze") {
		errs = append(errs, g.m.fs.writeFile(g.v2+"/cgroup.freeze", "0"))
	}
	if fz := g.v1dirOf(g.m.freez); fz != "" {
		errs = append(errs, g.m.fs.writeFile(fz+"/freezer.state", "THAWED"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("thaw cgroup %s: %w", g.id, err)
	}
	return nil
}

// freezeAndSignal signals every process in the group, with the group frozen when the v1
// freezer is there: frozen processes cannot fork or exit, so the listing is complete and
// no pid can be recycled before its signal. They die when thawed.
func (g *Group) freezeAndSignal(ctx context.Context, pids []int) error {
	fz := g.v1dirOf(g.m.freez)
	if fz == "" {
		for _, p := range pids {
			g.signal(p)
		}
		return nil
	}
	if err := g.m.fs.writeFile(fz+"/freezer.state", "FROZEN"); err != nil {
		return err
	}
	defer func() {
		if err := g.m.fs.writeFile(fz+"/freezer.state", "THAWED"); err != nil {
			g.m.log.Error("thaw a cgroup after killing its processes", "group", g.id, "err", err)
		}
	}()
	// Freezing waits for each task to reach a safe point; one stuck in an uninterruptible
	// sleep can hold it in FREEZING. Give it a moment, then signal anyway: the next round
	// catches what forked.
	deadline := time.Now().Add(100 * time.Millisecond)
	for d := 100 * time.Microsecond; ; d = min(2*d, 5*time.Millisecond) {
		b, err := g.m.fs.readFile(fz + "/freezer.state")
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(b)) == "FROZEN" || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(d)
	}
	pids, err := g.procs()
	if err != nil {
		return err
	}
	for _, p := range pids {
		g.signal(p)
	}
	return nil
}

// signal sends SIGKILL to pid if it is still in the group. Errors mean the process is
// gone or not ours; the caller's loop sees what remains.
func (g *Group) signal(pid int) {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ENOSYS) { // before Linux 5.3: a plain kill after the check
		if g.member(pid) {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		return
	}
	if err != nil {
		return
	}
	defer unix.Close(fd)
	// The pidfd pins the process: if it is in the group now, the signal reaches it.
	if g.member(pid) {
		_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
	}
}

// member reports whether pid is in the group in some tree.
func (g *Group) member(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasSuffix(line, "/"+g.dir) {
			return true
		}
	}
	return false
}

// Close kills every process in the group (Kill) and removes its directories, retrying
// while the kernel still reports a directory busy (a v1 memory group can, for a moment
// after its last process exits), until ctx ends. Close after a successful Close is a
// no-op; after a failed one it retries what is left.
func (g *Group) Close(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	kerr := g.kill(ctx)
	rerr := g.removeDirs(ctx)
	if err := errors.Join(kerr, rerr); err != nil {
		return fmt.Errorf("close cgroup %s: %w", g.id, err)
	}
	g.closeFD()
	g.closed = true
	return nil
}

func (g *Group) closeFD() {
	if g.v2fd >= 0 {
		_ = unix.Close(g.v2fd)
		g.v2fd = -1
	}
}

// removeDirs removes the group's directories, dropping each from the group once gone.
func (g *Group) removeDirs(ctx context.Context) error {
	var errs []error
	if g.v2 != "" {
		if err := g.rmdir(ctx, g.v2); err != nil {
			errs = append(errs, err)
		} else {
			g.v2 = ""
		}
	}
	g.v1 = slices.DeleteFunc(g.v1, func(d v1dir) bool {
		err := g.rmdir(ctx, d.dir)
		if err != nil {
			errs = append(errs, err)
		}
		return err == nil
	})
	return errors.Join(errs...)
}

func (g *Group) rmdir(ctx context.Context, dir string) error {
	for d := 200 * time.Microsecond; ; d = min(2*d, 20*time.Millisecond) {
		err := g.m.fs.rmdir(dir)
		if err == nil || errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) {
			return err
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (still busy when %v)", err, ctx.Err())
		case <-t.C:
		}
	}
}
