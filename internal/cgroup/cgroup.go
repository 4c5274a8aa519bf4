//go:build linux

// Package cgroup gives every sandbox of the local provider a control group of its own:
// limits on memory (tmpfs pages included, as the kernel charges them to the group), on
// processes and threads, and on CPU time, a count of what the limits refused, and a kill
// that reaches every process the sandbox started however it tried to escape its tree.
//
// Hosts differ, so the mechanism is chosen per resource when a Manager opens, and the
// choice is reported rather than assumed (Support): cgroup v2 where this process may
// create groups in a cgroup2 tree and enable the controller for them (a systemd unit with
// Delegate=yes, a container with its own cgroup namespace, root on a unified host); the
// v1 hierarchy of the controller where that is what the host has; otherwise nothing, with
// the reason. Hybrid hosts mount both: controllers live on v1 and an empty cgroup2 tree
// sits at /sys/fs/cgroup/unified. A group then lives in both trees, the v1 hierarchies
// enforcing the limits and the v2 tree giving cgroup.kill and CLONE_INTO_CGROUP. A
// missing controller never makes Open fail: the host runs with the limits it has and
// says which ones it lacks.
//
// Groups are directories "<own cgroup>/<name>/<id>@<pid>.<start>" in every tree used,
// where <own cgroup> is this process's cgroup in that tree (/proc/self/cgroup) and
// <pid>.<start> identifies the process that created the group for as long as it lives
// (pid and start time, so a recycled pid does not count). Prune uses that to remove the
// groups of a host process that died without closing them.
//
// cgroup v2 forbids processes in a cgroup that enables controllers for its children
// (the "no internal processes" rule; the root is exempt). systemd's delegation contract
// expects the delegated process to move itself into a leaf of its own cgroup before it
// enables controllers there; Open does exactly that when it must, moving this process
// (and only this one: when other processes share the cgroup, Open reports why v2 cannot
// be used instead of moving them) into "<own cgroup>/<name>-host", then enables the
// controllers in "<own cgroup>" and "<own cgroup>/<name>". Run the host as a unit with
// Delegate=yes: root can do the same in a unit without it, but systemd considers such a
// cgroup its own and may undo the change.
//
// A process must be inside its group before it can fork, or its children escape. Start
// does that: on v2 the child is cloned straight into the group (clone3 with
// CLONE_INTO_CGROUP); on v1, where there is no such flag, the forking thread itself joins
// the group's v1 hierarchies for the duration of the fork (v1 places threads, and a child
// starts in the cgroups of the thread that forked it) and returns to its own cgroups
// right after.
//
// Past its memory limit a group loses the process the kernel's OOM killer picks inside
// the group, never a process of the host: the OOM killer stays on, swap cannot extend the
// limit (v1 memory.memsw.limit_in_bytes equal to it, v2 memory.swap.max 0), and
// memory.oom.group stays off so that the rest of the sandbox survives. Stats.OOMKills
// tells the caller that it happened.
package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// ErrUnavailable: no cgroup tree is usable here at all; Support says why. Create returns
// it; callers run the sandbox without a group (rlimits remain the floor).
var ErrUnavailable = errors.New("no cgroup hierarchy is usable")

// Limits for one group. A zero field leaves that resource unlimited.
type Limits struct {
	// MemoryBytes caps the group's memory: anonymous memory, page cache and tmpfs pages
	// (shared memory included), and kernel memory charged to it. Swap does not extend it.
	MemoryBytes int64
	// Pids caps the number of processes and threads in the group; forks past it fail
	// with EAGAIN inside the group.
	Pids int64
	// CPUs caps CPU time at that many CPUs' worth per period (1.5 = one and a half
	// cores), whatever the number of cores.
	CPUs float64
}

// DefaultLimits are the per-sandbox defaults of issue 7: 2 GiB of memory, 512 processes
// and threads, CPU unlimited (all cores).
func DefaultLimits() Limits { return Limits{MemoryBytes: 2 << 30, Pids: 512} }

func (l Limits) validate() error {
	switch {
	case l.MemoryBytes < 0:
		return fmt.Errorf("memory limit %d is negative", l.MemoryBytes)
	case l.Pids < 0:
		return fmt.Errorf("pids limit %d is negative", l.Pids)
	case l.CPUs < 0 || l.CPUs != l.CPUs || l.CPUs > 1<<20:
		return fmt.Errorf("cpu limit %v is not a number of CPUs", l.CPUs)
	}
	return nil
}

// cpuPeriod is the CFS period in microseconds; the quota is CPUs times it.
const cpuPeriod = 100000

func (l Limits) cpuQuota() int64 {
	q := int64(l.CPUs * cpuPeriod)
	return max(q, 1000) // the kernel's minimum quota is 1 ms
}

// Mechanism says what enforces one resource's limit.
type Mechanism struct {
	// By names the mechanism ("cgroup v2", "cgroup v1 memory"); empty when nothing
	// enforces the resource.
	By string
	// Why says, when By is empty, why nothing does ("no pids hierarchy mounted").
	Why string
}

// OK reports whether the resource is enforced.
func (m Mechanism) OK() bool { return m.By != "" }

// String is By, or "none (Why)".
func (m Mechanism) String() string {
	if m.By != "" {
		return m.By
	}
	return "none (" + m.Why + ")"
}

// Support reports, per resource, the mechanism a Manager uses or why there is none.
type Support struct {
	Memory, Pids, CPU Mechanism
	// Kill is how Group.Kill stops every process of a group: "cgroup v2 cgroup.kill",
	// "cgroup v1 freezer and SIGKILL", or "SIGKILL to cgroup.procs" (processes forked
	// between two rounds are caught by the next).
	Kill Mechanism
}

// String reads well in a log line or a doctor report:
// "memory: cgroup v1 memory+memsw; pids: cgroup v1 pids; cpu: cgroup v1 cpu; kill: cgroup v2 cgroup.kill".
func (s Support) String() string {
	return "memory: " + s.Memory.String() + "; pids: " + s.Pids.String() + "; cpu: " + s.CPU.String() +
		"; kill: " + s.Kill.String()
}

// hierarchy is a cgroup v1 hierarchy groups are created in.
type hierarchy struct {
	ctrl  string // the controller it was chosen for (memory, pids, cpu or freezer)
	mount mount
	dir   string // the manager's directory in it: <own cgroup>/<name>
}

// Manager creates groups under this process's own cgroups. It is safe for concurrent
// use; groups of one Manager are independent of each other.
type Manager struct {
	name string
	log  *slog.Logger
	fs   fileSystem
	self owner

	v2                   string // the manager's directory in the cgroup v2 tree; "" when none
	v2Kill               bool   // v2 groups have cgroup.kill
	v2Mem, v2Pids, v2CPU bool   // the controller is enabled for groups in v2

	hier                  []*hierarchy // every v1 hierarchy a group lives in, by mount point
	mem, pids, cpu, freez *hierarchy   // the v1 hierarchy enforcing each; nil when none (or v2)
	memsw                 bool         // v1 memory.memsw.* exists: swap can be capped

	support Support
}

// env is what Open reads from the system; tests substitute a fake cgroup tree.
type env struct {
	fs         fileSystem
	mountinfo  []byte // /proc/self/mountinfo
	selfCgroup []byte // /proc/self/cgroup
	pid        int
	noV2       bool     // ignore cgroup2 mounts (tests of the pure v1 paths)
	without    []string // ignore these v1 controllers (tests of the fallbacks)
}

// Open prepares a Manager whose groups live under "<own cgroup>/<name>" in every cgroup
// tree this process may use (name is a plain directory name such as "toolhost"). It
// creates those directories, enables controllers on v2 (moving this process into a leaf
// when the v2 rules require it, see the package documentation) and records per resource
// what enforces it. It fails only when /proc cannot be read or name is invalid: a host
// without usable cgroups gets a Manager whose Support says so and whose Create returns
// ErrUnavailable.
func Open(name string, log *slog.Logger) (*Manager, error) {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("open cgroup manager: read mounts: %w", err)
	}
	sc, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("open cgroup manager: read own cgroups: %w", err)
	}
	return open(env{fs: osFS{}, mountinfo: mi, selfCgroup: sc, pid: os.Getpid()}, name, log)
}

func open(e env, name string, log *slog.Logger) (*Manager, error) {
	if !validName(name) || strings.Contains(name, "@") {
		return nil, fmt.Errorf("open cgroup manager: invalid name %q (letters, digits, '-', '_', '.')", name)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	start, err := processStart(e.pid)
	if err != nil {
		return nil, fmt.Errorf("open cgroup manager: start time of process %d: %w", e.pid, err)
	}
	m := &Manager{name: name, log: log, fs: e.fs, self: owner{e.pid, start}}
	mounts := parseMountinfo(e.mountinfo)
	if e.noV2 {
		mounts = slices.DeleteFunc(mounts, func(m mount) bool { return m.v2 })
	}
	for i := range mounts {
		mounts[i].ctrls = slices.DeleteFunc(mounts[i].ctrls, func(c string) bool { return slices.Contains(e.without, c) })
	}
	self := parseSelfCgroup(e.selfCgroup)

	v2why, v2ctrl := m.openV2(mounts, self)
	v1why := map[string]string{}
	for _, c := range []string{"memory", "pids", "cpu", "freezer"} {
		switch {
		case c == "memory" && m.v2Mem, c == "pids" && m.v2Pids, c == "cpu" && m.v2CPU:
			continue
		case c == "freezer" && m.v2Kill:
			continue
		}
		h, why := m.openV1(mounts, self, c)
		if h == nil {
			v1why[c] = why
			continue
		}
		switch c {
		case "memory":
			m.mem = h
			m.memsw = m.fs.exists(h.dir + "/memory.memsw.limit_in_bytes")
		case "pids":
			m.pids = h
		case "cpu":
			m.cpu = h
		case "freezer":
			m.freez = h
		}
	}

	mech := func(ctrl string, onV2 bool, h *hierarchy, by1 string) Mechanism {
		switch {
		case onV2:
			return Mechanism{By: "cgroup v2"}
		case h != nil:
			return Mechanism{By: by1}
		}
		w2 := v2why
		if w2 == "" {
			w2 = v2ctrl[ctrl]
		}
		return Mechanism{Why: combineWhy(w2, v1why[ctrl])}
	}
	memBy := "cgroup v1 memory+memsw"
	if !m.memsw {
		memBy = "cgroup v1 memory (no memsw accounting: swap kept out by swappiness 0)"
	}
	m.support = Support{
		Memory: mech("memory", m.v2Mem, m.mem, memBy),
		Pids:   mech("pids", m.v2Pids, m.pids, "cgroup v1 pids"),
		CPU:    mech("cpu", m.v2CPU, m.cpu, "cgroup v1 cpu"),
	}
	switch {
	case m.v2 != "" && m.v2Kill:
		m.support.Kill = Mechanism{By: "cgroup v2 cgroup.kill"}
	case m.freez != nil:
		m.support.Kill = Mechanism{By: "cgroup v1 freezer and SIGKILL"}
	case m.v2 != "" || len(m.hier) > 0:
		m.support.Kill = Mechanism{By: "SIGKILL to cgroup.procs"}
	default:
		m.support.Kill = Mechanism{Why: combineWhy(v2why, v1why["freezer"])}
	}
	return m, nil
}

// combineWhy joins the reasons v2 and v1 gave, shortening the common case of an
// unprivileged process on a host that delegates nothing.
func combineWhy(v2, v1 string) string {
	if strings.Contains(v2, "permission denied") && strings.Contains(v1, "permission denied") {
		return "not root and no delegated cgroup v2 (" + strings.TrimPrefix(v2, "cgroup v2: ") + ")"
	}
	switch {
	case v2 == "":
		return v1
	case v1 == "":
		return v2
	}
	return v2 + "; " + v1
}

// openV2 sets up the manager's directory in the cgroup v2 tree. It returns why v2 is
// unusable (or ""), and per controller why it cannot be enabled.
func (m *Manager) openV2(mounts []mount, self selfCgroups) (string, map[string]string) {
	ctrlWhy := map[string]string{}
	i := slices.IndexFunc(mounts, func(m mount) bool { return m.v2 })
	if i < 0 {
		return "no cgroup2 filesystem mounted", ctrlWhy
	}
	if self.v2 == "" {
		return "this process has no cgroup v2 path in /proc/self/cgroup", ctrlWhy
	}
	base, err := mounts[i].below(self.v2)
	if err != nil {
		return "cgroup v2: " + err.Error(), ctrlWhy
	}
	// A previous Open in this process may have moved it into its leaf already.
	if path.Base(base) == m.name+"-host" {
		base = path.Dir(base)
	}
	dir := base + "/" + m.name
	if err := m.mkdirOwn(dir); err != nil {
		return "cgroup v2: " + errText(err), ctrlWhy
	}
	m.v2 = dir
	m.v2Kill = m.fs.exists(dir + "/cgroup.kill")

	avail := fieldsOf(m.fs.readFile(base + "/cgroup.controllers"))
	enabled := fieldsOf(m.fs.readFile(base + "/cgroup.subtree_control"))
	moved := false
	for _, c := range []string{"memory", "pids", "cpu"} {
		if !slices.Contains(avail, c) {
			ctrlWhy[c] = fmt.Sprintf("no %s controller in cgroup v2 (%s offers %q)", c, base, strings.Join(avail, " "))
			continue
		}
		if !slices.Contains(enabled, c) {
			err := m.fs.writeFile(base+"/cgroup.subtree_control", "+"+c)
			if errors.Is(err, syscall.EBUSY) && !moved {
				// The no-internal-processes rule: this process sits in base.
				if merr := m.moveToLeaf(base); merr != nil {
					ctrlWhy[c] = fmt.Sprintf("cgroup v2 %s: cannot enable %s for children: %v", base, c, merr)
					continue
				}
				moved = true
				err = m.fs.writeFile(base+"/cgroup.subtree_control", "+"+c)
			}
			if err != nil {
				ctrlWhy[c] = fmt.Sprintf("cgroup v2 %s: enable %s: %s", base, c, errText(err))
				continue
			}
		}
		if err := m.fs.writeFile(dir+"/cgroup.subtree_control", "+"+c); err != nil {
			ctrlWhy[c] = fmt.Sprintf("cgroup v2 %s: enable %s: %s", dir, c, errText(err))
			continue
		}
		switch c {
		case "memory":
			m.v2Mem = true
		case "pids":
			m.v2Pids = true
		case "cpu":
			m.v2CPU = true
		}
	}
	return "", ctrlWhy
}

// moveToLeaf moves this process from base into base/<name>-host, as systemd's delegation
// contract expects, when it is the only process in base.
func (m *Manager) moveToLeaf(base string) error {
	procs, err := m.fs.readFile(base + "/cgroup.procs")
	if err != nil {
		return fmt.Errorf("list its processes: %w", err)
	}
	for _, f := range strings.Fields(string(procs)) {
		if f != strconv.Itoa(m.self.pid) {
			return fmt.Errorf("it holds other processes (pid %s) and v2 allows no processes in a cgroup that enables controllers for children: run toolhost in a cgroup of its own (systemd: Delegate=yes)", f)
		}
	}
	leaf := base + "/" + m.name + "-host"
	if err := m.fs.mkdir(leaf); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("create leaf for this process: %w", err)
	}
	if err := m.fs.writeFile(leaf+"/cgroup.procs", strconv.Itoa(m.self.pid)); err != nil {
		return fmt.Errorf("move this process into %s: %w", leaf, err)
	}
	m.log.Info("moved this process into a leaf cgroup to enable cgroup v2 controllers for sandboxes", "from", base, "to", leaf)
	return nil
}

// openV1 prepares the manager's directory in the v1 hierarchy of ctrl; it returns the
// hierarchy, or nil and why not.
func (m *Manager) openV1(mounts []mount, self selfCgroups, ctrl string) (*hierarchy, string) {
	i := slices.IndexFunc(mounts, func(m mount) bool { return !m.v2 && slices.Contains(m.ctrls, ctrl) })
	if i < 0 {
		return nil, "no " + ctrl + " hierarchy mounted"
	}
	mt := mounts[i]
	for _, h := range m.hier { // co-mounted with a controller already set up
		if h.mount.point == mt.point {
			return h, ""
		}
	}
	own, ok := self.v1[ctrl]
	if !ok {
		return nil, "v1 " + ctrl + ": this process is not in /proc/self/cgroup's " + ctrl + " hierarchy"
	}
	base, err := mt.below(own)
	if err != nil {
		return nil, "v1 " + ctrl + ": " + err.Error()
	}
	dir := base + "/" + m.name
	if err := m.mkdirOwn(dir); err != nil {
		return nil, "v1 " + ctrl + ": " + errText(err)
	}
	if ctrl == "cpu" && !m.fs.exists(dir+"/cpu.cfs_quota_us") {
		return nil, "v1 cpu has no CFS bandwidth control (no cpu.cfs_quota_us)"
	}
	h := &hierarchy{ctrl: ctrl, mount: mt, dir: dir}
	m.hier = append(m.hier, h)
	return h, ""
}

// mkdirOwn creates the manager's directory dir, or checks that this process may create
// groups in it when it exists (made by an earlier run, or by another user's host).
func (m *Manager) mkdirOwn(dir string) error {
	err := m.fs.mkdir(dir)
	if !errors.Is(err, fs.ErrExist) {
		return err
	}
	if err := m.fs.writable(dir); err != nil {
		return &fs.PathError{Op: "create groups in", Path: dir, Err: err}
	}
	return nil
}

// Support reports what enforces each resource on this host.
func (m *Manager) Support() Support { return m.support }

// Prune removes the groups under the manager's directories whose creating process is
// gone (a host that crashed or was killed before it closed them), killing any process
// still inside first. Groups of live processes, this one's included, are left alone.
func (m *Manager) Prune(ctx context.Context) error {
	dirs := m.dirs()
	stale := map[string]bool{}
	for _, d := range dirs {
		names, err := m.fs.subdirs(d)
		if err != nil {
			return fmt.Errorf("prune cgroups: list %s: %w", d, err)
		}
		for _, n := range names {
			_, tok, ok := strings.Cut(n, "@")
			if !ok {
				continue
			}
			if o, ok := parseOwner(tok); ok && !o.alive() {
				stale[n] = true
			}
		}
	}
	var errs []error
	for _, n := range slices.Sorted(maps.Keys(stale)) {
		g := &Group{m: m, id: n, dir: n, v2fd: -1}
		if m.v2 != "" && m.fs.exists(m.v2+"/"+n) {
			g.v2 = m.v2 + "/" + n
		}
		for _, h := range m.hier {
			if m.fs.exists(h.dir + "/" + n) {
				g.v1 = append(g.v1, v1dir{h: h, dir: h.dir + "/" + n})
			}
		}
		if err := g.Close(ctx); err != nil {
			errs = append(errs, err)
			continue
		}
		m.log.Info("removed cgroup left by a dead process", "group", n)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("prune cgroups: %w", err)
	}
	return nil
}

// dirs lists the manager's directories, v2 first.
func (m *Manager) dirs() []string {
	var d []string
	if m.v2 != "" {
		d = append(d, m.v2)
	}
	for _, h := range m.hier {
		d = append(d, h.dir)
	}
	return d
}

func validName(s string) bool {
	if s == "" || len(s) > 100 || s[0] == '.' {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return false
		}
	}
	return true
}

// fieldsOf splits a whitespace-separated interface file; a read error gives nothing.
func fieldsOf(b []byte, err error) []string {
	if err != nil {
		return nil
	}
	return strings.Fields(string(b))
}

// errText is err's text with "permission denied" made explicit for the unprivileged case.
func errText(err error) string {
	if errors.Is(err, syscall.EPERM) { // "operation not permitted"; EACCES says "permission denied"
		return err.Error() + " (permission denied)"
	}
	return err.Error()
}
