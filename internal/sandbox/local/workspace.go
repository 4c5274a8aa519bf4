//go:build linux

package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/toolhost/toolhost/internal/lockfile"
	"github.com/toolhost/toolhost/internal/volume"
)

// workspace is the host directory a sandbox sees at /home/user. It is its own object, not a
// part of the sandbox, because it outlives sandboxes: a handoff passes it from one sandbox to
// the next, and one whose sandbox died is kept until Close so the work can be handed over.
//
// Three kinds:
//   - a volume: a private workspace on its own small ext4 filesystem (internal/volume),
//     which is how the disk limit is enforced (this kernel, like many, has no directory
//     quotas) and why nothing on it is ever setuid or a device on the host (nosuid,nodev);
//   - a private directory under the run dir, when volumes are unavailable (not root, no
//     loop devices): the disk limit is then not enforced, and the provider said so at start;
//   - a host directory the caller chose (CreateOptions.Workspace), never deleted. When the
//     host runs as root, bwrap runs as the sandbox's unprivileged uid and must be able to
//     reach the directory, so it is bind-mounted at a private path under the run dir first
//     (mount points are not renamed or removed while mounted: the staging path stays put).
type workspace struct {
	path  string         // what bwrap binds at /home/user
	kind  string         // "volume", "private" or "host"
	vol   *volume.Volume // kind volume
	host  string         // kind host: the caller's directory
	stage bool           // path is a bind mount of host made for this workspace
	lock  *lockfile.Lock // held while this process owns path (see prune); nil for volumes
}

// newWorkspace prepares the workspace for a new sandbox named id.
func (p *Provider) newWorkspace(ctx context.Context, id, hostDir string) (*workspace, error) {
	if hostDir != "" {
		return p.hostWorkspace(id, hostDir)
	}
	if p.spare != nil {
		v, err := p.spare.take(ctx)
		if err == nil {
			return &workspace{path: v.Path(), kind: "volume", vol: v}, nil
		}
		// Volumes worked at start (the provider checked); a failure now is worth a loud
		// line, but the sandbox can still run without its disk limit.
		p.log.Warn("workspace volume failed; this sandbox's disk use is not limited", "sandbox", id, "err", err)
	}
	dir := filepath.Join(p.wsDir, id)
	lock, err := holdLock(dir+lockSuffix, "private")
	if err != nil {
		return nil, fmt.Errorf("private workspace: %w", err)
	}
	w := &workspace{path: dir, kind: "private", lock: lock}
	if err := os.Mkdir(dir, 0o700); err != nil {
		w.unlock()
		return nil, fmt.Errorf("create private workspace: %w", err)
	}
	if err := p.id.ownRoot(dir); err != nil {
		os.Remove(dir)
		w.unlock()
		return nil, fmt.Errorf("private workspace: %w", err)
	}
	return w, nil
}

// hostWorkspace prepares a caller's directory. As root it is handed to the sandbox user
// (see identity.adopt) and staged under the run dir; otherwise it is used as it is.
func (p *Provider) hostWorkspace(id, dir string) (*workspace, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("workspace: %w", err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("create workspace: %w", err)
	}
	if abs, err = filepath.EvalSymlinks(abs); err != nil {
		return nil, fmt.Errorf("resolve workspace: %w", err)
	}
	w := &workspace{path: abs, kind: "host", host: abs}
	if !p.id.root {
		return w, nil
	}
	if err := p.id.adopt(abs); err != nil {
		return nil, fmt.Errorf("workspace %s: hand it to the sandbox user: %w", abs, err)
	}
	stage := filepath.Join(p.wsDir, id)
	lock, err := holdLock(stage+lockSuffix, "host")
	if err != nil {
		return nil, fmt.Errorf("workspace %s: %w", abs, err)
	}
	w.lock = lock
	if err := os.Mkdir(stage, 0o700); err != nil {
		w.unlock()
		return nil, fmt.Errorf("workspace %s: staging directory: %w", abs, err)
	}
	if err := unix.Mount(abs, stage, "", unix.MS_BIND, ""); err != nil {
		os.Remove(stage)
		w.unlock()
		return nil, fmt.Errorf("workspace %s: bind it at %s: %w", abs, stage, err)
	}
	w.path, w.stage = stage, true
	// A second call makes the bind mount nosuid and nodev: nothing the sandbox leaves there
	// runs setuid or opens a device through this path.
	if err := unix.Mount("", stage, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		_ = w.release()
		return nil, fmt.Errorf("workspace %s: make the bind mount nosuid: %w", abs, err)
	}
	return w, nil
}

// release gives the workspace back: a volume is unmounted and deleted, a private directory
// removed, a staged host directory unmounted (the directory itself stays, it is the
// caller's). Every process that used it must be dead.
func (w *workspace) release() error {
	var err error
	switch {
	case w.kind == "volume":
		err = w.vol.Close()
		if errors.Is(err, volume.ErrMountedElsewhere) {
			// Every process of the sandbox is dead (Close and Handoff kill first): what
			// holds the filesystem is a mount namespace the kernel has not torn down yet,
			// or another sandbox's being set up. The volume did its part (image unlinked,
			// device cleared with the last mount); nothing is left for this host to do.
			err = nil
		}
	case w.kind == "private":
		err = os.RemoveAll(w.path)
	case w.stage:
		if uerr := unix.Unmount(w.path, 0); uerr != nil && !errors.Is(uerr, unix.EINVAL) {
			// Still mounted: keep the lock file too, so a later prune finds it.
			return fmt.Errorf("unmount the staged workspace %s: %w", w.path, uerr)
		}
		if rerr := os.Remove(w.path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			err = rerr
		}
	}
	if err == nil {
		w.unlock()
	}
	return err
}

// unlock drops the workspace's lock file.
func (w *workspace) unlock() {
	if w.lock == nil {
		return
	}
	_ = w.lock.Remove()
	w.lock = nil
}
