//go:build linux

package toolhost

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/toolhost/toolhost/internal/testenv"
)

// bindMount mounts src on a new empty directory (under t's temporary directory, or at
// target when given) for the rest of t, and returns where.
func bindMount(t *testing.T, src, target string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Skipf(t, "needs root: bind mounts (CI runs as root)")
	}
	if target == "" {
		target = t.TempDir()
	} else if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		testenv.Skipf(t, "a bind mount: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(target, unix.MNT_DETACH) })
	return target
}

// refused checks that CheckWorkspace refuses ws naming what.
func refused(t *testing.T, cfg Config, ws, what, why string) {
	t.Helper()
	err := cfg.CheckWorkspace(ws, "")
	if err == nil || !strings.Contains(err.Error(), what) {
		t.Errorf("%s (%s): %v, want a refusal naming %q", why, ws, err, what)
	}
}

// TestWorkspaceMayNotHoldTheSessionDaemon: a workspace that holds the session daemon's
// directory (or the user's runtime dir around it) would let its sandbox, running as this
// user, reach the daemon's socket and open a session on any host directory. It is refused
// whether it is the directory, an ancestor of it, or lies inside it, and however the path
// is spelled: through a link, `..`, a bind mount of the workspace elsewhere, a bind mount
// inside the workspace, or a runtime dir that is itself a bind mount of a directory of
// the workspace. Whether the directory exists yet does not matter.
func TestWorkspaceMayNotHoldTheSessionDaemon(t *testing.T) {
	cfg := testConfig(t)
	base := t.TempDir()
	rt := filepath.Join(base, "run")
	if err := os.Mkdir(rt, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv("XDG_RUNTIME_DIR", rt)
	const what = "the session daemon's directory"
	dd := filepath.Join(rt, "toolhost")

	refused(t, cfg, base, what, "an ancestor of the daemon's directory, which does not exist yet")
	if err := os.Mkdir(dd, 0o700); err != nil {
		t.Fatal(err)
	}
	refused(t, cfg, base, what, "an ancestor of the daemon's directory")
	refused(t, cfg, rt, what, "the runtime dir")
	refused(t, cfg, dd, what, "the daemon's directory itself")
	refused(t, cfg, filepath.Join(dd, "x"), "host's own state", "a directory inside the daemon's")
	refused(t, cfg, filepath.Join(rt, "..", "run", "..")+"/", what, "spelled with ..")
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(base, link); err != nil {
		t.Fatal(err)
	}
	refused(t, cfg, link, what, "through a link")
	if err := cfg.CheckWorkspace(t.TempDir(), ""); err != nil {
		t.Errorf("a workspace beside the runtime dir: %v", err)
	}

	t.Run("bind mounts", func(t *testing.T) {
		refused(t, cfg, bindMount(t, base, ""), what, "a bind mount of an ancestor of the daemon's directory")

		ws := t.TempDir()
		bindMount(t, rt, filepath.Join(ws, "mnt"))
		refused(t, cfg, ws, what, "a workspace with the runtime dir mounted inside")

		// The runtime dir is a directory of the workspace, mounted elsewhere.
		ws = t.TempDir()
		inner := filepath.Join(ws, "deep", "run")
		if err := os.MkdirAll(filepath.Join(inner, "toolhost"), 0o700); err != nil {
			t.Fatal(err)
		}
		t.Setenv("XDG_RUNTIME_DIR", bindMount(t, inner, ""))
		refused(t, cfg, ws, what, "a workspace holding the source of the runtime dir's bind mount")
		refused(t, cfg, filepath.Join(inner, "toolhost", "x"), "host's own state", "inside the daemon's directory by its other path")
	})
}

// TestTrustCheckSeesThroughBindMounts: the host's state reached through a bind mount is
// the same state: a workspace that is a bind mount of a directory holding the data dir,
// or that lies inside the data dir by another path, is refused like the plain path.
func TestTrustCheckSeesThroughBindMounts(t *testing.T) {
	cfg := testConfig(t)
	top := t.TempDir()
	cfg.DataDir = filepath.Join(top, "data")
	if err := os.Mkdir(cfg.DataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	refused(t, cfg, bindMount(t, top, ""), "the data dir", "a bind mount of the data dir's parent")
	alias := bindMount(t, cfg.DataDir, "")
	refused(t, cfg, alias, "the data dir", "a bind mount of the data dir")
	if err := os.Mkdir(filepath.Join(cfg.DataDir, "w"), 0o700); err != nil {
		t.Fatal(err)
	}
	refused(t, cfg, filepath.Join(alias, "w"), "host's own state", "inside the data dir through its bind mount")

	// The local sandboxes stage each host workspace in their workspace dir (a mount of it
	// there): a live session's staging does not put its workspace "inside" the host's
	// state, so another session may open on the same directory.
	cfg = testConfig(t)
	wd := t.TempDir()
	if err := cfg.Set("sandbox.workspace_dir", wd); err != nil {
		t.Fatal(err)
	}
	ws := t.TempDir()
	bindMount(t, ws, filepath.Join(wd, "local-0123456789ab"))
	if err := cfg.CheckWorkspace(ws, ""); err != nil {
		t.Errorf("a workspace staged in the sandboxes' workspace dir: %v", err)
	}
}

// TestWorkspaceMayNotHoldARegistryKey: a sandbox that could write a key registry.keys
// trusts could sign the plugins the next plugin add installs.
func TestWorkspaceMayNotHoldARegistryKey(t *testing.T) {
	cfg := testConfig(t)
	ws := t.TempDir()
	cfg.Registry.Keys = []string{filepath.Join(ws, "keys", "author.pub")}
	if err := cfg.CheckWorkspace(ws, ""); err == nil || !strings.Contains(err.Error(), "registry.keys") {
		t.Errorf("a workspace holding a trusted signing key: %v", err)
	}
}
