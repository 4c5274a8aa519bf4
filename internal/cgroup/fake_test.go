//go:build linux

package cgroup

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fakeFS is a cgroup v2 tree in a temporary directory with the kernel's rules that Open
// and Create depend on: a new cgroup gets the interface files of the controllers its
// parent enables, a controller can be enabled for children only when the parent offers
// it and (outside the root) holds no process, a process cannot join a cgroup that enables
// controllers for its children, and a cgroup with processes or children cannot be
// removed. It is what tests the v2 code paths on a host whose cgroup2 tree has no
// controller.
type fakeFS struct {
	root string
}

func newFakeFS(t *testing.T, rootCtrls ...string) *fakeFS {
	f := &fakeFS{root: t.TempDir()}
	for name, data := range map[string]string{
		"cgroup.procs": "", "cgroup.controllers": strings.Join(rootCtrls, " "), "cgroup.subtree_control": "",
	} {
		if err := os.WriteFile(filepath.Join(f.root, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func (f *fakeFS) fields(p string) []string { return fieldsOf(os.ReadFile(p)) }

func (f *fakeFS) mkdir(p string) error {
	if err := os.Mkdir(p, 0o755); err != nil {
		return err
	}
	files := map[string]string{
		"cgroup.procs": "", "cgroup.subtree_control": "",
		"cgroup.kill": "", "cgroup.type": "domain\n", "cgroup.events": "populated 0\nfrozen 0\n",
	}
	for _, c := range f.controllers(p) {
		maps.Copy(files, controllerFiles[c])
	}
	return f.create(p, files)
}

// controllerFiles are the interface files a controller adds, with their initial values.
var controllerFiles = map[string]map[string]string{
	"memory": {
		"memory.max": "max\n", "memory.swap.max": "max\n", "memory.current": "0\n", "memory.peak": "0\n",
		"memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
	},
	"pids": {"pids.max": "max\n", "pids.current": "0\n", "pids.events": "max 0\n"},
	"cpu":  {"cpu.max": "max 100000\n"},
}

func (f *fakeFS) create(dir string, files map[string]string) error {
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// controllers is what cgroup.controllers of p shows: what its parent enables.
func (f *fakeFS) controllers(p string) []string {
	if filepath.Clean(p) == f.root {
		return f.fields(filepath.Join(p, "cgroup.controllers"))
	}
	return f.fields(filepath.Join(filepath.Dir(p), "cgroup.subtree_control"))
}

func (f *fakeFS) rmdir(p string) error {
	if _, err := os.Stat(p); err != nil {
		return err
	}
	if len(f.fields(filepath.Join(p, "cgroup.procs"))) > 0 {
		return &fs.PathError{Op: "rmdir", Path: p, Err: syscall.EBUSY}
	}
	if subs, _ := f.subdirs(p); len(subs) > 0 {
		return &fs.PathError{Op: "rmdir", Path: p, Err: syscall.EBUSY}
	}
	return os.RemoveAll(p)
}

func (f *fakeFS) readFile(p string) ([]byte, error) {
	if filepath.Base(p) == "cgroup.controllers" {
		if _, err := os.Stat(filepath.Dir(p)); err != nil {
			return nil, err
		}
		return []byte(strings.Join(f.controllers(filepath.Dir(p)), " ")), nil
	}
	return os.ReadFile(p)
}

func (f *fakeFS) writeFile(p, data string) error {
	if _, err := os.Stat(p); err != nil {
		return err // never creates a file, as cgroupfs
	}
	dir, name := filepath.Split(p)
	dir = filepath.Clean(dir)
	fail := func(errno syscall.Errno) error { return &fs.PathError{Op: "write", Path: p, Err: errno} }
	switch name {
	case "cgroup.subtree_control":
		enabled := f.fields(p)
		for _, tok := range strings.Fields(data) {
			c, ok := strings.CutPrefix(tok, "+")
			if !ok || !slices.Contains(f.controllers(dir), c) {
				return fail(syscall.ENOENT)
			}
			if dir != f.root && len(f.fields(filepath.Join(dir, "cgroup.procs"))) > 0 {
				return fail(syscall.EBUSY)
			}
			if !slices.Contains(enabled, c) {
				enabled = append(enabled, c)
				subs, _ := f.subdirs(dir)
				for _, sub := range subs { // existing children gain the controller's files
					if err := f.create(filepath.Join(dir, sub), controllerFiles[c]); err != nil {
						return err
					}
				}
			}
		}
		return os.WriteFile(p, []byte(strings.Join(enabled, " ")), 0o644)
	case "cgroup.procs":
		if dir != f.root && len(f.fields(filepath.Join(dir, "cgroup.subtree_control"))) > 0 {
			return fail(syscall.EBUSY)
		}
		pid := strings.TrimSpace(data)
		err := filepath.WalkDir(f.root, func(q string, d fs.DirEntry, err error) error {
			if err != nil || d.Name() != "cgroup.procs" {
				return err
			}
			procs := slices.DeleteFunc(f.fields(q), func(s string) bool { return s == pid })
			if q == p {
				procs = append(procs, pid)
			}
			return os.WriteFile(q, []byte(strings.Join(procs, "\n")), 0o644)
		})
		return err
	}
	return os.WriteFile(p, []byte(data), 0o644)
}

func (f *fakeFS) subdirs(p string) ([]string, error) { return osFS{}.subdirs(p) }
func (f *fakeFS) exists(p string) bool               { return osFS{}.exists(p) }
func (f *fakeFS) writable(p string) error            { return osFS{}.writable(p) }

// mkdirs creates the cgroups along rel, enabling ctrls for the children of each.
func (f *fakeFS) mkdirs(t *testing.T, rel string, ctrls ...string) string {
	t.Helper()
	p := f.root
	if err := f.writeFile(p+"/cgroup.subtree_control", "+"+strings.Join(ctrls, " +")); err != nil {
		t.Fatal(err)
	}
	for _, part := range strings.Split(strings.Trim(rel, "/"), "/") {
		p = filepath.Join(p, part)
		if err := f.mkdir(p); err != nil {
			t.Fatal(err)
		}
		if err := f.writeFile(p+"/cgroup.subtree_control", "+"+strings.Join(ctrls, " +")); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func (f *fakeFS) put(t *testing.T, p, data string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (f *fakeFS) get(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func (f *fakeFS) env(self string) env {
	return env{
		fs:         f,
		mountinfo:  []byte(fmt.Sprintf("30 23 0:26 / %s rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n", f.root)),
		selfCgroup: []byte("0::" + self + "\n"),
		pid:        os.Getpid(),
	}
}

func openFake(t *testing.T, e env) *Manager {
	t.Helper()
	m, err := open(e, "toolhost", slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Logf("support: %s", m.Support())
	return m
}

// A systemd service with Delegate=yes: the host process is alone in its cgroup, which
// offers every controller but cannot enable one for children while the process is there.
func TestV2DelegatedService(t *testing.T) {
	f := newFakeFS(t, "cpu", "io", "memory", "pids")
	f.mkdirs(t, "/system.slice", "cpu", "io", "memory", "pids")
	svc := filepath.Join(f.root, "system.slice", "toolhost.service")
	if err := f.mkdir(svc); err != nil {
		t.Fatal(err)
	}
	pid := strconv.Itoa(os.Getpid())
	if err := f.writeFile(svc+"/cgroup.procs", pid); err != nil {
		t.Fatal(err)
	}

	m := openFake(t, f.env("/system.slice/toolhost.service"))
	s := m.Support()
	if s.Memory.By != "cgroup v2" || s.Pids.By != "cgroup v2" || s.CPU.By != "cgroup v2" || s.Kill.By != "cgroup v2 cgroup.kill" {
		t.Fatalf("support = %s", s)
	}
	if got := f.get(t, svc+"/toolhost-host/cgroup.procs"); got != pid {
		t.Errorf("leaf holds %q, want this process %s", got, pid)
	}
	if got := f.get(t, svc+"/cgroup.procs"); got != "" {
		t.Errorf("service cgroup still holds %q", got)
	}
	for _, d := range []string{svc, svc + "/toolhost"} {
		if got := f.fields(d + "/cgroup.subtree_control"); !slices.Contains(got, "memory") || !slices.Contains(got, "pids") || !slices.Contains(got, "cpu") {
			t.Errorf("%s enables %v", d, got)
		}
	}

	g, err := m.Create("sb1", Limits{MemoryBytes: 64 << 20, Pids: 16, CPUs: 1.5})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	dir := svc + "/toolhost/" + g.dir
	for file, want := range map[string]string{
		"memory.max": "67108864", "memory.swap.max": "0", "pids.max": "16", "cpu.max": "150000 100000",
	} {
		if got := f.get(t, dir+"/"+file); got != want {
			t.Errorf("%s = %q, want %q", file, got, want)
		}
	}
	fd, ok := g.CgroupFD()
	if !ok {
		t.Fatal("no CgroupFD on v2")
	}
	var a, b syscall.Stat_t
	if err := syscall.Fstat(fd, &a); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(dir, &b); err != nil || a.Ino != b.Ino {
		t.Errorf("CgroupFD is not the group's directory (%v)", err)
	}

	if err := g.Add(424242); err != nil {
		t.Fatalf("Add: %v", err)
	}
	if got := f.get(t, dir+"/cgroup.procs"); got != "424242" {
		t.Errorf("cgroup.procs = %q after Add", got)
	}
	f.put(t, dir+"/memory.current", "1234\n")
	f.put(t, dir+"/memory.peak", "5678\n")
	f.put(t, dir+"/memory.events", "low 0\nhigh 0\nmax 9\noom 3\noom_kill 2\n")
	f.put(t, dir+"/pids.current", "3\n")
	f.put(t, dir+"/pids.events", "max 4\n")
	st, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if want := (Stats{MemoryCurrent: 1234, MemoryPeak: 5678, OOMKills: 2, Pids: 3, PidsRefused: 4}); st != want {
		t.Errorf("Stats = %+v, want %+v", st, want)
	}
	if n, err := g.OOMKills(); err != nil || n != 2 {
		t.Errorf("OOMKills() = %d, %v, want 2", n, err)
	}

	// The process exits (the fake kernel empties the group); Close removes it.
	f.put(t, dir+"/cgroup.procs", "")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := g.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if f.exists(dir) {
		t.Error("group directory left after Close")
	}

	// No limits: nothing written, the kernel's "max" stays.
	g2, err := m.Create("sb2", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if got := f.get(t, svc+"/toolhost/"+g2.dir+"/memory.max"); got != "max" {
		t.Errorf("memory.max = %q without a limit", got)
	}
	if err := g2.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// A second Open in the same process, now in the leaf, uses the same directory.
	m2 := openFake(t, f.env("/system.slice/toolhost.service/toolhost-host"))
	if m2.v2 != svc+"/toolhost" || m2.Support().Memory.By != "cgroup v2" {
		t.Errorf("second Open: dir %s, support %s", m2.v2, m2.Support())
	}
}

// A cgroup shared with other processes (a login session, a container without its own
// cgroup namespace): Open must not move them, and says why v2 limits are unavailable.
func TestV2SharedCgroupIsLeftAlone(t *testing.T) {
	f := newFakeFS(t, "cpu", "memory", "pids")
	scope := filepath.Join(f.mkdirs(t, "/user.slice", "cpu", "memory", "pids"), "session-1.scope")
	if err := f.mkdir(scope); err != nil {
		t.Fatal(err)
	}
	f.put(t, scope+"/cgroup.procs", "1\n"+strconv.Itoa(os.Getpid())+"\n")

	m := openFake(t, f.env("/user.slice/session-1.scope"))
	s := m.Support()
	if s.Memory.OK() || !strings.Contains(s.Memory.Why, "other processes") {
		t.Errorf("memory: %s", s.Memory)
	}
	if s.Kill.By != "cgroup v2 cgroup.kill" {
		t.Errorf("kill: %s (the v2 tree still serves kills)", s.Kill)
	}
	if got := f.fields(scope + "/cgroup.procs"); len(got) != 2 {
		t.Errorf("processes of the shared cgroup moved: %v", got)
	}
	if f.exists(scope + "/toolhost-host") {
		t.Error("leaf created in a shared cgroup")
	}
	g, err := m.Create("sb", Limits{MemoryBytes: 1 << 30})
	if err != nil {
		t.Fatalf("Create without v2 controllers: %v", err)
	}
	if err := g.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// The root cgroup is exempt from the no-internal-processes rule: nothing moves.
func TestV2RootCgroup(t *testing.T) {
	f := newFakeFS(t, "cpu", "memory", "pids", "hugetlb")
	pid := strconv.Itoa(os.Getpid())
	f.put(t, f.root+"/cgroup.procs", pid)
	m := openFake(t, f.env("/"))
	if s := m.Support(); s.Memory.By != "cgroup v2" || s.Pids.By != "cgroup v2" || s.CPU.By != "cgroup v2" {
		t.Errorf("support = %s", s)
	}
	if got := f.get(t, f.root+"/cgroup.procs"); got != pid || f.exists(f.root+"/toolhost-host") {
		t.Errorf("process moved out of the root: root holds %q", got)
	}
}

// Only hugetlb in v2 and nothing in v1: every resource says what is missing.
func TestV2WithoutControllers(t *testing.T) {
	f := newFakeFS(t, "hugetlb")
	m := openFake(t, f.env("/"))
	s := m.Support()
	for name, mech := range map[string]Mechanism{"memory": s.Memory, "pids": s.Pids, "cpu": s.CPU} {
		if mech.OK() || !strings.Contains(mech.Why, "no "+name+" controller in cgroup v2") || !strings.Contains(mech.Why, "no "+name+" hierarchy mounted") {
			t.Errorf("%s: %s", name, mech)
		}
	}
}

func TestNoCgroupsAtAll(t *testing.T) {
	m, err := open(env{fs: osFS{}, pid: os.Getpid()}, "toolhost", nil)
	if err != nil {
		t.Fatal(err)
	}
	if s := m.Support(); s.Memory.OK() || s.Kill.OK() || !strings.Contains(s.Kill.Why, "no cgroup2 filesystem mounted") {
		t.Errorf("support = %s", s)
	}
	if _, err := m.Create("x", Limits{}); err == nil || !strings.Contains(err.Error(), ErrUnavailable.Error()) {
		t.Errorf("Create = %v, want ErrUnavailable", err)
	}
}

func TestParseMountinfo(t *testing.T) {
	mi := `25 30 0:23 / /sys rw,nosuid - sysfs sysfs rw
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
33 31 0:30 /sub /sys/fs/cgroup/my\040memory rw,relatime - cgroup cgroup rw,memory,clone_children
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate
`
	got := parseMountinfo([]byte(mi))
	want := []mount{
		{point: "/sys/fs/cgroup/cpu,cpuacct", root: "/", ctrls: []string{"cpu", "cpuacct"}},
		{point: "/sys/fs/cgroup/my memory", root: "/sub", ctrls: []string{"memory"}},
		{point: "/sys/fs/cgroup/unified", root: "/", v2: true},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("parseMountinfo =\n%v\nwant\n%v", got, want)
	}
	if d, err := got[1].below("/sub/a"); err != nil || d != "/sys/fs/cgroup/my memory/a" {
		t.Errorf("below = %q, %v", d, err)
	}
	if _, err := got[1].below("/subway"); err == nil {
		t.Error("below accepted a path outside the mounted subtree")
	}
	sc := parseSelfCgroup([]byte("9:name=systemd:/\n4:memory:/process_api/x\n2:cpu,cpuacct:/a\n0::/\n"))
	if sc.v2 != "/" || sc.v1["memory"] != "/process_api/x" || sc.v1["cpuacct"] != "/a" || len(sc.v1) != 3 {
		t.Errorf("parseSelfCgroup = %+v", sc)
	}
}

func TestLimitsAndReasons(t *testing.T) {
	if q := (Limits{CPUs: 1.5}).cpuQuota(); q != 150000 {
		t.Errorf("quota for 1.5 CPUs = %d", q)
	}
	if q := (Limits{CPUs: 0.001}).cpuQuota(); q != 1000 {
		t.Errorf("quota below the kernel minimum = %d", q)
	}
	if err := (Limits{CPUs: nan()}).validate(); err == nil {
		t.Error("NaN CPUs accepted")
	}
	if d := DefaultLimits(); d.MemoryBytes != 2<<30 || d.Pids != 512 || d.CPUs != 0 {
		t.Errorf("defaults = %+v", d)
	}
	w := combineWhy("cgroup v2: mkdir /sys/fs/cgroup/x: permission denied", "v1 memory: mkdir /sys/fs/cgroup/memory/x: permission denied")
	if !strings.HasPrefix(w, "not root and no delegated cgroup v2") {
		t.Errorf("combineWhy = %q", w)
	}
}

func nan() float64 { z := 0.0; return z / z }
