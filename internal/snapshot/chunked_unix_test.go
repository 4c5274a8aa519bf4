//go:build !windows

package snapshot_test

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/toolhost/toolhost/internal/chunked/chunkedtest"
)

// TestSecondSaveSeesEditsThatHideFromTimes: a save over the last one reads a file whose
// size and modification time are as before but whose content changed: an edit whose
// mtime was set back (`touch -d`), one in place at the same size, one written through a
// shared mapping still live at the save (no write(2), so nothing but the inode's times
// says so). Each is in the next snapshot, byte for byte.
func TestSecondSaveSeesEditsThatHideFromTimes(t *testing.T) {
	ctx := tctx(t)
	m, clk, _ := chunkedManager(t, newDir(t).s)
	ws := filepath.Join(t.TempDir(), "ws")
	chunkedtest.MakeTree(t, ws, 34)
	if _, _, err := m.SaveDir(ctx, "p", ws); err != nil {
		t.Fatal(err)
	}
	// The same size, the old mtime: only the change time and the content differ.
	touched := filepath.Join(ws, "src", "pkg", "f03.go")
	fi, err := os.Stat(touched)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(touched)
	data[0] ^= 0x20
	if err := os.WriteFile(touched, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(touched, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	// One byte in the middle of a large file, its times set back.
	big := filepath.Join(ws, "big.bin")
	bfi, _ := os.Stat(big)
	f, err := os.OpenFile(big, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{0xAA, 0x55}, bfi.Size()/2)
	f.Close()
	os.Chtimes(big, bfi.ModTime(), bfi.ModTime())
	// Through a shared writable mapping, still mapped while the save runs.
	mapped := filepath.Join(ws, "src", "pkg", "f04.go")
	mf, err := os.OpenFile(mapped, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	mfi, _ := mf.Stat()
	mem, err := syscall.Mmap(int(mf.Fd()), 0, int(mfi.Size()), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	mf.Close() // the mapping outlives the descriptor
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(mem)
	copy(mem, "MAPPED")
	clk.Add(time.Second)
	second, _, err := m.SaveDir(ctx, "p", ws)
	if err != nil || second.Unchanged {
		t.Fatalf("the second save: %+v %v", second, err)
	}
	out := filepath.Join(t.TempDir(), "out")
	if _, _, err := m.RestoreDirKey(ctx, "p", second.Key, out, false); err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{"src/pkg/f03.go", "big.bin", "src/pkg/f04.go"} {
		want, _ := os.ReadFile(filepath.Join(ws, rel))
		got, err := os.ReadFile(filepath.Join(out, rel))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: the snapshot does not hold the edit (%v)", rel, err)
		}
	}
}
