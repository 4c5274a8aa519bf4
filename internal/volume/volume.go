//go:build linux

// Package volume gives a sandbox's private workspace a size limit. This kernel, like many,
// has no disk quotas, and a bind-mounted host directory has no size of its own, so every
// private workspace is its own small filesystem: a sparse image file holding ext4,
// attached to a loop device and mounted nosuid,nodev,noatime where the sandbox's
// workspace is bind-mounted from. Writing past the size fails with ENOSPC inside the
// sandbox and nowhere else. The mount uses discard, so blocks the sandbox frees are
// punched out of the image and the host gets its space back; the loop device does direct
// I/O, so what the sandbox writes is not cached a second time for the image file.
//
// Creating a filesystem takes tens of milliseconds and a sandbox is created in a few, so
// mkfs.ext4 runs once per Pool (size, owner and mode) and builds a template image: no
// journal (a workspace has no use for crash consistency of its own, and the journal
// would cost its size in writes), no reserved blocks, no online-resize reservation and
// no backup superblocks (a volume never grows, and both would be most of the template's
// data), metadata packed at the start, and inode tables left to the holes of the sparse
// file, which read as zeros. The 10 GiB template holds 32 KiB of data in 4 extents; a
// volume is a sparse copy of just those, bound to a loop device and mounted with ioctls
// and mount(2): no program runs when a sandbox is created.
//
// Everything lives under Config.Dir (0700): the template in .templates/, each volume's
// image and lock file in .volumes/, its mount point at Dir/<name>. A volume's lock file is
// held (flock) by the process that owns the volume for as long as the volume exists, so
// Prune can tell what a crashed process left behind from what a live one uses. The loop
// device is bound with autoclear, so it goes with the last mount of the filesystem even
// when the owner dies without unmounting. Close deletes the image in the background:
// freeing a used image's blocks costs the host's filesystem milliseconds per extent.
package volume

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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
	"time"

	"golang.org/x/sys/unix"

	"github.com/toolhost/toolhost/internal/lockfile"
)

// Errors callers branch on; test with errors.Is.
var (
	// ErrUnsupported: volumes cannot be made on this host; the message says what is
	// missing (see Check).
	ErrUnsupported = errors.New("workspace volumes are unavailable")
	// ErrInUse: a live volume already has the name.
	ErrInUse = errors.New("volume name in use")
	// ErrBusy: the volume cannot be unmounted because a process still uses it; kill the
	// sandbox first, then Close again.
	ErrBusy = errors.New("volume busy: a process still uses it")
	// ErrMountedElsewhere: Close unmounted the volume and removed it from the host's view,
	// but its filesystem is still mounted in another mount namespace: a sandbox that is
	// still running holds its bind mount, or a namespace that any process of the host made
	// while the volume was mounted holds a copy of it that the unmount does not reach (a
	// private namespace, as unshare(1) makes; one a user namespace owns, whose copies are
	// locked). The filesystem, its loop device and its space live until that namespace
	// ends; nothing else is left to do. The error names the processes holding it.
	ErrMountedElsewhere = errors.New("volume still mounted in another mount namespace")
)

const (
	// DefaultSize is a workspace's size when Config.Size is zero: 10 GiB.
	DefaultSize = 10 << 30
	// MinSize is the smallest volume.
	MinSize = 8 << 20
	// DefaultRootMode is the mode of a volume's root directory when Config.RootMode is
	// zero.
	DefaultRootMode fs.FileMode = 0o755
)

// mountFlags and mountData: no setuid or device file in the volume takes effect
// (whatever the sandbox makes there, or a restore puts there), no access-time writes,
// freed blocks go back to the host, and the kernel never zeroes inode tables in the
// background (the sparse image's holes are zeros already).
const (
	mountFlags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOATIME
	mountData  = "discard,noinit_itable,errors=remount-ro"
)

// templateVersion names the template recipe; change it when the mkfs options change so
// old cached templates are not reused.
const templateVersion = "v1"

// Config configures a Pool.
type Config struct {
	// Dir holds the template, the images and the mount points. Created 0700 if missing;
	// an existing Dir keeps its mode.
	Dir string
	// Size is every volume's size in bytes (DefaultSize when zero), rounded up to 4 KiB.
	Size int64
	// RootUID and RootGID own the root directory of every volume (the host ids the
	// sandbox user maps to).
	RootUID, RootGID int
	// RootMode is the permission of every volume's root directory (DefaultRootMode when
	// zero). Only the permission bits and the sticky bit count.
	RootMode fs.FileMode
	Logger   *slog.Logger
}

// Check reports whether volumes can be made here: nil, or an ErrUnsupported saying what
// is missing (root, /dev/loop-control, ext4 in the kernel, mkfs.ext4).
func Check() error {
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "not root (loop devices and mounts need root)")
	}
	if fi, err := os.Stat("/dev/loop-control"); err != nil || fi.Mode()&fs.ModeCharDevice == 0 {
		missing = append(missing, "no /dev/loop-control (a kernel without loop devices, or a container that hides them)")
	}
	if b, err := os.ReadFile("/proc/filesystems"); err == nil && !strings.Contains(string(b), "\text4\n") {
		// ext4 may still be a module that mount loads on demand: only say so when absent
		// from both the list and the module tree.
		if _, err := os.Stat("/sys/module/ext4"); err != nil && !moduleAvailable("ext4") {
			missing = append(missing, "the kernel has no ext4 filesystem")
		}
	}
	if _, err := mkfsPath(); err != nil {
		missing = append(missing, "mkfs.ext4 not found: install e2fsprogs")
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s", ErrUnsupported, strings.Join(missing, "; "))
	}
	return nil
}

func moduleAvailable(name string) bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	b, err := os.ReadFile("/lib/modules/" + unix.ByteSliceToString(u.Release[:]) + "/modules.dep")
	return err == nil && strings.Contains(string(b), "/"+name+".ko")
}

// mkfsPath finds mkfs.ext4, also in the sbin directories a non-root PATH lacks.
func mkfsPath() (string, error) {
	if p, err := exec.LookPath("mkfs.ext4"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errors.New("mkfs.ext4 not found")
}

// Pool makes volumes of one size and root owner from one template. It is safe for
// concurrent use.
type Pool struct {
	cfg     Config
	log     *slog.Logger
	tpl     string   // template image
	extents []extent // its data

	// deleting counts the image deletions Volume.Close left running: freeing a used
	// image's blocks takes the host filesystem milliseconds per extent (a synchronous
	// discard on some), which no caller should wait for. Pool.Close waits for them.
	deleting sync.WaitGroup
}

// New checks the host (Check), prepares cfg.Dir and builds the template image, or reuses
// the one a previous Pool with the same size, owner and mode left in Dir.
func New(cfg Config) (*Pool, error) {
	if err := Check(); err != nil {
		return nil, err
	}
	if cfg.Size == 0 {
		cfg.Size = DefaultSize
	}
	if cfg.Size < MinSize {
		return nil, fmt.Errorf("volume pool: size %d is below the minimum %d", cfg.Size, MinSize)
	}
	cfg.Size = (cfg.Size + 4095) &^ 4095
	if cfg.RootMode == 0 {
		cfg.RootMode = DefaultRootMode
	}
	cfg.RootMode &= fs.ModePerm | fs.ModeSticky
	if cfg.RootUID < 0 || cfg.RootGID < 0 {
		return nil, fmt.Errorf("volume pool: invalid root owner %d:%d", cfg.RootUID, cfg.RootGID)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Dir == "" {
		return nil, errors.New("volume pool: no directory")
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("volume pool: %w", err)
	}
	cfg.Dir = dir
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("volume pool: create %s: %w", dir, err)
	}
	// Dir's own mode is the caller's (the sandbox user may need to pass through it to a
	// mount point); the images and templates are private.
	for _, d := range []string{filepath.Join(dir, ".volumes"), filepath.Join(dir, ".templates")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("volume pool: create %s: %w", d, err)
		}
		if err := os.Chmod(d, 0o700); err != nil {
			return nil, fmt.Errorf("volume pool: %w", err)
		}
	}
	p := &Pool{cfg: cfg, log: cfg.Logger}
	if err := p.template(); err != nil {
		return nil, fmt.Errorf("volume pool: %w", err)
	}
	return p, nil
}

// template builds or reuses the template image and records its data extents.
func (p *Pool) template() error {
	c := p.cfg
	p.tpl = filepath.Join(c.Dir, ".templates", fmt.Sprintf("ext4-%s-%d-%d-%d-%o.img", templateVersion, c.Size, c.RootUID, c.RootGID, uint32(c.RootMode)))
	if _, err := os.Stat(p.tpl); errors.Is(err, fs.ErrNotExist) {
		start := time.Now()
		if err := p.buildTemplate(); err != nil {
			return err
		}
		p.log.Info("built workspace volume template", "path", p.tpl, "size", c.Size, "took", time.Since(start))
	} else if err != nil {
		return fmt.Errorf("template: %w", err)
	}
	f, err := os.Open(p.tpl)
	if err != nil {
		return fmt.Errorf("template: %w", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return fmt.Errorf("template: %w", err)
	} else if fi.Size() != c.Size {
		return fmt.Errorf("template %s: size %d, want %d", p.tpl, fi.Size(), c.Size)
	}
	ext, err := dataExtents(f)
	if err != nil {
		return fmt.Errorf("template: %w", err)
	}
	if p.extents, err = nonZero(f, ext); err != nil {
		return fmt.Errorf("template: %w", err)
	}
	return nil
}

func (p *Pool) buildTemplate() error {
	c := p.cfg
	tmp := p.tpl + ".tmp-" + randomSuffix()
	defer os.Remove(tmp) // after the rename, a no-op
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("template: %w", err)
	}
	defer f.Close()
	if err := f.Truncate(c.Size); err != nil {
		return fmt.Errorf("template: %w", err)
	}
	mkfs, err := mkfsPath()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ext := fmt.Sprintf("lazy_itable_init=1,nodiscard,num_backup_sb=0,packed_meta_blocks=1,root_owner=%d:%d", c.RootUID, c.RootGID)
	run := func(ext string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, mkfs, "-q", "-F", "-t", "ext4", "-b", "4096",
			"-O", "^has_journal,^resize_inode,sparse_super2", "-m", "0", "-E", ext, tmp)
		cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C"}
		cmd.WaitDelay = 5 * time.Second
		return cmd.CombinedOutput()
	}
	// assume_storage_prezeroed (e2fsprogs 1.47) marks the inode tables zeroed, which the
	// image's holes make true; older mkfs refuse the option and noinit_itable at mount
	// keeps the kernel from zeroing them instead.
	out, err := run(ext + ",assume_storage_prezeroed=1")
	if err != nil && strings.Contains(string(out), "assume_storage_prezeroed") {
		out, err = run(ext)
	}
	if err != nil {
		return fmt.Errorf("template: %s: %w: %s", mkfs, err, strings.TrimSpace(string(out)))
	}
	// Mount it once: remove lost+found (a sandbox has no use for it) and set the root's
	// owner and mode, so that no volume needs a write to be ready.
	mnt, err := os.MkdirTemp(filepath.Dir(p.tpl), "mnt-")
	if err != nil {
		return fmt.Errorf("template: %w", err)
	}
	defer os.Remove(mnt)
	dev, err := mountImage(ctx, f, tmp, mnt)
	if err != nil {
		return fmt.Errorf("template: %w", err)
	}
	err = errors.Join(
		os.Remove(filepath.Join(mnt, "lost+found")),
		os.Chown(mnt, c.RootUID, c.RootGID),
		os.Chmod(mnt, c.RootMode),
	)
	if uerr := unix.Unmount(mnt, unix.UMOUNT_NOFOLLOW); uerr != nil {
		err = errors.Join(err, fmt.Errorf("unmount %s (%s): %w", mnt, dev, uerr))
	}
	if err != nil {
		return fmt.Errorf("template: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("template: %w", err)
	}
	if err := os.Rename(tmp, p.tpl); err != nil {
		return fmt.Errorf("template: %w", err)
	}
	return nil
}

// mountImage attaches the image open as img to a loop device and mounts it at mnt; it
// returns the device. The loop device detaches by itself when the mount goes.
func mountImage(ctx context.Context, img *os.File, imgPath, mnt string) (string, error) {
	fd, dev, err := attach(ctx, int(img.Fd()), imgPath)
	if err != nil {
		return "", err
	}
	// Closing the device clears it (autoclear) unless the mount holds it by then.
	defer unix.Close(fd)
	if err := unix.Mount(dev, mnt, "ext4", mountFlags, mountData); err != nil {
		return "", fmt.Errorf("mount %s (%s) at %s: %w", dev, imgPath, mnt, err)
	}
	return dev, nil
}

func randomSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// validName: a plain directory name that cannot collide with the pool's own entries
// (which start with a dot).
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

func (p *Pool) mountPoint(name string) string { return filepath.Join(p.cfg.Dir, name) }
func (p *Pool) image(name string) string      { return filepath.Join(p.cfg.Dir, ".volumes", name+".img") }
func (p *Pool) lockPath(name string) string {
	return filepath.Join(p.cfg.Dir, ".volumes", name+".lock")
}

// Volume is one mounted workspace volume. Its methods are safe for concurrent use.
type Volume struct {
	p    *Pool
	name string
	path string
	dev  string

	mu      sync.Mutex
	lock    *lockfile.Lock // held while the volume exists
	mounted bool
	closed  bool
}

// Create makes a fresh, empty volume named name (letters, digits, '-', '_', '.'; not
// starting with a dot) and mounts it at Dir/<name>. Its root has the pool's owner and
// mode. A name that a live volume holds, in this process or another, gives ErrInUse;
// what a dead owner left under the name is cleaned up first.
func (p *Pool) Create(ctx context.Context, name string) (*Volume, error) {
	if !validName(name) {
		return nil, fmt.Errorf("create volume: invalid name %q (letters, digits, '-', '_', '.')", name)
	}
	lock, err := p.lock(name)
	if err != nil {
		return nil, fmt.Errorf("create volume %s: %w", name, err)
	}
	// What a dead owner left goes first; if that fails, leave it for Prune to report.
	if _, err := p.clean(name); err != nil {
		_ = lock.Release()
		return nil, fmt.Errorf("create volume %s: remove what a previous owner left: %w", name, err)
	}
	v := &Volume{p: p, name: name, path: p.mountPoint(name), lock: lock}
	if err := v.create(ctx); err != nil {
		if cerr := v.Close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
		return nil, fmt.Errorf("create volume %s: %w", name, err)
	}
	p.log.Debug("created workspace volume", "name", name, "device", v.dev, "path", v.path)
	return v, nil
}

func (v *Volume) create(ctx context.Context) error {
	p := v.p
	imgPath := p.image(v.name)
	img, err := os.OpenFile(imgPath, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer img.Close() // the loop device holds its own reference
	src, err := os.Open(p.tpl)
	if err != nil {
		return fmt.Errorf("open template: %w", err)
	}
	err = copyExtents(img, src, p.extents, p.cfg.Size)
	src.Close()
	if err != nil {
		return err
	}
	if err := os.Mkdir(v.path, 0o700); err != nil {
		return err
	}
	if v.dev, err = mountImage(ctx, img, imgPath, v.path); err != nil {
		return err
	}
	v.mounted = true
	return nil
}

// Path is where the volume is mounted: the directory to bind into the sandbox.
func (v *Volume) Path() string { return v.path }

// Name is the name given to Create.
func (v *Volume) Name() string { return v.name }

// Device is the loop device the volume is attached to ("/dev/loop3").
func (v *Volume) Device() string { return v.dev }

// Usage reports the bytes in use and the volume's capacity, from statfs.
func (v *Volume) Usage() (used, size int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(v.path, &st); err != nil {
		return 0, 0, fmt.Errorf("volume %s usage: %w", v.name, err)
	}
	bs := int64(st.Bsize)
	return (int64(st.Blocks) - int64(st.Bfree)) * bs, int64(st.Blocks) * bs, nil
}

// Close unmounts the volume and deletes its image and mount point; the loop device
// detaches with the mount. The image is renamed away at once and unlinked in the
// background (Pool.Close waits for that), since freeing its blocks can take the host's
// filesystem a while. While a process still uses the volume (the sandbox was not
// killed first) the unmount fails with ErrBusy and the volume stays as it was: Close
// never detaches lazily, which would leave the filesystem alive behind the caller's back.
//
// Every mount namespace made on the host while the volume is mounted (a sandbox being set
// up, any process's unshare) gets a copy of its mount, and the unmount does not reach the
// copies of a private namespace, nor the locked ones of a namespace a user namespace owns.
// Such a copy sits on the mount point, which Close removes right after the unmount: the
// kernel then detaches every mount on that directory in every namespace, so no copy of
// another process keeps the filesystem. What can still keep it is a bind of it elsewhere
// (a sandbox still running holds its workspace at /home/user) or a process with a file or
// directory open in it: then Close finishes and returns ErrMountedElsewhere, naming the
// processes. Close after a Close that finished is a no-op.
func (v *Volume) Close() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return nil
	}
	wasMounted := v.mounted
	if v.mounted {
		if err := unmount(v.path); err != nil {
			return fmt.Errorf("close volume %s: %w", v.name, err)
		}
		v.mounted = false
	}
	// Before the wait below: removing the mount point detaches the copies of the mount
	// that other namespaces hold on it.
	if err := os.Remove(v.path); err != nil && !errors.Is(err, fs.ErrNotExist) { // still locked: no one else cleans meanwhile
		return fmt.Errorf("close volume %s: %w", v.name, err)
	}
	held := ""
	if wasMounted && stillBound(v.dev, v.p.image(v.name)) {
		held = holders(v.dev)
	}
	// The image moves out of the name's way at once and is deleted in the background,
	// under the name's lock: the lock file goes last, so a Prune of another process never
	// takes a deletion under way for what a dead process left.
	trash := v.p.image(v.name) + "." + randomSuffix() + trashSuffix
	if err := os.Rename(v.p.image(v.name), trash); err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("close volume %s: %w", v.name, err)
		}
		if err := v.lock.Remove(); err != nil {
			return fmt.Errorf("close volume %s: %w", v.name, err)
		}
	} else {
		lock := v.lock
		v.p.deleting.Go(func() { // owned by the Pool: Pool.Close waits for it
			if err := os.Remove(trash); err != nil && !errors.Is(err, fs.ErrNotExist) {
				v.p.log.Error("delete the image of a closed volume", "path", trash, "err", err)
				_ = lock.Release() // a later Prune tries again
				return
			}
			if err := lock.Remove(); err != nil {
				v.p.log.Error("remove the lock of a closed volume", "err", err)
			}
		})
	}
	v.closed = true
	if held != "" {
		v.p.log.Info("workspace volume unmounted but still mounted in another mount namespace", "name", v.name, "device", v.dev, "held_by", held)
		return fmt.Errorf("close volume %s (%s): %w: held by %s", v.name, v.dev, ErrMountedElsewhere, held)
	}
	return nil
}

// holders names the processes (pid and command) whose mount namespaces mount the
// filesystem on device dev, one per namespace and at most maxHolders, from /proc: who
// keeps a closed volume alive. A copy detached from its namespace but busy (a process's
// working directory in it) is in no mountinfo, and is not named.
func holders(dev string) string {
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		return "unknown processes"
	}
	want := fmt.Sprintf(" %d:%d ", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	procs, _ := filepath.Glob("/proc/[0-9]*")
	seen := map[string]bool{}
	var out []string
	for _, pd := range procs {
		ns, err := os.Readlink(pd + "/ns/mnt")
		if err != nil || seen[ns] {
			continue
		}
		b, err := os.ReadFile(pd + "/mountinfo")
		if err != nil || !strings.Contains(string(b), want) {
			continue
		}
		seen[ns] = true
		comm, _ := os.ReadFile(pd + "/comm")
		out = append(out, fmt.Sprintf("pid %s (%s)", filepath.Base(pd), strings.TrimSpace(string(comm))))
		if len(out) == maxHolders {
			out = append(out, "...")
			break
		}
	}
	if len(out) == 0 {
		return "no mount of it in any namespace: a process still has a file or directory open in it"
	}
	return strings.Join(out, ", ")
}

// maxHolders bounds the processes holders names.
const maxHolders = 3

// stillBound reports whether loop device dev is still bound to image after its mount
// went and its mount point was removed. The last unmount clears an autoclear device, but
// not at once: the filesystem's last reference may be dropped by the kernel a moment
// later (a mount namespace that just ended is torn down asynchronously, a transient
// opener such as udev's probe holds the device briefly). So the binding is watched for up
// to stillBoundWait, a hang bound: a binding that outlives it means the filesystem is
// held by something that lasts (a bind of it elsewhere, a process working in it).
func stillBound(dev, image string) bool {
	f := "/sys/block/" + filepath.Base(dev) + "/loop/backing_file"
	deadline := time.Now().Add(stillBoundWait)
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		b, err := os.ReadFile(f)
		if err != nil || strings.TrimSpace(string(b)) != image {
			return false
		}
		if time.Now().After(deadline) {
			return true
		}
		time.Sleep(wait)
	}
}

// stillBoundWait bounds stillBound's watch.
const stillBoundWait = 3 * time.Second

// trashSuffix marks an image being deleted; Prune removes those a dead process left.
const trashSuffix = ".trash"

// Close waits until the images of closed volumes are deleted, or ctx ends. Volumes still
// open are not affected; the Pool stays usable.
func (p *Pool) Close(ctx context.Context) error {
	done := make(chan struct{})
	go func() { // owned by Close; ends when the deletions do, which are bounded
		p.deleting.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("volume pool: wait for image deletions: %w", ctx.Err())
	}
}

// unmount unmounts the volume at path; "not mounted" is success.
func unmount(path string) error {
	err := unix.Unmount(path, unix.UMOUNT_NOFOLLOW)
	switch {
	case err == nil, errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
		return nil
	case errors.Is(err, unix.EBUSY):
		return fmt.Errorf("unmount %s: %w", path, ErrBusy)
	}
	return fmt.Errorf("unmount %s: %w", path, err)
}

// lock takes the name: a new lock file, locked from birth (internal/lockfile), or the one
// a dead owner left, whose remains the caller then cleans. ErrInUse when a live owner
// holds it.
func (p *Pool) lock(name string) (*lockfile.Lock, error) {
	path := p.lockPath(name)
	for range 10 {
		l, err := lockfile.Create(path, nil)
		if err == nil {
			return l, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("lock: %w", err)
		}
		l, _, err = lockfile.Stale(path)
		switch {
		case err == nil:
			return l, nil
		case errors.Is(err, lockfile.ErrHeld):
			return nil, ErrInUse
		case !errors.Is(err, fs.ErrNotExist):
			return nil, fmt.Errorf("lock: %w", err)
		}
		// Its owner removed it between our two looks: try again.
	}
	return nil, fmt.Errorf("lock %s: the file keeps being replaced", path)
}

// clean removes what a previous owner of name left: the mount, the image and the mount
// point; found says whether there was anything. The caller holds the name's lock.
func (p *Pool) clean(name string) (found bool, err error) {
	mnt := p.mountPoint(name)
	if mounted, err := isMountPoint(mnt); err != nil {
		return false, err
	} else if mounted {
		if err := unmount(mnt); err != nil {
			return true, err
		}
		found = true
	}
	trash, _ := filepath.Glob(p.image(name) + ".*" + trashSuffix)
	for _, path := range append([]string{p.image(name), mnt}, trash...) {
		err := os.Remove(path)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return true, err
		}
		found = found || err == nil
	}
	return found, nil
}

// isMountPoint reports whether path is a directory with another filesystem mounted on
// it (its device differs from its parent's).
func isMountPoint(path string) (bool, error) {
	var st, parent unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, fmt.Errorf("stat %s: %w", path, err)
	}
	if err := unix.Lstat(filepath.Dir(path), &parent); err != nil {
		return false, fmt.Errorf("stat %s: %w", filepath.Dir(path), err)
	}
	return st.Dev != parent.Dev, nil
}

// Prune removes the volumes under Dir that no live process owns (their lock file is
// free): left by a process that crashed or was killed. A volume still mounted and busy
// (a sandbox of the dead process still running) is reported with ErrBusy and kept.
// Half-built templates are removed too.
//
// Prune judges only what is provably the pool's: names with a lock file or an image in
// .volumes/. Dir is shared with others (the local provider stages host directories and
// keeps private workspaces there, under locks of their own): a directory or a mount
// point in Dir that the pool has no record of is never touched.
func (p *Pool) Prune() error {
	names := map[string]bool{}
	ents, err := os.ReadDir(filepath.Join(p.cfg.Dir, ".volumes"))
	if err != nil {
		return fmt.Errorf("prune volumes: %w", err)
	}
	var errs []error
	for _, e := range ents {
		n := e.Name()
		if base, _, ok := strings.Cut(n, ".img."); ok && strings.HasSuffix(n, trashSuffix) {
			// Being deleted by its Close (which holds the name's lock until it is gone), or
			// left by a process that died first: clean decides, under the lock.
			names[base] = true
		} else if base, ok := strings.CutSuffix(n, ".lock"); ok {
			names[base] = true
		} else if base, ok := strings.CutSuffix(n, ".img"); ok {
			names[base] = true
		}
	}
	for n := range names {
		if !validName(n) {
			continue
		}
		lock, err := p.lock(n)
		if errors.Is(err, ErrInUse) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", n, err))
			continue
		}
		found, err := p.clean(n)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", n, err))
			_ = lock.Release()
		} else if err := lock.Remove(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", n, err))
		} else if found {
			// (Nothing found: its owner closed it between our listing and our lock.)
			p.log.Info("removed workspace volume left by a dead process", "name", n)
		}
	}
	// Half-built templates and their mount points; one another live process is building
	// now is young, and left alone.
	tmps, _ := filepath.Glob(filepath.Join(p.cfg.Dir, ".templates", "*.tmp-*"))
	mnts, _ := filepath.Glob(filepath.Join(p.cfg.Dir, ".templates", "mnt-*"))
	for _, t := range append(mnts, tmps...) {
		if fi, err := os.Lstat(t); err != nil || time.Since(fi.ModTime()) < 10*time.Minute {
			continue
		}
		if err := unmount(t); err != nil {
			errs = append(errs, err)
		} else if err := os.Remove(t); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("prune volumes: %w", err)
	}
	return nil
}

// Size is the size of the pool's volumes in bytes.
func (p *Pool) Size() int64 { return p.cfg.Size }

// String describes the pool for logs.
func (p *Pool) String() string {
	return "ext4 on loop, " + strconv.FormatInt(p.cfg.Size>>20, 10) + " MiB per workspace, in " + p.cfg.Dir
}
