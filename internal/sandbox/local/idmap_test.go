//go:build linux

package local

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/testenv"
)

// A uid and gid that exist only as numbers: the owner of the test's host directory, neither
// root nor the sandbox user. other is a third user whose entries must stay his.
const (
	ownerID = 4242
	otherID = 5151
)

// ownProvider is a provider with a workspace dir of its own and no volumes (host
// directories never use them), so a test can see everything left in it.
func ownProvider(t *testing.T, cfg Config) (*Provider, string) {
	t.Helper()
	if cfg.WorkspaceDir == "" {
		_, cfg.WorkspaceDir = sharedDirs(t)
	}
	cfg.Limits.DiskBytes = -1
	return newProvider(t, cfg), cfg.WorkspaceDir
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Skipf(t, "needs root: host directories are mapped onto the sandbox user only when toolhost runs as root (CI runs as root)")
	}
}

// entry is what must not change about a host file: owner, group, mode.
type entry struct {
	uid, gid uint32
	mode     uint32
}

func lstat(t *testing.T, path string) entry {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return entry{st.Uid, st.Gid, st.Mode}
}

// ownedTree makes, in dir, a tree owned by ownerID with one file and one directory of
// otherID and one file of root, and returns every entry's owner and mode.
func ownedTree(t *testing.T, dir string) map[string]entry {
	t.Helper()
	mk := func(rel string, isDir bool, mode os.FileMode, uid, gid int) {
		p := filepath.Join(dir, rel)
		var err error
		if isDir {
			err = os.Mkdir(p, mode)
		} else {
			err = os.WriteFile(p, []byte(rel+"\n"), mode)
		}
		if err == nil {
			err = os.Chmod(p, mode)
		}
		if err == nil {
			err = os.Lchown(p, uid, gid)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(dir, ownerID, ownerID); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	mk("a.txt", false, 0o640, ownerID, ownerID)
	mk("edit.txt", false, 0o600, ownerID, ownerID)
	mk("del.txt", false, 0o644, ownerID, ownerID)
	mk("sub", true, 0o755, ownerID, ownerID)
	mk("sub/b.txt", false, 0o664, ownerID, ownerID)
	mk("sub/x.sh", false, 0o755, ownerID, ownerID)
	mk("other.txt", false, 0o644, otherID, otherID)
	mk("otherdir", true, 0o777, otherID, otherID)
	mk("root.txt", false, 0o644, 0, 0)
	if err := os.Symlink("a.txt", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(filepath.Join(dir, "link"), ownerID, ownerID); err != nil {
		t.Fatal(err)
	}
	out := map[string]entry{}
	_ = filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err == nil {
			out[p] = lstat(t, p)
		}
		return nil
	})
	return out
}

// diskDir is a directory on a disk filesystem (the checkout's: ext4 here), beside
// t.TempDir()'s (tmpfs here): idmapped mounts are a filesystem's feature, so both are
// tried.
func diskDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp(".", ".idmaptest-")
	if err != nil {
		t.Fatal(err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(abs) })
	return abs
}

func fsType(dir string) string {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil {
		return "unknown"
	}
	switch st.Type {
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	}
	return "other"
}

// mountedAt reports whether the host's mount table has a mount at dir.
func mountedAt(t *testing.T, dir string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}

// TestHostDirectoryKeepsItsOwners: a host directory of uid 4242, used as root, is the
// sandbox user's to work in (it acts as the owner), and after writes, edits, deletes and
// new files from the sandbox not one owner or mode on disk has changed; new files belong
// to 4242; entries of another uid and of root stay theirs and unwritten; nothing becomes
// setuid; after Close no mount is left.
func TestHostDirectoryKeepsItsOwners(t *testing.T) {
	needRoot(t)
	p, _ := ownProvider(t, Config{})
	dirs := []string{t.TempDir(), diskDir(t)}
	if fsType("/dev/shm") == "tmpfs" {
		shm, err := os.MkdirTemp("/dev/shm", "idmaptest-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(shm) })
		dirs = append(dirs, shm)
	}
	for i, dir := range dirs {
		t.Run(fmt.Sprintf("%d-%s", i, fsType(dir)), func(t *testing.T) {
			before := ownedTree(t, dir)
			ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
			defer cancel()
			sbi, err := p.Create(ctx, sandbox.CreateOptions{Workspace: dir})
			if err != nil {
				t.Fatalf("Create: %v", err)
			}
			sb := sbi.(*Sandbox)
			defer sb.Close(context.WithoutCancel(ctx)) // a second Close does nothing; this one is for a failure
			stage := sb.ws.path
			if !sb.ws.idmap || !mountedAt(t, stage) {
				t.Fatalf("the workspace is not an idmapped mount (idmap %v, staged at a mount %v)", sb.ws.idmap, mountedAt(t, stage))
			}
			res := sh(t, sb, `set -e
cd /home/user
echo "me $(id -u) root $(stat -c %u:%g .) a $(stat -c %u a.txt) other $(stat -c %u other.txt) rootfile $(stat -c %u root.txt)"
echo more >> a.txt
sed -i 's/edit/edited/' edit.txt
rm del.txt
echo new > new.txt
mkdir -p newdir/deeper && echo f > newdir/deeper/f
echo "write in other's dir: $( (echo made > otherdir/mine.txt) 2>/dev/null && echo yes || echo no)"
echo "delete other's: $(rm -f other.txt 2>/dev/null && echo yes || echo no) $(mv root.txt r2 2>/dev/null && echo yes || echo no)"
printf '#!/bin/sh\necho ran\n' > sub/x.sh
echo b >> sub/b.txt
ln -s new.txt newlink
mv sub/b.txt sub/b2.txt && mv sub/b2.txt sub/b.txt
echo "write other: $( (echo x >> other.txt) 2>&1 >/dev/null | grep -c denied)"
echo "write root: $( (echo x >> root.txt) 2>&1 >/dev/null | grep -c denied)"
echo "chmod other: $(chmod 777 other.txt 2>/dev/null && echo yes || echo no)"
echo "chown: $(chown 0 new.txt 2>/dev/null && echo yes || echo no)"
echo "setuid: $(chmod u+s new.txt 2>/dev/null && echo yes || echo no) $(chmod g+s newdir 2>/dev/null && echo yes || echo no)"
./sub/x.sh
`)
			out := string(res.Stdout)
			if res.ExitCode != 0 {
				t.Fatalf("the sandbox's work failed (exit %d): %s %s", res.ExitCode, out, res.Stderr)
			}
			for _, want := range []string{
				"me 1000 root 1000:1000 a 1000 other 65534 rootfile 65534",
				"write other: 1", "write root: 1", "write in other's dir: no", "delete other's: no no", "chmod other: no", "chown: no", "setuid: no no", "ran",
			} {
				if !strings.Contains(out, want) {
					t.Errorf("want %q in the sandbox's output:\n%s%s", want, out, res.Stderr)
				}
			}
			if err := sb.Close(ctx); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if mountedAt(t, stage) {
				t.Errorf("the idmapped mount is left after Close")
			}
			if _, err := os.Lstat(stage); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the staging directory is left after Close: %v", err)
			}

			for path, e := range before {
				rel, _ := filepath.Rel(dir, path)
				if rel == "del.txt" {
					if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
						t.Errorf("del.txt was not deleted: %v", err)
					}
					continue
				}
				if got := lstat(t, path); got != e {
					t.Errorf("%s changed on disk: %d:%d %o, was %d:%d %o", rel, got.uid, got.gid, got.mode, e.uid, e.gid, e.mode)
				}
			}
			for _, rel := range []string{"new.txt", "newdir", "newdir/deeper", "newdir/deeper/f", "newlink"} {
				if got := lstat(t, filepath.Join(dir, rel)); got.uid != ownerID || got.gid != ownerID {
					t.Errorf("%s, made by the sandbox, belongs to %d:%d on disk, want the directory's owner %d:%d", rel, got.uid, got.gid, ownerID, ownerID)
				}
			}
			for rel, want := range map[string]string{"a.txt": "a.txt\nmore\n", "edit.txt": "edited.txt\n", "other.txt": "other.txt\n", "root.txt": "root.txt\n"} {
				if b, _ := os.ReadFile(filepath.Join(dir, rel)); string(b) != want {
					t.Errorf("%s holds %q, want %q", rel, b, want)
				}
			}
			noSpecialBits(t, dir)
		})
	}
}

// TestHostDirectoryOwnedByRoot: the common case of a root host, a directory root owns:
// the sandbox works in it as its owner and what it makes is root's on disk, so nothing it
// makes may be setuid or setgid (the seccomp filter and the nosuid mount see to it).
func TestHostDirectoryOwnedByRoot(t *testing.T) {
	needRoot(t)
	p, _ := ownProvider(t, Config{})
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := lstat(t, dir)
	sb := newSandbox(t, p, sandbox.CreateOptions{Workspace: dir})
	res := sh(t, sb, `cd /home/user; echo y >> f; cp /usr/bin/true t; chmod 4755 t 2>/dev/null; chmod u+s f 2>/dev/null; mkdir -m 2755 d 2>/dev/null
python3 -c 'import os; os.open("oc", os.O_CREAT|os.O_WRONLY, 0o4755)' 2>/dev/null; install -m 4755 /usr/bin/true inst 2>/dev/null; echo done`)
	if !strings.Contains(string(res.Stdout), "done") {
		t.Fatalf("the sandbox's work failed: %+v", res)
	}
	noSpecialBits(t, dir)
	if got := lstat(t, filepath.Join(dir, "t")); got.uid != 0 || got.gid != 0 {
		t.Errorf("a file the sandbox made belongs to %d:%d, want root's (the directory's owner)", got.uid, got.gid)
	}
	if got := lstat(t, dir); got != before {
		t.Errorf("the directory changed: %+v, was %+v", got, before)
	}
}

// TestHostDirectoryRefusedWithoutIdmap: where an idmapped mount cannot be made, a host
// directory is refused, not re-owned: the error says why and names --adopt, and nothing on
// disk changed. With Adopt, root's entries go to the sandbox user and the others' stay.
func TestHostDirectoryRefusedWithoutIdmap(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	before := ownedTree(t, dir)
	p, ws := ownProvider(t, Config{})
	p.noIdmap = true
	ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
	defer cancel()
	sbi, err := p.Create(ctx, sandbox.CreateOptions{Workspace: dir})
	if err == nil {
		sbi.Close(ctx)
		t.Fatal("a host directory was accepted without an idmapped mount and without Adopt")
	}
	if !errors.Is(err, ErrOwnersKept) || !strings.Contains(err.Error(), "--adopt") || !strings.Contains(err.Error(), "sandbox.adopt") {
		t.Errorf("the refusal does not say what to do: %v", err)
	}
	for path, e := range before {
		if got := lstat(t, path); got != e {
			t.Errorf("%s changed on disk though the directory was refused: %+v, was %+v", path, got, e)
		}
	}
	if ents, _ := os.ReadDir(ws); len(ents) != 0 {
		t.Errorf("the refusal left %d entries in the workspace dir (%v)", len(ents), ents[0].Name())
	}

	pa, _ := ownProvider(t, Config{Adopt: true})
	pa.noIdmap = true
	sb := newSandbox(t, pa, sandbox.CreateOptions{Workspace: dir})
	if sb.ws.idmap {
		t.Fatal("an adopted workspace says it is idmapped")
	}
	if res := sh(t, sb, "echo y >> /home/user/root.txt && echo new > /home/user/n && echo ok"); !strings.Contains(string(res.Stdout), "ok") {
		t.Fatalf("the adopted workspace is not writable: %+v", res)
	}
	if got := lstat(t, filepath.Join(dir, "root.txt")); got.uid != DefaultHostID {
		t.Errorf("with Adopt root's file belongs to %d, want the sandbox user %d", got.uid, DefaultHostID)
	}
	for _, rel := range []string{"a.txt", "other.txt", "otherdir"} {
		p := filepath.Join(dir, rel)
		if got := lstat(t, p); got != before[p] {
			t.Errorf("with Adopt %s (not root's) changed: %+v, was %+v", rel, got, before[p])
		}
	}
}

// TestStagedIdmapPrunedAfterACrash: the idmapped mount of a process that died (its lock
// released, nothing unmounted) is unmounted by the next provider's prune on the same
// workspace dir, and the directory it showed is untouched.
func TestStagedIdmapPrunedAfterACrash(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	before := ownedTree(t, dir)
	p, ws := ownProvider(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
	defer cancel()
	w, err := p.hostWorkspace(ctx, "crashed", dir)
	if err != nil {
		t.Fatal(err)
	}
	stage := w.path
	if !w.idmap || !mountedAt(t, stage) {
		t.Fatalf("not idmapped at %s", stage)
	}
	// What a killed process leaves: the lock file, unlocked (the kernel drops a dead
	// process's flock), and the mount.
	if err := w.lock.Release(); err != nil {
		t.Fatal(err)
	}
	ownProvider(t, Config{WorkspaceDir: ws})
	if mountedAt(t, stage) {
		t.Fatal("the prune left the dead process's idmapped mount")
	}
	if ents, _ := os.ReadDir(ws); len(ents) != 0 {
		t.Errorf("the prune left %d entries in the workspace dir", len(ents))
	}
	for path, e := range before {
		if got := lstat(t, path); got != e {
			t.Errorf("%s changed: %+v, was %+v", path, got, e)
		}
	}
}

// ramfsDir mounts a ramfs, a filesystem without idmapped mounts, on a new directory.
func ramfsDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("toolhost-idmaptest", dir, "ramfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		testenv.Skipf(t, "mounting a ramfs (a filesystem that refuses idmapped mounts): %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount the test's ramfs: %v", err)
		}
	})
	return dir
}

// TestFilesystemWithoutIdmap: a filesystem that really refuses idmapped mounts (ramfs) is
// refused as a workspace without Adopt, names --adopt, and is reported by the doctor's
// probe; the workspace dir's own filesystem passes the probe.
func TestFilesystemWithoutIdmap(t *testing.T) {
	needRoot(t)
	dir := ramfsDir(t)
	before := ownedTree(t, dir)
	p, ws := ownProvider(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
	defer cancel()
	if err := p.id.probeIdmap(ctx, dir); err == nil {
		t.Fatal("the probe says a ramfs can be idmapped")
	}
	if err := p.id.probeIdmap(ctx, ws); err != nil {
		t.Errorf("the probe fails on the workspace dir: %v", err)
	}
	sbi, err := p.Create(ctx, sandbox.CreateOptions{Workspace: dir})
	if err == nil {
		sbi.Close(ctx)
		t.Fatal("a ramfs directory was accepted without Adopt")
	}
	if !errors.Is(err, ErrOwnersKept) || !strings.Contains(err.Error(), "--adopt") {
		t.Errorf("the refusal does not name --adopt: %v", err)
	}
	for path, e := range before {
		if got := lstat(t, path); got != e {
			t.Errorf("%s changed on disk though the directory was refused: %+v, was %+v", path, got, e)
		}
	}
	if ents, _ := os.ReadDir(ws); len(ents) != 0 {
		t.Errorf("the refusal left %d entries in the workspace dir", len(ents))
	}
}

// TestUsernsKeptPerMapping: two workspaces of one owner share one kept user namespace,
// another owner gets its own, and the provider's Close closes them all (their owner).
func TestUsernsKeptPerMapping(t *testing.T) {
	needRoot(t)
	p, _ := ownProvider(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
	defer cancel()
	a, b := t.TempDir(), t.TempDir()
	ownedTree(t, a)
	var ws []*workspace
	for i, dir := range []string{a, a, b} {
		w, err := p.hostWorkspace(ctx, fmt.Sprintf("keep-%d", i), dir)
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
		t.Cleanup(func() { _ = w.release() }) // for a failure below: a second release does nothing
	}
	for _, w := range ws {
		if err := w.release(); err != nil {
			t.Fatal(err)
		}
	}
	p.userns.mu.Lock()
	kept := make([]*os.File, 0, len(p.userns.m))
	for _, f := range p.userns.m {
		kept = append(kept, f)
	}
	p.userns.mu.Unlock()
	if len(kept) != 2 {
		t.Fatalf("%d user namespaces kept for two owners, want 2", len(kept))
	}
	if err := p.userns.close(); err != nil {
		t.Fatal(err)
	}
	for _, f := range kept {
		if err := f.Close(); !errors.Is(err, os.ErrClosed) {
			t.Errorf("a kept user namespace is still open after close: %v", err)
		}
	}
	// A workspace made after close still works, with a namespace of its own.
	w, err := p.hostWorkspace(ctx, "after", a)
	if err != nil || !w.idmap {
		t.Fatalf("after close: %v", err)
	}
	if err := w.release(); err != nil {
		t.Fatal(err)
	}
	if len(p.userns.m) != 0 {
		t.Errorf("a namespace was kept after close")
	}
}

// helperIdmapHold opens a sandbox over the host directory MANY_HOST, writes in it, says
// "ready" and waits to be killed.
func helperIdmapHold() error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	p, err := New(Config{RunDir: os.Getenv("MANY_RUN"), WorkspaceDir: os.Getenv("MANY_WS"), Logger: log, Limits: Limits{DiskBytes: -1}})
	if err != nil {
		return err
	}
	ctx := context.Background()
	sb, err := p.Create(ctx, sandbox.CreateOptions{Workspace: os.Getenv("MANY_HOST")})
	if err != nil {
		return err
	}
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo held > held.txt"}})
	if err != nil || res.ExitCode != 0 {
		return fmt.Errorf("write: %v %+v", err, res)
	}
	fmt.Println("ready", sb.(*Sandbox).ws.path)
	select {} // until killed
}

// TestIdmapMountAfterKill: a process holding a sandbox over a host directory is killed
// (SIGKILL: nothing of its own runs); its idmapped mount stays until the next provider on
// the same directories prunes it, which leaves no mount, no staging directory and no lock,
// and the host directory's owners as they were (the file the sandbox wrote, its owner's).
func TestIdmapMountAfterKill(t *testing.T) {
	needRoot(t)
	testenv.NeedBwrap(t)
	run, ws := sharedDirs(t)
	host := t.TempDir()
	before := ownedTree(t, host)
	cmd := helperCmd("idmap-hold", "MANY_RUN="+run, "MANY_WS="+ws, "MANY_HOST="+host)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	line := make(chan string, 1)
	go func() { // ends when the helper's stdout closes (it is killed below in any case)
		b, _ := bufio.NewReader(out).ReadString('\n')
		line <- b
	}()
	var stage string
	select {
	case l := <-line:
		f := strings.Fields(l)
		if len(f) != 2 || f[0] != "ready" {
			t.Fatalf("the helper did not get ready: %q\n%s", l, stderr.String())
		}
		stage = f[1]
	case <-time.After(testenv.HangBound):
		t.Fatalf("the helper did not get ready within %s\n%s", testenv.HangBound, stderr.String())
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	killed = true
	if !mountedAt(t, stage) {
		t.Fatal("the killed process's mount is already gone: nothing left to prove the prune on")
	}

	newProvider(t, Config{RunDir: run, WorkspaceDir: ws, Limits: Limits{DiskBytes: -1}}) // prunes
	if mountedAt(t, stage) {
		t.Fatal("the killed process's idmapped mount is left after the next provider's prune")
	}
	for _, path := range []string{stage, stage + lockSuffix} {
		if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is left after the prune: %v", filepath.Base(path), err)
		}
	}
	for path, e := range before {
		if got := lstat(t, path); got != e {
			t.Errorf("%s changed: %+v, was %+v", path, got, e)
		}
	}
	if got := lstat(t, filepath.Join(host, "held.txt")); got.uid != ownerID {
		t.Errorf("the file the sandbox wrote belongs to %d, want %d", got.uid, ownerID)
	}
}
