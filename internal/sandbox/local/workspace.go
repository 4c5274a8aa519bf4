//go:build linux

package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

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
//     host runs as root, bwrap runs as the sandbox's unprivileged uid, which must be able to
//     reach the directory and act as its owner, so it is mounted at a private path under
//     the workspace dir first: an idmapped mount (idmap.go), or with Config.Adopt a plain
//     bind of the re-owned directory (mount points are not renamed or removed while
//     mounted: the staging path stays put).
type workspace struct {
	path  string         // what bwrap binds at /home/user
	kind  string         // "volume", "private" or "host"
	vol   *volume.Volume // kind volume
	host  string         // kind host: the caller's directory
	stage bool           // path is a bind mount of host made for this workspace
	idmap bool           // stage is an idmapped mount: the sandbox user acts as host's owner
	lock  *lockfile.Lock // held while this process owns path (see prune); nil for volumes
}

// newWorkspace prepares the workspace for a new sandbox named id.
func (p *Provider) newWorkspace(ctx context.Context, id, hostDir string) (*workspace, error) {
	if hostDir != "" {
		return p.hostWorkspace(ctx, id, hostDir)
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

// hostWorkspace prepares a caller's directory. Not as root it is used as it is: the sandbox
// user is the host user. As root it is attached under the run dir through an idmapped
// mount that makes the sandbox user its owner (idmap.go), so no owner changes on disk;
// where that cannot be done, it is handed to the sandbox user (identity.adopt) only when
// Config.Adopt says so, and refused otherwise.
func (p *Provider) hostWorkspace(ctx context.Context, id, dir string) (*workspace, error) {
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
	uid, idErr := -1, errIdmapDisabled
	if !p.noIdmap {
		uid, _, idErr = p.id.idmapMount(ctx, &p.userns, abs, stage)
	} else if st, err := os.Stat(abs); err == nil {
		uid = int(st.Sys().(*syscall.Stat_t).Uid)
	}
	if idErr == nil {
		w.path, w.stage, w.idmap = stage, true, true
		return w, nil
	}
	if !p.cfg.Adopt {
		os.Remove(stage)
		w.unlock()
		return nil, fmt.Errorf("%w: workspace %s belongs to uid %d and the sandbox user (uid %d) cannot be mapped onto it here (idmapped mount: %w). "+
			"toolhost changes no owner on its own: use a directory on a filesystem that supports idmapped mounts (ext4, xfs, btrfs, tmpfs; Linux 5.12 or later), "+
			"or pass --adopt (sandbox.adopt: true) to hand every entry root owns in it to the sandbox user for good",
			ErrOwnersKept, abs, uid, p.id.uid, idErr)
	}
	p.log.Warn("workspace adopted: entries root owned now belong to the sandbox user", "workspace", abs, "sandbox_uid", p.id.uid, "why", idErr)
	if err := p.id.adopt(abs); err != nil {
		os.Remove(stage)
		w.unlock()
		return nil, fmt.Errorf("workspace %s: hand it to the sandbox user: %w", abs, err)
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

// ErrOwnersKept: as root, a host directory could not be attached through an idmapped mount
// and Config.Adopt is off, so it was refused rather than re-owned.
var ErrOwnersKept = errors.New("host directory not re-owned")

// release gives the workspace back: a volume is unmounted and deleted, a private directory
// removed, a staged host directory unmounted (the directory itself stays, it is the
// caller's). Every process that used it must be dead.
func (w *workspace) release() error {
	var err error
	switch {
	case w.kind == "volume":
		err = closeVolume(w.vol)
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

// closeVolume closes a workspace volume: a sandbox's, or the spare made ahead. A
// filesystem that outlives the close in another mount namespace is no failure of it:
// every process of the sandbox is dead, or frozen and about to be killed (Close kills
// first; a handoff freezes the old sandbox and kills it after), and the copies other
// namespaces held on the mount point went with it (volume.Close); what still holds it is
// a namespace the kernel has not torn down yet, or a process of the host's that is none
// of this provider's (the volume's log names it). The volume did its part (image
// unlinked, device cleared with the last holder); nothing is left for this host to do.
func closeVolume(v *volume.Volume) error {
	if err := v.Close(); !errors.Is(err, volume.ErrMountedElsewhere) {
		return err
	}
	return nil
}

// unlock drops the workspace's lock file.
func (w *workspace) unlock() {
	if w.lock == nil {
		return
	}
	_ = w.lock.Remove()
	w.lock = nil
}
