//go:build linux

package snapshot_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/snapshot"
)

// saveRaw stores a tar.gz as the project's newest snapshot, as an older version (or a
// hostile store) could have.
func saveRaw(t *testing.T, st store.Store, clk *clock, project string, data []byte) snapshot.Info {
	t.Helper()
	return putTarGz(t, st, project, clk.Now(), data)
}

// manyEntries is a tar.gz of n small files.
func manyEntries(t *testing.T, n int) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for i := range n {
		tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("f%05d", i), Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
		tw.Write([]byte("x"))
	}
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

func unsafeEntry(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	tw.WriteHeader(&tar.Header{Name: "ok.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: 2})
	tw.Write([]byte("ok"))
	tw.WriteHeader(&tar.Header{Name: "../escape.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: 4})
	tw.Write([]byte("evil"))
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

// The reproduction: a workspace past the entry bound (1,000,001 files against the default
// 1,000,000; here 1,001 against a bound of 1,000, the same code path) saves, and that
// snapshot restores: the pack stops at the bound the restore enforces and reports what it
// left out. A snapshot past the bound all the same (an older version made it) is refused
// at restore, and the previous good one is restored instead, with the reason.
func TestEntryBoundSaveRestoresAndFallsBack(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			m, clk, logs := newManager(t, b.s, func(c *snapshot.Config) { c.MaxEntries = 1000 })
			ws := t.TempDir()
			for i := range 1001 {
				os.WriteFile(filepath.Join(ws, fmt.Sprintf("f%04d", i)), []byte("x"), 0o644)
			}
			info, st, err := m.SaveDir(context.Background(), "bound", ws)
			if err != nil {
				t.Fatal(err)
			}
			if st.Files != 1000 || info.Skipped != 1 || len(info.Skips) != 1 || !strings.Contains(info.Skips[0].Reason, "1000 entries") {
				t.Errorf("pack past the bound: %d files, skipped %d: %+v", st.Files, info.Skipped, info.Skips)
			}
			if !strings.Contains(logs.String(), "snapshot left out entries it cannot store") {
				t.Errorf("skips not logged")
			}
			dst := filepath.Join(t.TempDir(), "restored")
			got, est, err := m.RestoreDir(context.Background(), "bound", dst, false)
			if err != nil || got.Key != info.Key || est.Files != 1000 {
				t.Fatalf("the snapshot SaveDir made does not restore: %v (%+v)", err, est)
			}

			clk.Add(time.Minute)
			tooMany := saveRaw(t, b.s, clk, "bound", manyEntries(t, 1001))
			dst2 := filepath.Join(t.TempDir(), "restored")
			got, est, err = m.RestoreDir(context.Background(), "bound", dst2, false)
			if err != nil || got.Key != info.Key || est.Files != 1000 {
				t.Fatalf("restore with a newer snapshot past the bound: %v, restored %s", err, got.Key)
			}
			if len(got.Refused) != 1 || got.Refused[0].Key != tooMany.Key || !strings.Contains(got.Refused[0].Reason, "limit") {
				t.Errorf("Refused = %+v", got.Refused)
			}
		})
	}
}

// Any refusal at restore falls back: an unsafe entry and a snapshot past the size bound,
// newest first; the older good snapshot is restored, nothing of the refused ones is left
// in the destination, and the result says why each newer one was passed over.
func TestRestoreFallsBackOnAnyRefusal(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			m, clk, logs := newManager(t, b.s, func(c *snapshot.Config) { c.MaxBytes = 1000 })
			good := saveContent(t, m, "p", "good")
			clk.Add(time.Minute)
			big := saveRaw(t, b.s, clk, "p", tarGz(t, "big.bin", strings.Repeat("b", 5000)))
			clk.Add(time.Minute)
			bad := saveRaw(t, b.s, clk, "p", unsafeEntry(t))
			base := t.TempDir()
			dst := filepath.Join(base, "ws")
			info, _, err := m.RestoreDir(context.Background(), "p", dst, false)
			if err != nil || info.Key != good.Key {
				t.Fatalf("restore: %v, got %s, want %s", err, info.Key, good.Key)
			}
			if len(info.Refused) != 2 || info.Refused[0].Key != bad.Key || info.Refused[1].Key != big.Key ||
				!strings.Contains(info.Refused[0].Reason, "escape.txt") || !strings.Contains(info.Refused[1].Reason, "limit") {
				t.Errorf("Refused = %+v", info.Refused)
			}
			ents, _ := os.ReadDir(dst)
			if len(ents) != 1 || ents[0].Name() != "note.txt" {
				t.Errorf("destination holds %v, want only the good snapshot's note.txt", ents)
			}
			if left, _ := filepath.Glob(filepath.Join(base, "*")); len(left) != 1 {
				t.Errorf("refused extractions left %v", left)
			}
			if _, err := os.Stat(filepath.Join(base, "escape.txt")); err == nil {
				t.Errorf("an entry escaped")
			}
			if !strings.Contains(logs.String(), "restored an older snapshot") {
				t.Errorf("the fallback is not logged")
			}
		})
	}
}

// An entry a snapshot cannot store (a path longer than 4,096 bytes, a FIFO, a socket)
// never fails the save: it is left out and reported, and the snapshot restores.
func TestUnstorableEntriesAreSkippedAndReported(t *testing.T) {
	m, _, logs := newManager(t, newDir(t).s, nil)
	ws := t.TempDir()
	os.WriteFile(filepath.Join(ws, "keep.txt"), []byte("kept"), 0o644)
	// One mkdir loop: a directory chain longer than PATH_MAX, made with relative steps.
	deep, err := os.OpenRoot(ws)
	if err != nil {
		t.Fatal(err)
	}
	seg := strings.Repeat("d", 200)
	p := ""
	for range 25 {
		p = filepath.Join(p, seg)
		if err := deep.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	deep.WriteFile(filepath.Join(p, "lost.txt"), []byte("too deep"), 0o644)
	deep.Close()
	if err := syscall.Mkfifo(filepath.Join(ws, "pipe"), 0o644); err != nil {
		t.Fatal(err)
	}
	info, _, err := m.SaveDir(context.Background(), "odd", ws)
	if err != nil {
		t.Fatalf("a save with unstorable entries failed: %v", err)
	}
	var reasons []string
	for _, s := range info.Skips {
		reasons = append(reasons, s.Reason)
	}
	all := strings.Join(reasons, "|")
	if info.Skipped < 2 || !strings.Contains(all, "longer than 4096") || !strings.Contains(all, "not a regular file") {
		t.Errorf("skipped %d: %v", info.Skipped, info.Skips)
	}
	if !strings.Contains(logs.String(), "left out entries") || !strings.Contains(logs.String(), `pipe`) {
		t.Errorf("skips not in the log")
	}
	dst := filepath.Join(t.TempDir(), "r")
	if _, _, err := m.RestoreDir(context.Background(), "odd", dst, false); err != nil {
		t.Fatalf("restore: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "keep.txt")); string(b) != "kept" {
		t.Errorf("keep.txt: %q", b)
	}
}

// snapshot restore --key, delete KEY, prune --keep N.
func TestRestoreKeyDeletePrune(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			m, clk, _ := newManager(t, b.s, func(c *snapshot.Config) { c.Keep = -1 })
			ctx := context.Background()
			var infos []snapshot.Info
			for i := range 5 {
				infos = append(infos, saveContent(t, m, "mgmt", fmt.Sprintf("v%d", i)))
				clk.Add(time.Minute)
			}
			dst := filepath.Join(t.TempDir(), "old")
			got, _, err := m.RestoreDirKey(ctx, "mgmt", infos[1].Key, dst, false)
			if b, _ := os.ReadFile(filepath.Join(dst, "note.txt")); err != nil || string(b) != "v1" || got.Key != infos[1].Key {
				t.Errorf("restore --key %s: %q %v", infos[1].Key, b, err)
			}
			// Wrong keys: another project's, not a key at all, a missing one.
			other := snapshot.Key("other", time.Now(), "abcdef")
			for _, k := range []string{other, "projects/mgmt/snapshots/notes.txt", "../x"} {
				if _, err := m.RestoreKey(ctx, "mgmt", k, func(io.Reader) error { return nil }); !errors.Is(err, snapshot.ErrNotSnapshotKey) {
					t.Errorf("RestoreKey(%q): %v", k, err)
				}
				if err := m.Delete(ctx, "mgmt", k); !errors.Is(err, snapshot.ErrNotSnapshotKey) {
					t.Errorf("Delete(%q): %v", k, err)
				}
			}
			missing := snapshot.Key("mgmt", time.Now(), "abcdef")
			if _, err := m.RestoreKey(ctx, "mgmt", missing, func(io.Reader) error { return nil }); !errors.Is(err, snapshot.ErrNoSuchSnapshot) {
				t.Errorf("RestoreKey of a missing key: %v", err)
			}
			if err := m.Delete(ctx, "mgmt", missing); !errors.Is(err, snapshot.ErrNoSuchSnapshot) || strings.Contains(err.Error(), "\n") {
				t.Errorf("Delete of a missing key: %v", err)
			}
			// A key that does not verify is refused, not replaced by another.
			flip(t, b, infos[2].Key)
			if _, err := m.RestoreKey(ctx, "mgmt", infos[2].Key, func(io.Reader) error { return nil }); !errors.Is(err, snapshot.ErrCorrupt) {
				t.Errorf("RestoreKey of a corrupt snapshot: %v", err)
			}

			if err := m.Delete(ctx, "mgmt", infos[4].Key); err != nil {
				t.Fatal(err)
			}
			if _, got, err := restoreContent(t, m, "mgmt"); err != nil || got != "v3" {
				t.Errorf("after deleting the newest: %q %v", got, err)
			}
			if _, err := m.Prune(ctx, "mgmt", 0); !errors.Is(err, snapshot.ErrInvalidKeep) {
				t.Errorf("prune --keep 0: %v", err)
			}
			pruned, err := m.Prune(ctx, "mgmt", 2)
			if err != nil || len(pruned) != 2 || pruned[0] != infos[1].Key || pruned[1] != infos[0].Key {
				t.Errorf("prune --keep 2: %q %v", pruned, err)
			}
			list, _ := m.List(ctx, "mgmt")
			if len(list) != 2 || list[0].Key != infos[3].Key {
				t.Errorf("after prune: %q", keysOf(list))
			}
			// A save after the newest was deleted still sorts after what is left.
			next := saveContent(t, m, "mgmt", "v5")
			if next.Key <= infos[3].Key {
				t.Errorf("save after delete: %s", next.Key)
			}
		})
	}
}

// flip corrupts one byte of the object's stored file.
func flip(t *testing.T, b backend, key string) {
	t.Helper()
	p := b.file(key)
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0xff
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
}
