//go:build linux

package cli

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/toolhost/toolhost/internal/testenv"
)

// TestCallKeepsOwners: as root, `call --workspace DIR` on a directory of a uid that exists
// only as a number (neither root nor the sandbox user) writes and edits there as that
// owner: not one owner changes, new files are the owner's. On a filesystem without
// idmapped mounts (a ramfs) the call is refused with what to do, nothing re-owned, and
// with --adopt it runs and hands root's files to the sandbox user.
func TestCallKeepsOwners(t *testing.T) {
	requireBwrap(t)
	if os.Geteuid() != 0 {
		testenv.Skipf(t, "needs root: host directories are mapped onto the sandbox user only when toolhost runs as root (CI runs as root)")
	}
	t.Parallel()
	const uid = 4242
	ws := t.TempDir()
	a := filepath.Join(ws, "a.txt")
	if err := os.WriteFile(a, []byte("one\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{ws, a} {
		if err := os.Chown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	r := runCLI(t, nil, "call", "bash", `{"command":"echo two >> a.txt && echo new > n.txt && mkdir d && touch d/f"}`, "--workspace", ws)
	if r.code != 0 || decodeResult(t, r).IsError {
		t.Fatalf("bash:\n%s", r)
	}
	for _, rel := range []string{".", "a.txt", "n.txt", "d", "d/f"} {
		if got := owner(t, filepath.Join(ws, rel)); got != [2]uint32{uid, uid} {
			t.Errorf("%s belongs to %d:%d on disk, want %d:%d", rel, got[0], got[1], uid, uid)
		}
	}
	if st, _ := os.Stat(a); st == nil || st.Mode().Perm() != 0o640 {
		t.Errorf("a.txt's mode changed: %v", st)
	}
	if b, _ := os.ReadFile(a); string(b) != "one\ntwo\n" {
		t.Errorf("a.txt holds %q", b)
	}

	ram := t.TempDir()
	if err := unix.Mount("toolhost-ownerstest", ram, "ramfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		testenv.Skipf(t, "mounting a ramfs (a filesystem that refuses idmapped mounts): %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(ram, unix.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(ram, "r.txt"), []byte("root's\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = runCLI(t, nil, "call", "bash", `{"command":"true"}`, "--workspace", ram)
	if r.code == 0 || !strings.Contains(r.stderr, "--adopt") {
		t.Fatalf("a workspace that cannot be idmapped was not refused with what to do:\n%s", r)
	}
	if got := owner(t, filepath.Join(ram, "r.txt")); got != [2]uint32{0, 0} {
		t.Fatalf("the refused call re-owned r.txt: %v", got)
	}
	r = runCLI(t, nil, "call", "bash", `{"command":"echo more >> r.txt"}`, "--workspace", ram, "--adopt")
	if r.code != 0 || decodeResult(t, r).IsError {
		t.Fatalf("bash with --adopt:\n%s", r)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(ram, "r.txt"), &st); err != nil || st.Uid == 0 {
		t.Errorf("with --adopt root's r.txt was not handed to the sandbox user: uid %d %v", st.Uid, err)
	}
}
