//go:build linux

package local

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/toolhost/toolhost/internal/lockfile"
)

// A pooled sandbox starts before anyone has asked for it, so before it has a workspace.
// bwrap binds a slot at /home/user instead: a tiny tmpfs the host mounts for that sandbox
// and makes a shared mount. bwrap marks every mount of the sandbox a slave of the host's
// (so that the host's mounts still reach it and none of the sandbox's reach the host), so
// the workspace the host mounts on the slot when the sandbox is taken appears at
// /home/user inside, with the flags and idmapping its mount has on the host. A tmpfs and
// not a directory, so that the sandbox's mountinfo names no host path, and so that nothing
// is on the host's disk below it.
type slot struct {
	path string

	mu       sync.Mutex     // attach (a take-over) and release (a shutdown) may race
	lock     *lockfile.Lock // held while this process owns the slot (see pruneSlots)
	released bool
}

const slotPrefix = "slot-"

// slotsDir holds the slots, in the workspace dir: a directory of its own, so that what
// looks for stale workspaces and volumes there (prune) never takes a live slot for one;
// bubblewrap, running as the sandbox user, passes through it as through the workspace dir.
const slotsDir = ".slots"

// newSlot mounts the slot of the sandbox id, owned by the sandbox user.
func (p *Provider) newSlot(id string) (*slot, error) {
	if !p.id.root {
		return nil, errors.New("slots need root: the host mounts the workspace for the sandbox")
	}
	dir := filepath.Join(p.wsDir, slotsDir)
	if err := p.id.privateDir(dir, 0o710, true); err != nil {
		return nil, fmt.Errorf("slots: %w", err)
	}
	path := filepath.Join(dir, slotPrefix+id)
	lock, err := holdLock(path+lockSuffix, "slot")
	if err != nil {
		return nil, fmt.Errorf("slot: %w", err)
	}
	sl := &slot{path: path, lock: lock}
	if err := os.Mkdir(path, 0o700); err != nil {
		sl.unlock()
		return nil, fmt.Errorf("slot: %w", err)
	}
	opts := "size=4k,nr_inodes=8,mode=0700,uid=" + strconv.Itoa(p.id.uid) + ",gid=" + strconv.Itoa(p.id.gid)
	if err := unix.Mount("none", path, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		_ = os.Remove(path)
		sl.unlock()
		return nil, fmt.Errorf("slot: mount a tmpfs on %s: %w", path, err)
	}
	if err := unix.Mount("", path, "", unix.MS_SHARED, ""); err != nil {
		_ = sl.release()
		return nil, fmt.Errorf("slot: make %s a shared mount: %w", path, err)
	}
	return sl, nil
}

// attach mounts ws on the slot: a clone of its mount (a volume, a staged host directory)
// or a bind mount of its directory, nosuid and nodev whatever its source is. The clone is
// made detached (open_tree) and given its flags before it is attached (move_mount), since a
// remount after the fact would not propagate into the sandbox. A clone keeps the idmapping
// of what it copies: a host directory staged through an idmapped mount (idmap.go) keeps its
// owners in a taken spare exactly as in a sandbox started on it (TestPoolHostDirOwnersKept).
func (sl *slot) attach(ws *workspace) error {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if sl.released {
		return errors.New("attach the workspace: the sandbox has ended")
	}
	fd, err := unix.OpenTree(unix.AT_FDCWD, ws.path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return fmt.Errorf("attach the workspace: clone its mount: %w", err)
	}
	defer unix.Close(fd)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		return fmt.Errorf("attach the workspace: make it nosuid: %w", err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, sl.path, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach the workspace: mount it on the slot: %w", err)
	}
	return nil
}

// release unmounts the workspace (if attached) and the slot, and removes it. Every
// process of the sandbox must be dead: the workspace is then free for a handoff.
func (sl *slot) release() error {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if sl.released {
		return nil
	}
	sl.released = true
	var err error
	for range 2 {
		if uerr := unix.Unmount(sl.path, unix.MNT_DETACH); uerr != nil {
			if !errors.Is(uerr, unix.EINVAL) && !errors.Is(uerr, unix.ENOENT) {
				err = errors.Join(err, fmt.Errorf("unmount %s: %w", sl.path, uerr))
			}
			break
		}
	}
	if rerr := os.Remove(sl.path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	sl.unlock()
	return err
}

func (sl *slot) unlock() {
	if sl.lock != nil {
		_ = sl.lock.Remove()
		sl.lock = nil
	}
}
