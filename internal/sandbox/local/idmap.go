//go:build linux

package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/toolhost/toolhost/internal/module"
)

// A host directory given as the workspace keeps its owners. As root, bwrap runs as the
// sandbox user's unprivileged host uid, which may not write the caller's files; rather than
// re-own them (what --adopt does), the directory is attached through an idmapped mount
// (Linux 5.12, mount_setattr with MOUNT_ATTR_IDMAP) whose map sends the directory owner's
// uid and gid onto the sandbox user's. Through that mount the sandbox user is the owner:
// it reads and writes what the owner may, files it creates are the owner's on disk, and not
// a byte of ownership changes. Entries of other uids stay theirs (the sandbox sees them as
// nobody and gets the rights "others" have). The mount is nosuid and nodev, and the
// sandbox's seccomp filter refuses to make anything setuid or setgid, which matters here:
// the sandbox acts as the owner, root included when root owns the directory.

// errIdmapDisabled stands for "this filesystem refuses idmapped mounts" in tests that need
// the refusal path on a machine where they work.
var errIdmapDisabled = errors.New("idmapped mounts disabled for this test")

// idmappedTree makes a detached copy of the mount tree at dir whose every mount is
// idmapped (dir's owner -> the sandbox user's uid, dir's group -> its gid), nosuid and
// nodev, and returns it with the owner and group it mapped, read from the very directory
// the copy shows. The caller attaches it with move_mount, or closes it, which drops it.
// The user namespace that carries the map comes from maps; the mount keeps a reference of
// its own, so it may be closed once the mount is made.
//
// recursive copies the mounts below dir too (a workspace, whose submounts the sandbox must
// see); without it, only dir's own mount is copied (the doctor's probe of a filesystem:
// the workspace dir holds other sandboxes' mounts, some idmapped already, which the kernel
// refuses to idmap again, EPERM).
func (id identity) idmappedTree(ctx context.Context, maps *usernsCache, dir string, recursive bool) (tree *os.File, uid, gid int, err error) {
	flags := unix.OPEN_TREE_CLONE | unix.OPEN_TREE_CLOEXEC | unix.AT_SYMLINK_NOFOLLOW
	setFlags := unix.AT_EMPTY_PATH
	if recursive {
		flags |= unix.AT_RECURSIVE
		setFlags |= unix.AT_RECURSIVE
	}
	fd, err := unix.OpenTree(unix.AT_FDCWD, dir, uint(flags))
	if err != nil {
		return nil, -1, -1, fmt.Errorf("open_tree: %w", err)
	}
	tree = os.NewFile(uintptr(fd), "idmapped "+dir)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		tree.Close()
		return nil, -1, -1, err
	}
	uid, gid = int(st.Uid), int(st.Gid)
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		tree.Close()
		return nil, uid, gid, errors.New("not a directory")
	}
	err = maps.with(ctx, [4]int{uid, id.uid, gid, id.gid}, func(userns *os.File) error {
		attr := unix.MountAttr{
			Attr_set:  unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV,
			Userns_fd: uint64(userns.Fd()),
		}
		if err := unix.MountSetattr(fd, "", uint(setFlags), &attr); err != nil {
			return fmt.Errorf("mount_setattr MOUNT_ATTR_IDMAP: %w", err)
		}
		return nil
	})
	if err != nil {
		tree.Close()
		return nil, uid, gid, err
	}
	return tree, uid, gid, nil
}

// usernsCache keeps the user namespaces that carry the mappings of idmapped mounts, one
// per mapping, for its owner's life (the provider's: Provider.Close closes it): making one
// starts a process, which costs 10-100 ms on a loaded machine, and a workspace's owner is
// mapped again at every sandbox over it. A nil cache makes a namespace for each use and
// closes it after.
type usernsCache struct {
	mu     sync.Mutex
	m      map[[4]int]*os.File // {uid inside, uid outside, gid inside, gid outside}
	closed bool
}

// maxUserns bounds the namespaces kept: past it, one is made for each use.
const maxUserns = 32

// with calls fn with a descriptor of a user namespace mapping k, under the cache's lock
// (Close cannot close it meanwhile).
func (c *usernsCache) with(ctx context.Context, k [4]int, fn func(*os.File) error) error {
	if c == nil {
		ns, err := mappingUserns(ctx, k[0], k[1], k[2], k[3])
		if err != nil {
			return fmt.Errorf("a user namespace for the mapping: %w", err)
		}
		defer ns.Close()
		return fn(ns)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ns := c.m[k]
	if ns == nil {
		var err error
		if ns, err = mappingUserns(ctx, k[0], k[1], k[2], k[3]); err != nil {
			return fmt.Errorf("a user namespace for the mapping: %w", err)
		}
		if c.closed || len(c.m) >= maxUserns {
			defer ns.Close()
		} else {
			if c.m == nil {
				c.m = map[[4]int]*os.File{}
			}
			c.m[k] = ns
		}
	}
	return fn(ns)
}

// close closes every namespace kept; later uses make their own.
func (c *usernsCache) close() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var err error
	for k, ns := range c.m {
		err = errors.Join(err, ns.Close())
		delete(c.m, k)
	}
	c.closed = true
	return err
}

// idmapMount attaches dir at target (an empty directory) through an idmapped mount, and
// returns the owner and group it mapped onto the sandbox user (-1 when it could not read
// them).
func (id identity) idmapMount(ctx context.Context, maps *usernsCache, dir, target string) (uid, gid int, err error) {
	tree, uid, gid, err := id.idmappedTree(ctx, maps, dir, true)
	if err != nil {
		return uid, gid, err
	}
	defer tree.Close()
	if err := unix.MoveMount(int(tree.Fd()), "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return uid, gid, fmt.Errorf("move_mount: %w", err)
	}
	return uid, gid, nil
}

// probeIdmap reports whether dir could be attached through an idmapped mount, as a
// workspace would be, by making the mount and dropping it unattached: nothing is written.
func (id identity) probeIdmap(ctx context.Context, dir string) error {
	if !id.root {
		return errors.New("not running as root")
	}
	tree, _, _, err := id.idmappedTree(ctx, nil, dir, false)
	if err != nil {
		return err
	}
	return tree.Close()
}

// ownersCheck is the doctor's line on host directories' owners: how a host directory given
// as the workspace is attached here, tried for real on the workspace dir and on the
// current directory (where `--workspace .` points).
func (p *Provider) ownersCheck(ctx context.Context) module.Check {
	c := module.Check{Name: "owners"}
	if !p.id.root {
		c.OK = true
		c.Detail = fmt.Sprintf("not running as root: a host directory is used as it is (the sandbox user is this user, uid %d); no owner changes", p.id.uid)
		return c
	}
	dirs := [][2]string{{"the workspace dir", p.wsDir}}
	if wd, err := os.Getwd(); err == nil && wd != p.wsDir {
		dirs = append(dirs, [2]string{"the current directory", wd})
	}
	var ok, failed []string
	for _, d := range dirs {
		if err := p.id.probeIdmap(ctx, d[1]); err != nil {
			failed = append(failed, fmt.Sprintf("%s (%s): %v", d[0], d[1], err))
		} else {
			ok = append(ok, d[0])
		}
	}
	if len(failed) == 0 {
		c.OK = true
		c.Detail = fmt.Sprintf("idmapped mounts work on %s: a host directory there keeps its owners (the sandbox user, uid %d, acts as the directory's owner)", strings.Join(ok, " and "), p.id.uid)
		return c
	}
	then := "a host directory there is refused unless --adopt (sandbox.adopt) lets toolhost hand what root owns in it to the sandbox user"
	if p.cfg.Adopt {
		then = fmt.Sprintf("sandbox.adopt is on: what root owns in a host directory there is handed to the sandbox user (uid %d) for good", p.id.uid)
	}
	c.Detail = "idmapped mounts fail on " + strings.Join(failed, "; ") + "; " + then
	return c
}

// mappingUserns returns a descriptor of a new user namespace whose only mappings are
// uid inside -> uidOut and gid inside -> gidOut (host ids), the form mount_setattr wants
// for an idmapped mount. A user namespace exists only while something is in it or refers
// to it, and a Go process cannot unshare one itself (it has many threads), so a child
// is started in it (Go writes the maps before the child runs), the namespace is opened
// through /proc, and the child is ended; the returned descriptor keeps the namespace, and
// whoever receives it closes it.
func mappingUserns(ctx context.Context, uidIn, uidOut, gidIn, gidOut int) (*os.File, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second) // a hang bound: the child only waits
	defer cancel()
	cat, err := exec.LookPath("cat")
	if err != nil {
		return nil, err
	}
	// The child reads its stdin until we close it: it is in the namespace until then.
	cmd := exec.CommandContext(ctx, cat)
	cmd.WaitDelay = 5 * time.Second
	cmd.Dir = "/"
	cmd.Env = []string{}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: uidIn, HostID: uidOut, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: gidIn, HostID: gidOut, Size: 1}},
		Pdeathsig:   syscall.SIGKILL,
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		stdin.Close()
		return nil, err
	}
	ns, openErr := os.Open(filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "ns", "user"))
	stdin.Close()
	if err := cmd.Wait(); err != nil && openErr == nil {
		// The namespace is open; how its placeholder ended does not matter unless it
		// never ran (then the descriptor may name the wrong namespace).
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			ns.Close()
			return nil, err
		}
	}
	if openErr != nil {
		return nil, openErr
	}
	return ns, nil
}
