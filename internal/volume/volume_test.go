//go:build linux

package volume

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/toolhost/toolhost/internal/testenv"
)

// skipf skips for a capability the machine lacks, or fails under CI=true.
func skipf(t testing.TB, format string, args ...any) {
	t.Helper()
	testenv.Skipf(t, format, args...)
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func newPool(t testing.TB, cfg Config) *Pool {
	t.Helper()
	if err := Check(); err != nil {
		skipf(t, "volumes unavailable: %v", err)
	}
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	p, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { // after the volumes' cleanups
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := p.Close(ctx); err != nil {
			t.Errorf("Pool.Close: %v", err)
		}
	})
	return p
}

func newVolume(t testing.TB, p *Pool, name string) *Volume {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v, err := p.Create(ctx, name)
	if err != nil {
		t.Fatalf("Create %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := v.Close(); err != nil {
			t.Errorf("Close %s: %v", name, err)
		}
	})
	return v
}

// allocated is the disk space a file takes (st_blocks), holes excluded.
func allocated(t testing.TB, path string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

func TestCheck(t *testing.T) {
	err := Check()
	if os.Geteuid() != 0 {
		if err == nil || !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "not root") {
			t.Fatalf("Check as non-root = %v", err)
		}
		return
	}
	if err != nil {
		skipf(t, "volumes unavailable: %v", err)
	}
}

func TestWritePastSizeGivesENOSPC(t *testing.T) {
	p := newPool(t, Config{Size: 64 << 20})
	v := newVolume(t, p, "full")
	keep := make([]byte, 1<<20)
	_, _ = rand.Read(keep)
	want := sha256.Sum256(keep)
	if err := os.WriteFile(filepath.Join(v.Path(), "keep"), keep, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(v.Path(), "big"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte{0xa5}, 1<<20)
	var written int64
	for written < 100<<20 {
		n, werr := f.Write(chunk)
		written += int64(n)
		if werr != nil {
			err = werr
			break
		}
	}
	if err == nil {
		err = f.Sync() // delayed allocation can defer the failure to writeback
	}
	f.Close()
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("wrote %d MiB into a 64 MiB volume, error %v; want ENOSPC", written>>20, err)
	}
	t.Logf("ENOSPC after %d MiB", written>>20)
	got, err := os.ReadFile(filepath.Join(v.Path(), "keep"))
	if err != nil || sha256.Sum256(got) != want {
		t.Fatalf("file written before the volume filled changed: %v", err)
	}
	used, size, err := v.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if size > 64<<20 || used < size-4<<20 {
		t.Errorf("Usage = %d used of %d after filling", used, size)
	}
}

func TestDiscardGivesSpaceBack(t *testing.T) {
	p := newPool(t, Config{Size: 256 << 20})
	v := newVolume(t, p, "discard")
	img := p.image(v.Name())
	before := allocated(t, img)
	data := make([]byte, 40<<20)
	_, _ = rand.Read(data)
	path := filepath.Join(v.Path(), "data")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	syncfs(t, v.Path())
	full := allocated(t, img)
	if full < before+40<<20 {
		t.Fatalf("image took %d bytes after a 40 MiB write (from %d): the write did not reach it", full, before)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	syncfs(t, v.Path())
	// The discard reaches the image as a punched hole; wait for it, bounded.
	var after int64
	if !testenv.Eventually(func() bool { after = allocated(t, img); return after < before+4<<20 }) {
		t.Fatalf("image still takes %d bytes after deleting 40 MiB (empty: %d, full: %d): discard did not punch it out", after, before, full)
	}
	t.Logf("image allocation: empty %d KiB, with 40 MiB %d KiB, after delete %d KiB", before>>10, full>>10, after>>10)
}

func syncfs(t testing.TB, path string) {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		t.Fatal(err)
	}
}

func TestConcurrentCreate(t *testing.T) {
	p := newPool(t, Config{Size: 64 << 20})
	const n = 6
	vols := make([]*Volume, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { // owned by the test, which waits
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			vols[i], errs[i] = p.Create(ctx, fmt.Sprintf("c%d", i))
		})
	}
	wg.Wait()
	devs := map[string]bool{}
	for i, v := range vols {
		if errs[i] != nil {
			t.Errorf("Create c%d: %v", i, errs[i])
			continue
		}
		t.Cleanup(func() {
			if err := v.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
		if devs[v.Device()] {
			t.Errorf("device %s given twice", v.Device())
		}
		devs[v.Device()] = true
		if err := os.WriteFile(filepath.Join(v.Path(), "x"), []byte(v.Name()), 0o644); err != nil {
			t.Error(err)
		}
	}
	for _, v := range vols {
		if v == nil {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(v.Path(), "x")); err != nil || string(b) != v.Name() {
			t.Errorf("%s reads %q, %v: volumes share storage", v.Name(), b, err)
		}
	}
}

// loopBacking is the backing file of loop device dev, "" when it is unbound.
func loopBacking(dev string) string {
	b, err := os.ReadFile("/sys/block/" + filepath.Base(dev) + "/loop/backing_file")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func mounted(t testing.TB, path string) bool {
	t.Helper()
	return mountedIn(t, os.Getpid(), path)
}

func TestCloseRemovesEverything(t *testing.T) {
	p := newPool(t, Config{Size: 64 << 20})
	ctx := context.Background()
	v, err := p.Create(ctx, "gone")
	if err != nil {
		t.Fatal(err)
	}
	img := p.image("gone")
	if b := loopBacking(v.Device()); !strings.HasPrefix(b, img) {
		t.Fatalf("%s backed by %q, want %s", v.Device(), b, img)
	}
	if !mounted(t, v.Path()) {
		t.Fatalf("%s not in mountinfo", v.Path())
	}
	if err := os.WriteFile(filepath.Join(v.Path(), "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := v.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if mounted(t, v.Path()) {
		t.Error("still mounted after Close")
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := p.Close(ctx); err != nil { // the image's deletion
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(p.cfg.Dir, ".volumes")); len(ents) != 0 {
		t.Errorf(".volumes holds %v after Close", ents)
	}
	for _, f := range []string{img, v.Path(), p.lockPath("gone")} {
		if _, err := os.Lstat(f); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s left after Close (%v)", f, err)
		}
	}
	if b := loopBacking(v.Device()); strings.HasPrefix(b, img) {
		t.Errorf("loop device %s still bound to %s", v.Device(), b)
	}
	// No loop device anywhere is bound to an image of this pool.
	devs, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, d := range devs {
		if b, _ := os.ReadFile(d); strings.HasPrefix(string(b), p.cfg.Dir) {
			t.Errorf("%s: %s", d, b)
		}
	}
	if err := v.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestCloseRefusesWhileBusy(t *testing.T) {
	p := newPool(t, Config{Size: 64 << 20})
	v := newVolume(t, p, "busy")
	f, err := os.Create(filepath.Join(v.Path(), "open"))
	if err != nil {
		t.Fatal(err)
	}
	err = v.Close()
	if !errors.Is(err, ErrBusy) {
		t.Errorf("Close with an open file = %v, want ErrBusy", err)
	}
	if !mounted(t, v.Path()) {
		t.Error("volume detached although busy")
	}
	if _, err := f.WriteString("still works"); err != nil {
		t.Errorf("write after the refused Close: %v", err)
	}
	f.Close()
	// The cleanup's Close now succeeds.
}

func TestMountIsNosuidNodev(t *testing.T) {
	p := newPool(t, Config{Size: 64 << 20})
	v := newVolume(t, p, "nosuid")
	var st unix.Statfs_t
	if err := unix.Statfs(v.Path(), &st); err != nil {
		t.Fatal(err)
	}
	if st.Flags&unix.ST_NOSUID == 0 || st.Flags&unix.ST_NODEV == 0 || st.Flags&unix.ST_NOATIME == 0 {
		t.Errorf("mount flags %#x lack nosuid, nodev or noatime", st.Flags)
	}

	// A setuid-root copy of id(1), run as nobody, stays nobody.
	id, err := exec.LookPath("id")
	if err != nil {
		t.Fatal(err)
	}
	suid := filepath.Join(v.Path(), "id-suid")
	copyFile(t, id, suid, 0o4755)
	if got := runAsNobody(t, suid); got != "65534" {
		t.Errorf("setuid-root binary in the volume ran with euid %q, want 65534", got)
	}
	// The same on the directory holding the pool, for contrast (informative: the host's
	// filesystem may itself be nosuid).
	ctl := filepath.Join(t.TempDir(), "id-suid")
	copyFile(t, id, ctl, 0o4755)
	t.Logf("the same binary outside the volume runs with euid %s", runAsNobody(t, ctl))

	// A device node made in the volume cannot be opened.
	dev := filepath.Join(v.Path(), "null")
	if err := unix.Mknod(dev, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	if f, err := os.OpenFile(dev, os.O_WRONLY, 0); err == nil {
		f.Close()
		t.Error("device node in the volume opened: nodev does not hold")
	}
}

func copyFile(t testing.TB, from, to string, mode fs.FileMode) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(to, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(to, mode|fs.ModeSetuid); err != nil {
		t.Fatal(err)
	}
}

// runAsNobody runs path (id) as uid 65534 and returns its effective uid. The program is
// run through /proc/self/fd, so nobody needs no access to the test's directories.
func runAsNobody(t testing.TB, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command("/proc/self/fd/3", "-u")
	cmd.ExtraFiles = []*os.File{f}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("run %s as nobody: %v: %s", path, err, out)
	}
	return strings.TrimSpace(string(out))
}

// The loop device's settings, through LOOP_CONFIGURE and through the pre-5.8 fallback.
func TestLoopDeviceSettings(t *testing.T) {
	check := func(t *testing.T) {
		p := newPool(t, Config{Size: 64 << 20})
		v := newVolume(t, p, "loop")
		sys := "/sys/block/" + filepath.Base(v.Device()) + "/loop/"
		for file, want := range map[string]string{"autoclear": "1", "dio": "1", "backing_file": p.image("loop")} {
			if b, err := os.ReadFile(sys + file); err != nil || strings.TrimSpace(string(b)) != want {
				t.Errorf("%s%s = %q (%v), want %s", sys, file, b, err, want)
			}
		}
	}
	t.Run("configure", check)
	t.Run("set-fd", func(t *testing.T) {
		loopConfigure = func(int, *unix.LoopConfig) error { return unix.EINVAL }
		t.Cleanup(func() { loopConfigure = unix.IoctlLoopConfigure })
		check(t)
	})
}

func TestRootOwnerAndMode(t *testing.T) {
	p := newPool(t, Config{Size: 64 << 20, RootUID: 1000, RootGID: 1001, RootMode: 0o750})
	v := newVolume(t, p, "owned")
	var st unix.Stat_t
	if err := unix.Stat(v.Path(), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 1000 || st.Gid != 1001 || st.Mode&0o7777 != 0o750 {
		t.Errorf("root is %d:%d %o, want 1000:1001 750", st.Uid, st.Gid, st.Mode&0o7777)
	}
	ents, err := os.ReadDir(v.Path())
	if err != nil || len(ents) != 0 {
		t.Errorf("a fresh volume holds %v (%v), want nothing (no lost+found)", ents, err)
	}
}

func TestNameInUse(t *testing.T) {
	p := newPool(t, Config{Size: 64 << 20})
	newVolume(t, p, "once")
	if _, err := p.Create(context.Background(), "once"); !errors.Is(err, ErrInUse) {
		t.Errorf("second Create of a live name = %v, want ErrInUse", err)
	}
	for _, bad := range []string{"", ".volumes", "a/b", "../x"} {
		if _, err := p.Create(context.Background(), bad); err == nil {
			t.Errorf("Create(%q) succeeded", bad)
		}
	}
}

// A volume whose owner died: its lock is free, its mount, image and device remain.
// Prune removes them and leaves a live volume alone; Create of the same name also
// recovers.
func TestPruneRemovesOrphans(t *testing.T) {
	p := newPool(t, Config{Size: 64 << 20})
	live := newVolume(t, p, "live")
	ctx := context.Background()
	orphan := func(name string) *Volume {
		v, err := p.Create(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		v.lock.Release() // as the kernel does when the owner dies
		t.Cleanup(func() { _ = unmount(v.Path()) })
		return v
	}
	o1 := orphan("orphan1")
	if err := p.Prune(); err != nil {
		t.Fatalf("Prune: %v", err)
	}
	if mounted(t, o1.Path()) {
		t.Error("orphan still mounted after Prune")
	}
	for _, f := range []string{p.image("orphan1"), o1.Path(), p.lockPath("orphan1")} {
		if _, err := os.Lstat(f); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s left after Prune (%v)", f, err)
		}
	}
	if !mounted(t, live.Path()) {
		t.Error("Prune unmounted a live volume")
	}

	o2 := orphan("orphan2")
	if err := os.WriteFile(filepath.Join(o2.Path(), "old"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	v := newVolume(t, p, "orphan2")
	if _, err := os.Stat(filepath.Join(v.Path(), "old")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("recreated volume holds the orphan's file (%v)", err)
	}
}

// Dir is shared: the local provider stages host directories there (bind mounts named
// like its sandboxes, with lock files of its own) and keeps private workspaces. Prune
// touches nothing it has no record of, mounted or not, even with no lock in sight.
func TestPruneLeavesWhatIsNotItsOwn(t *testing.T) {
	p := newPool(t, Config{Size: 64 << 20})
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "keep"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	stage := filepath.Join(p.cfg.Dir, "local-0123456789ab")
	if err := os.Mkdir(stage, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(src, stage, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(stage, unix.MNT_DETACH); _ = os.Remove(stage) })
	private := filepath.Join(p.cfg.Dir, "local-ba9876543210")
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := p.Prune(); err != nil {
		t.Fatalf("Prune: %v", err)
	}
	if !mounted(t, stage) {
		t.Error("Prune unmounted a staged directory that is not a volume")
	}
	if _, err := os.Stat(filepath.Join(stage, "keep")); err != nil {
		t.Errorf("the staged directory's file: %v", err)
	}
	if _, err := os.Stat(private); err != nil {
		t.Errorf("Prune removed a directory that is not a volume: %v", err)
	}
	if _, err := os.Lstat(p.lockPath("local-0123456789ab")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Prune made a lock file for a name that is not its own (%v)", err)
	}
}

// inNamespace runs script (sh -c, with args as $1...) in a private mount namespace of a
// process of its own, as another program on the host would (unshare(1)), and waits until
// the script says "ready"; the process then sleeps until the test ends it. It returns the
// process.
func inNamespace(t *testing.T, script string, args ...string) *exec.Cmd {
	t.Helper()
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		skipf(t, "unshare(1) not installed (util-linux): %v", err)
	}
	cmd := exec.Command(unshare, append([]string{"-m", "--propagation", "private", "sh", "-c", script + " && echo ready && exec sleep 60", "sh"}, args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = testWriter{t}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if _, err := io.ReadFull(out, make([]byte, 6)); err != nil {
		t.Fatalf("wait for the namespace: %v", err)
	}
	return cmd
}

// A mount namespace any process made while the volume was mounted holds a copy of its
// mount, which the unmount does not reach when the namespace is private (unshare(1)'s
// default; a namespace a user namespace owns has locked copies, alike). Close removes
// the mount point, which detaches that copy: the filesystem goes with Close, not with
// the other process (found by make test at load 13: internal/volume's own namespace test
// below held every volume of the host, the root package's provider then failed to close
// its spare volume).
func TestCloseDetachesCopiesInOtherNamespaces(t *testing.T) {
	p := newPool(t, Config{Size: 64 << 20})
	v, err := p.Create(context.Background(), "copied")
	if err != nil {
		t.Fatal(err)
	}
	ns := inNamespace(t, "true")
	if !mountedIn(t, ns.Process.Pid, v.Path()) {
		t.Fatalf("the other namespace has no copy of %s", v.Path())
	}
	if err := v.Close(); err != nil {
		t.Fatalf("Close with a copy in another process's namespace: %v", err)
	}
	if mountedIn(t, ns.Process.Pid, v.Path()) {
		t.Error("the other namespace still mounts the closed volume")
	}
	if b := loopBacking(v.Device()); b == p.image(v.Name()) {
		t.Errorf("%s still bound to the image after Close", v.Device())
	}
}

// A bind of the volume elsewhere in another namespace (a sandbox still running holds its
// workspace at /home/user) keeps the filesystem: Close does its part and says so, naming
// the process.
func TestCloseReportsMountInAnotherNamespace(t *testing.T) {
	p := newPool(t, Config{Size: 64 << 20})
	v, err := p.Create(context.Background(), "elsewhere")
	if err != nil {
		t.Fatal(err)
	}
	ns := inNamespace(t, `mount -t tmpfs none "$1" && mkdir "$1/ws" && mount --bind "$2" "$1/ws"`, t.TempDir(), v.Path())
	err = v.Close()
	if !errors.Is(err, ErrMountedElsewhere) {
		t.Fatalf("Close with the filesystem mounted in another namespace = %v, want ErrMountedElsewhere", err)
	}
	if holder := fmt.Sprintf("pid %d (sleep)", ns.Process.Pid); !strings.Contains(err.Error(), holder) {
		t.Errorf("Close's error does not name the holder, %s: %v", holder, err)
	}
	if mounted(t, v.Path()) {
		t.Error("still mounted here")
	}
	if err := v.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	// The namespace ends: the device goes.
	_ = ns.Process.Kill()
	_ = ns.Wait()
	// Cleared, or perhaps cleared and reused by someone else.
	if !testenv.Eventually(func() bool { return !strings.HasPrefix(loopBacking(v.Device()), p.cfg.Dir) }) {
		t.Fatalf("%s still bound to %s after the namespace ended", v.Device(), loopBacking(v.Device()))
	}
}

// mountedIn reports whether path is a mount point in the mount namespace of pid.
func mountedIn(t testing.TB, pid int, path string) bool {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}

func TestTemplateIsSparseAndReused(t *testing.T) {
	dir := t.TempDir()
	p := newPool(t, Config{Dir: dir})
	var data int64
	for _, e := range p.extents {
		data += e.len
	}
	if alloc := allocated(t, p.tpl); alloc > 4<<20 || data > 4<<20 {
		t.Errorf("10 GiB template has %d bytes of data, %d allocated; want a few hundred KiB", data, alloc)
	}
	t.Logf("10 GiB template: %d extents, %d KiB of data", len(p.extents), data>>10)
	fi, err := os.Stat(p.tpl)
	if err != nil {
		t.Fatal(err)
	}
	p2 := newPool(t, Config{Dir: dir})
	fi2, err := os.Stat(p2.tpl)
	if err != nil || !os.SameFile(fi, fi2) {
		t.Errorf("second pool rebuilt the template (%v)", err)
	}
	v := newVolume(t, p2, "big")
	if alloc := allocated(t, p2.image("big")); alloc > 4<<20 {
		t.Errorf("fresh 10 GiB volume image takes %d bytes", alloc)
	}
	used, size, err := v.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if size < 9<<30 || used > 64<<20 {
		t.Errorf("Usage = %d of %d", used, size)
	}
}

func TestCopyExtents(t *testing.T) {
	t.Run("copy_file_range", testCopyExtents)
	t.Run("fallback", func(t *testing.T) {
		copyFileRange = func(int, *int64, int, *int64, int, int) (int, error) { return 0, unix.EXDEV }
		t.Cleanup(func() { copyFileRange = unix.CopyFileRange })
		testCopyExtents(t)
	})
}

// testCopyExtents checks that a sparse copy has the source's bytes and not its size in
// blocks.
func testCopyExtents(t *testing.T) {
	dir := t.TempDir()
	src, err := os.Create(filepath.Join(dir, "src"))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if err := src.Truncate(16 << 20); err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{0, 8 << 20, 15 << 20} {
		if _, err := src.WriteAt(bytes.Repeat([]byte{byte(off >> 20)}, 1<<20), off); err != nil {
			t.Fatal(err)
		}
	}
	ext, err := dataExtents(src)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := os.Create(filepath.Join(dir, "dst"))
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	if err := copyExtents(dst, src, ext, 16<<20); err != nil {
		t.Fatal(err)
	}
	a, _ := io.ReadAll(io.NewSectionReader(src, 0, 16<<20))
	b, _ := io.ReadAll(io.NewSectionReader(dst, 0, 16<<20))
	if !bytes.Equal(a, b) {
		t.Error("copy differs from the source")
	}
	if alloc := allocated(t, dst.Name()); alloc > 8<<20 {
		t.Errorf("copy of 3 MiB of data allocates %d bytes", alloc)
	}
}

// BenchmarkCreateClose is what a sandbox with a private workspace adds to its creation
// and teardown: a 10 GiB volume made from the template and mounted, then unmounted and
// removed. The background deletion of the image is drained outside the timer after each
// round (see BenchmarkCreateCloseBacklog for the cost with deletions piling up).
func BenchmarkCreateClose(b *testing.B) {
	p := newPool(b, Config{Size: DefaultSize})
	ctx := context.Background()
	var create, close_ time.Duration
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		v, err := p.Create(ctx, fmt.Sprintf("b%d", i))
		if err != nil {
			b.Fatal(err)
		}
		mid := time.Now()
		if err := v.Close(); err != nil {
			b.Fatal(err)
		}
		create, close_ = create+mid.Sub(start), close_+time.Since(mid)
		b.StopTimer()
		if err := p.Close(ctx); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(create.Microseconds())/float64(b.N), "create-µs/op")
	b.ReportMetric(float64(close_.Microseconds())/float64(b.N), "close-µs/op")
}

// BenchmarkCreateCloseBacklog is Create and Close back to back, the deletions of the
// images running behind them and competing for the disk.
func BenchmarkCreateCloseBacklog(b *testing.B) {
	p := newPool(b, Config{Size: DefaultSize})
	ctx := context.Background()
	for i := 0; b.Loop(); i++ {
		v, err := p.Create(ctx, fmt.Sprintf("b%d", i))
		if err != nil {
			b.Fatal(err)
		}
		if err := v.Close(); err != nil {
			b.Fatal(err)
		}
	}
	if err := p.Close(ctx); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkTemplate is the one-time cost of a Pool: mkfs.ext4 of a 10 GiB image and the
// mount that removes lost+found.
func BenchmarkTemplate(b *testing.B) {
	if err := Check(); err != nil {
		skipf(b, "volumes unavailable: %v", err)
	}
	for b.Loop() {
		if _, err := New(Config{Dir: b.TempDir(), Size: DefaultSize}); err != nil {
			b.Fatal(err)
		}
	}
}
