//go:build linux

package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/toolhost/toolhost/internal/lockfile"
)

// prepareDirs makes the run dir and the workspace dir, or checks the ones that exist: the
// host's private state must not be something another user made or can write.
func (p *Provider) prepareDirs() error {
	run, err := filepath.Abs(p.cfg.RunDir)
	if err != nil {
		return fmt.Errorf("run dir: %w", err)
	}
	if err := p.id.privateDir(run, 0o700, false); err != nil {
		return fmt.Errorf("run dir: %w", err)
	}
	p.sbDir = filepath.Join(run, "sandboxes")
	if err := p.id.privateDir(p.sbDir, 0o700, false); err != nil {
		return fmt.Errorf("run dir: %w", err)
	}
	ws, err := filepath.Abs(p.cfg.WorkspaceDir)
	if err != nil {
		return fmt.Errorf("workspace dir: %w", err)
	}
	if p.id.root {
		if err := p.id.privateDir(ws, 0o710, true); err != nil {
			return fmt.Errorf("workspace dir: %w", err)
		}
		if err := p.id.reachable(ws); err != nil {
			return fmt.Errorf("workspace dir %s: %w", ws, err)
		}
	} else if err := p.id.privateDir(ws, 0o700, false); err != nil {
		return fmt.Errorf("workspace dir: %w", err)
	}
	p.wsDir = ws
	return nil
}

// privateDir creates dir (and its parents) with mode, or checks an existing one: a real
// directory, not a symbolic link, owned by this process's user and writable by no one
// else; then sets its mode. With sandboxGroup (as root) its group becomes the sandbox
// user's, so bubblewrap, running as that user, can pass through to a workspace.
func (id identity) privateDir(dir string, mode os.FileMode, sandboxGroup bool) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(dir, mode); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return err
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return fmt.Errorf("%s exists and is not a directory (a symbolic link or a file): refusing to use it", dir)
	case int(st.Uid) != os.Geteuid():
		return fmt.Errorf("%s belongs to uid %d, not to this user (uid %d): refusing to use it; remove it or choose another directory", dir, st.Uid, os.Geteuid())
	case st.Mode&0o022 != 0:
		return fmt.Errorf("%s is writable by its group or by others (mode %#o): refusing to use it; remove it or choose another directory", dir, st.Mode&0o777)
	}
	if sandboxGroup {
		if err := unix.Lchown(dir, -1, id.gid); err != nil {
			return err
		}
	}
	return os.Chmod(dir, mode)
}

// reachable checks that the sandbox user can walk down to dir: bubblewrap runs as that
// user and resolves the workspace's path itself.
func (id identity) reachable(dir string) error {
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		var st unix.Stat_t
		if err := unix.Stat(d, &st); err != nil {
			return err
		}
		ok := st.Mode&0o001 != 0 || (int(st.Gid) == id.gid && st.Mode&0o010 != 0) || (int(st.Uid) == id.uid && st.Mode&0o100 != 0)
		if !ok {
			return fmt.Errorf("the sandbox user (uid %d) cannot pass through %s (mode %#o): choose a workspace dir below directories anyone may enter, such as /var/tmp", id.uid, d, st.Mode&0o777)
		}
		if d == "/" {
			return nil
		}
	}
}

// Each sandbox and each workspace holds a lock file for as long as its process owns it,
// so that prune can tell what a crashed toolhost left behind from what another live one
// is using (they may share the directories): see internal/lockfile, whose lock files are
// locked from birth and removed only by whoever holds them.
const lockSuffix = ".toolhost-lock"

// holdLock creates the lock file at path, recording kind, locked from its birth.
func holdLock(path, kind string) (*lockfile.Lock, error) {
	return lockfile.Create(path, []byte(kind))
}

// prune removes what crashed toolhost processes left in the run and workspace dirs:
// sandbox run dirs, staged mounts of host directories (unmounted, never deleted: the
// directory is the caller's), private workspaces, and stale volumes. It touches only what
// it can prove dead (a lock file whose lock it takes) and only its own kinds.
func (p *Provider) prune() {
	ents, _ := os.ReadDir(p.sbDir)
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(p.sbDir, e.Name())
		lock, _, err := lockfile.Stale(filepath.Join(dir, "lock"+lockSuffix))
		if err != nil {
			continue // alive, or not (yet) locked: nothing proves it dead
		}
		_ = os.RemoveAll(dir) // the lock file with it: we hold it
		_ = lock.Release()
		p.log.Info("removed a stale sandbox run dir", "dir", e.Name())
	}
	ents, _ = os.ReadDir(p.wsDir)
	for _, e := range ents {
		name, isLock := strings.CutSuffix(e.Name(), lockSuffix)
		if !isLock || strings.HasPrefix(e.Name(), lockfile.TempPrefix) {
			continue
		}
		lock, kindb, err := lockfile.Stale(filepath.Join(p.wsDir, e.Name()))
		if err != nil {
			continue
		}
		kind := string(kindb)
		dir := filepath.Join(p.wsDir, name)
		switch kind {
		case "host": // a staged bind mount: unmount it; what it showed stays where it is
			if uerr := unix.Unmount(dir, unix.MNT_DETACH); uerr != nil && !errors.Is(uerr, unix.EINVAL) && !errors.Is(uerr, unix.ENOENT) {
				err = uerr
			} else if rerr := os.Remove(dir); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
				err = rerr
			}
		case "private":
			if isMountPoint(dir) {
				err = errors.New("it is a mount point; leaving it")
			} else {
				err = os.RemoveAll(dir)
			}
		default:
			err = fmt.Errorf("unknown kind %q", kind)
		}
		if err == nil {
			_ = lock.Remove()
			p.log.Info("removed a stale workspace", "kind", kind, "dir", dir)
		} else {
			_ = lock.Release()
			p.log.Warn("stale workspace not removed", "kind", kind, "dir", dir, "err", err)
		}
	}
	p.pruneSlots() // before the volumes: a stale slot may hold a stale volume's mount
	if p.volumes != nil {
		if err := p.volumes.Prune(); err != nil {
			p.log.Warn("pruning stale workspace volumes", "err", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.cgroups.Prune(ctx); err != nil {
		p.log.Warn("pruning stale sandbox cgroups", "err", err)
	}
}

// isMountPoint reports whether dir is on another filesystem than its parent.
func isMountPoint(dir string) bool {
	var a, b unix.Stat_t
	if unix.Lstat(dir, &a) != nil || unix.Lstat(filepath.Dir(dir), &b) != nil {
		return false
	}
	return a.Dev != b.Dev
}

// pruneSlots unmounts and removes the slots (slot.go) of spares a dead process left. Like
// prune, it touches only a slot whose lock file it can lock: a live process's spare (this
// host's or another toolhost's sharing the directory) holds its lock for the slot's life.
func (p *Provider) pruneSlots() {
	dir := filepath.Join(p.wsDir, slotsDir)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		name, isLock := strings.CutSuffix(e.Name(), lockSuffix)
		if !isLock || !strings.HasPrefix(name, slotPrefix) {
			continue
		}
		lock, _, err := lockfile.Stale(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // alive, or not (yet) locked: nothing proves it dead
		}
		path := filepath.Join(dir, name)
		for range 2 { // a workspace attached, then the slot's tmpfs
			if uerr := unix.Unmount(path, unix.MNT_DETACH); uerr != nil {
				if !errors.Is(uerr, unix.EINVAL) && !errors.Is(uerr, unix.ENOENT) {
					err = uerr
				}
				break
			}
		}
		if err == nil {
			if rerr := os.Remove(path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
				err = rerr
			}
		}
		if err == nil {
			_ = lock.Remove()
			p.log.Info("removed a stale spare's slot", "dir", path)
		} else {
			_ = lock.Release()
			p.log.Warn("stale slot not removed", "dir", path, "err", err)
		}
	}
}
