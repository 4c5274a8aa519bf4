package snapshot_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/archive"
	"github.com/toolhost/toolhost/internal/chunked"
	"github.com/toolhost/toolhost/internal/chunked/chunkedtest"
	"github.com/toolhost/toolhost/internal/snapshot"
)

func chunkedManager(t *testing.T, s store.Store) (*snapshot.Manager, *clock, *logBuf) {
	return newManager(t, s, nil)
}

func tctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// sandboxTarget restores like a session into a sandbox: a tar.gz stream extracted into a
// fresh directory per try, listed for the check. drop, when set, loses a file on the
// first try (a provider that "resumes" without all the files).
func sandboxTarget(t *testing.T, drop string) (snapshot.Target, *string) {
	dir := new(string)
	tries := 0
	return snapshot.Target{
		Extract: func(r io.Reader) error {
			tries++
			*dir = filepath.Join(t.TempDir(), "ws")
			if _, err := archive.Extract(context.Background(), r, *dir, archive.ExtractOptions{}); err != nil {
				return err
			}
			if drop != "" && tries == 1 {
				return os.Remove(filepath.Join(*dir, drop))
			}
			return nil
		},
		List: func(ctx context.Context) ([]snapshot.WorkspaceEntry, error) {
			var out []snapshot.WorkspaceEntry
			err := filepath.WalkDir(*dir, func(p string, d fs.DirEntry, err error) error {
				if err != nil || p == *dir {
					return err
				}
				fi, err := d.Info()
				if err != nil {
					return err
				}
				rel, _ := filepath.Rel(*dir, p)
				out = append(out, snapshot.WorkspaceEntry{Path: filepath.ToSlash(rel), Mode: fi.Mode(), Size: fi.Size()})
				return nil
			})
			return out, err
		},
	}, dir
}

func TestChunkedWakeFallsBackFromACorruptChunk(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := tctx(t)
			m, clk, _ := chunkedManager(t, b.s)
			ws := filepath.Join(t.TempDir(), "ws")
			chunkedtest.MakeTree(t, ws, 21)
			v1, _, err := m.SaveDir(ctx, "p", ws)
			if err != nil {
				t.Fatal(err)
			}
			before, _ := store.ListAll(ctx, b.s, chunked.PrefixPacks)
			big := make([]byte, 3<<20)
			rand.Read(big)
			os.WriteFile(filepath.Join(ws, "new.bin"), big, 0o644)
			clk.Add(time.Second)
			v2, _, err := m.SaveDir(ctx, "p", ws)
			if err != nil || v2.Key == v1.Key {
				t.Fatalf("second save: %+v %v", v2, err)
			}
			after, _ := store.ListAll(ctx, b.s, chunked.PrefixPacks)
			// Corrupt the packs only the second snapshot references (its checksum in the
			// store rewritten to match: only the chunk digests can tell).
			old := map[string]bool{}
			for _, o := range before {
				old[o.Key] = true
			}
			for _, o := range after {
				if old[o.Key] {
					continue
				}
				rc, _, err := b.s.Get(ctx, o.Key)
				if err != nil {
					t.Fatal(err)
				}
				data, _ := io.ReadAll(rc)
				rc.Close()
				data[len(data)/2] ^= 0x55
				sum := sha256.Sum256(data)
				if _, err := b.s.Put(ctx, o.Key, bytes.NewReader(data), store.PutOptions{Size: int64(len(data)), Metadata: map[string]string{"sha256": hex.EncodeToString(sum[:])}}); err != nil {
					t.Fatal(err)
				}
			}
			target, dir := sandboxTarget(t, "")
			info, err := m.RestoreTo(ctx, "p", target)
			if err != nil {
				t.Fatalf("restore: %v", err)
			}
			if info.Key != v1.Key || len(info.Refused) != 1 || info.Refused[0].Key != v2.Key || !strings.Contains(info.Refused[0].Reason, "does not verify") {
				t.Fatalf("restored %s, refused %+v; want %s after refusing %s", info.Key, info.Refused, v1.Key, v2.Key)
			}
			os.Remove(filepath.Join(ws, "new.bin"))
			os.RemoveAll(filepath.Join(ws, "node_modules"))
			if _, err := os.Stat(filepath.Join(*dir, "big.bin")); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(*dir, "new.bin")); err == nil {
				t.Error("the refused snapshot's file is in the workspace")
			}
		})
	}
}

func TestChunkedWakeCheckFindsAMissingFile(t *testing.T) {
	ctx := tctx(t)
	m, clk, _ := chunkedManager(t, newDir(t).s)
	ws := filepath.Join(t.TempDir(), "ws")
	chunkedtest.MakeTree(t, ws, 22)
	v1, _, err := m.SaveDir(ctx, "p", ws)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(ws, "later.txt"), []byte("later\n"), 0o644)
	clk.Add(time.Second)
	v2, _, err := m.SaveDir(ctx, "p", ws)
	if err != nil {
		t.Fatal(err)
	}
	target, _ := sandboxTarget(t, "src/pkg/f07.go")
	info, err := m.RestoreTo(ctx, "p", target)
	if err != nil {
		t.Fatal(err)
	}
	if info.Key != v1.Key || len(info.Refused) != 1 || info.Refused[0].Key != v2.Key ||
		!strings.Contains(info.Refused[0].Reason, "src/pkg/f07.go (missing)") {
		t.Fatalf("restored %s, refused %+v", info.Key, info.Refused)
	}
	// What the sandbox did (or says) never sets a snapshot aside: only the store's data can.
	if q, err := m.Quarantined(ctx, "p"); err != nil || len(q) != 0 || info.Refused[0].Quarantine != "" {
		t.Errorf("a snapshot the sandbox mangled was set aside: %+v %v", q, err)
	}
}

// A wake, a read, a touch of the root store nothing, in both formats: "unchanged"
// compares content, never the archive's bytes.
func TestUnchangedComparesContent(t *testing.T) {
	ctx := tctx(t)
	m, clk, _ := newManager(t, newDir(t).s, nil)
	ws := filepath.Join(t.TempDir(), "ws")
	chunkedtest.MakeTree(t, ws, 23)
	first, _, err := m.SaveDir(ctx, "p", ws)
	if err != nil || first.Tree == "" {
		t.Fatalf("%+v %v", first, err)
	}
	// The root's and a file's times move (a wake, a touch); nothing else.
	now := time.Now()
	os.Chtimes(ws, now, now)
	os.Chtimes(filepath.Join(ws, "src", "pkg", "f02.go"), now, now)
	clk.Add(time.Second)
	second, _, err := m.SaveDir(ctx, "p", ws)
	if err != nil || !second.Unchanged || second.Key != first.Key {
		t.Fatalf("a touch stored a snapshot: %+v %v", second, err)
	}
	// A real change is stored.
	os.WriteFile(filepath.Join(ws, "src", "pkg", "f02.go"), []byte("changed\n"), 0o644)
	clk.Add(time.Second)
	third, _, err := m.SaveDir(ctx, "p", ws)
	if err != nil || third.Unchanged || third.Key == first.Key {
		t.Fatalf("a change was not stored: %+v %v", third, err)
	}
	list, _ := m.List(ctx, "p")
	if len(list) != 2 {
		t.Errorf("%d snapshots, want 2", len(list))
	}
}

func TestRewindAndUndo(t *testing.T) {
	ctx := tctx(t)
	m, clk, _ := chunkedManager(t, newDir(t).s)
	ws := filepath.Join(t.TempDir(), "ws")
	os.MkdirAll(ws, 0o755)
	write := func(s string) {
		os.WriteFile(filepath.Join(ws, "state.txt"), []byte(s), 0o644)
		clk.Add(time.Second)
	}
	restored := func() string {
		out := filepath.Join(t.TempDir(), "out")
		if _, _, err := m.RestoreDir(ctx, "p", out, false); err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(filepath.Join(out, "state.txt"))
		return string(b)
	}
	write("one\n")
	v1, _, err := m.SaveDir(ctx, "p", ws)
	if err != nil {
		t.Fatal(err)
	}
	write("two\n")
	if _, _, err := m.SaveDir(ctx, "p", ws); err != nil {
		t.Fatal(err)
	}
	info, undo, err := m.Rewind(ctx, "p", chunked.ShortKey(v1.Key))
	if err != nil {
		t.Fatal(err)
	}
	if got := restored(); got != "one\n" {
		t.Fatalf("after the rewind the project wakes with %q", got)
	}
	if !strings.Contains(info.Label, "rewind to") {
		t.Errorf("label %q", info.Label)
	}
	clk.Add(time.Second)
	if _, _, err := m.Rewind(ctx, "p", undo); err != nil {
		t.Fatal(err)
	}
	if got := restored(); got != "two\n" {
		t.Fatalf("after the undo the project wakes with %q", got)
	}
	cps, err := m.Checkpoints(ctx, "p")
	if err != nil || len(cps) != 4 || !strings.HasPrefix(cps[0].Label, "rewind to") {
		t.Fatalf("checkpoints %+v %v", cps, err)
	}
}

// Every snapshot of a scripted session restores to the workspace it was taken from, bit
// for bit: contents, modes, links, times.
func TestScriptedSessionRestoresBitForBit(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := tctx(t)
			m, clk, _ := newManager(t, b.s, func(c *snapshot.Config) { c.Keep = -1 })
			ws := filepath.Join(t.TempDir(), "ws")
			chunkedtest.MakeTree(t, ws, 24)
			steps := []func(){
				func() {},
				func() { os.WriteFile(filepath.Join(ws, "src", "pkg", "f01.go"), []byte("edited\n"), 0o600) },
				func() { os.Symlink("a.b/run.sh", filepath.Join(ws, "run")); os.Chmod(filepath.Join(ws, "a.b"), 0o700) },
				func() { os.RemoveAll(filepath.Join(ws, "src")) },
				func() { os.Rename(filepath.Join(ws, "big.bin"), filepath.Join(ws, "a.b", "big.bin")) },
				func() {
					f, _ := os.OpenFile(filepath.Join(ws, "a.b", "big.bin"), os.O_APPEND|os.O_WRONLY, 0)
					f.Write([]byte("tail"))
					f.Close()
				},
			}
			var keys, copies []string
			for i, step := range steps {
				step()
				chunkedtest.Backdate(t, ws)
				clk.Add(time.Second)
				info, _, err := m.SaveDir(ctx, "p", ws)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				cp := filepath.Join(t.TempDir(), "copy")
				if out, err := exec.Command("cp", "-a", ws, cp).CombinedOutput(); err != nil {
					t.Fatalf("cp: %v %s", err, out)
				}
				os.RemoveAll(filepath.Join(cp, "node_modules"))
				keys, copies = append(keys, info.Key), append(copies, cp)
			}
			if len(slices.Compact(slices.Clone(keys))) != len(steps) {
				t.Fatalf("keys %v", keys)
			}
			for i, k := range keys {
				out := filepath.Join(t.TempDir(), "out")
				if _, _, err := m.RestoreDirKey(ctx, "p", k, out, false); err != nil {
					t.Fatalf("restore %s: %v", k, err)
				}
				chunkedtest.SameTree(t, copies[i], out)
			}
		})
	}
}

// TestExportEqualsTarGzSave: a chunked snapshot exported is the tar.gz archive.Pack makes
// of the same tree (what older versions stored as a tar.gz snapshot): the same entries in
// the same order with the same bytes (the tar streams compared byte for byte). A tar.gz
// snapshot of an older version exports as it is stored, byte for byte.
func TestExportEqualsTarGzSave(t *testing.T) {
	ctx := tctx(t)
	ws := filepath.Join(t.TempDir(), "ws")
	chunkedtest.MakeTree(t, ws, 25)
	st := newDir(t).s
	mc, _, _ := chunkedManager(t, st)
	var packed bytes.Buffer
	if _, err := archive.Pack(ctx, &packed, ws, archive.PackOptions{}); err != nil {
		t.Fatal(err)
	}
	old := putTarGz(t, st, "old", time.Now(), packed.Bytes())
	ic, _, err := mc.SaveDir(ctx, "p", ws)
	if err != nil {
		t.Fatal(err)
	}
	var targz, export bytes.Buffer
	if err := mc.Export(ctx, &targz, "old", old.Key); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(targz.Bytes(), packed.Bytes()) {
		t.Fatalf("the export of a tar.gz snapshot is not its stored archive (%d bytes, stored %d)", targz.Len(), packed.Len())
	}
	if err := mc.Export(ctx, &export, "p", ic.Key); err != nil {
		t.Fatal(err)
	}
	tarOf := func(b []byte) []byte {
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		out, err := io.ReadAll(zr)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	a, b := tarOf(targz.Bytes()), tarOf(export.Bytes())
	if !bytes.Equal(a, b) {
		i := 0
		for i < len(a) && i < len(b) && a[i] == b[i] {
			i++
		}
		t.Fatalf("the export differs from archive.Pack's tar.gz at byte %d of %d/%d", i, len(a), len(b))
	}
	if old.Tree != ic.Tree {
		t.Errorf("content digests differ: %s vs %s", old.Tree, ic.Tree)
	}
}

// TestChunkedSaveWaitsForTheArchiveEnd: a sandbox's archive whose last bytes (tar's
// closing zero block, gzip's trailer) arrive after its end marker was read is saved
// whole and reported saved; one that writes on and on after its end is cut off.
func TestChunkedSaveWaitsForTheArchiveEnd(t *testing.T) {
	m, _, _ := chunkedManager(t, newDir(t).s)
	data := tarGz(t, "note.txt", "all of it\n")
	late := func(w io.Writer) error {
		// All but the trailer at once; the trailer once the reader had time to stop.
		if _, err := w.Write(data[:len(data)-8]); err != nil {
			return err
		}
		time.Sleep(200 * time.Millisecond)
		_, err := w.Write(data[len(data)-8:])
		return err
	}
	for i := range 3 {
		if _, err := m.Save(context.Background(), "late", late); err != nil {
			t.Fatalf("save %d, its trailer late: %v", i, err)
		}
	}
	endless := func(w io.Writer) error {
		if _, err := w.Write(data); err != nil {
			return err
		}
		junk := make([]byte, 64<<10)
		for {
			if _, err := w.Write(junk); err != nil {
				return err
			}
		}
	}
	if _, err := m.Save(context.Background(), "endless", endless); err != nil {
		t.Fatalf("a save whose archive writes on past its end: %v (the snapshot is whole: the rest is cut off)", err)
	}
}

// TestSaveOverTheLastReusesSegments: saves over the last one in the same process (the scan
// cache: a segment whose entries are the base's is reused without being encoded again)
// store a manifest that restores the tree as it is, bit for bit, through an edit, and
// through files added, removed and a directory made; an edit stores one new segment.
func TestSaveOverTheLastReusesSegments(t *testing.T) {
	ctx := tctx(t)
	m, clk, _ := chunkedManager(t, newDir(t).s)
	ws := filepath.Join(t.TempDir(), "ws")
	old := time.Now().Add(-2 * time.Hour)
	write := func(rel, content string) {
		t.Helper()
		p := filepath.Join(ws, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(p, old, old)
	}
	for d := range 30 {
		for f := range 60 {
			write(fmt.Sprintf("d%02d/f%03d.go", d, f), strings.Repeat(fmt.Sprintf("package d%02d // %d\n", d, f), 1+f%7))
		}
	}
	save := func(step string) *chunked.Manifest {
		t.Helper()
		clk.Add(time.Second)
		info, _, err := m.SaveDir(ctx, "p", ws)
		if err != nil || info.Unchanged {
			t.Fatalf("%s: %+v %v", step, info, err)
		}
		out := filepath.Join(t.TempDir(), "out")
		if _, _, err := m.RestoreDirKey(ctx, "p", info.Key, out, false); err != nil {
			t.Fatalf("%s: restore: %v", step, err)
		}
		chunkedtest.SameTree(t, ws, out)
		man, err := m.Repo().Manifest(ctx, info.Key)
		if err != nil {
			t.Fatal(err)
		}
		return man
	}
	first := save("first")
	if len(first.Segments) < 10 {
		t.Fatalf("%d segments: the tree is too small to tell", len(first.Segments))
	}
	write("d07/f011.go", "package d07 // edited\n")
	edited := save("edit")
	had := map[chunked.Digest]bool{}
	for _, s := range first.Segments {
		had[s.Digest] = true
	}
	fresh := 0
	for _, s := range edited.Segments {
		if !had[s.Digest] {
			fresh++
		}
	}
	if fresh != 1 || len(edited.Segments) != len(first.Segments) {
		t.Errorf("the edit stored %d new segments of %d (first save %d), want 1", fresh, len(edited.Segments), len(first.Segments))
	}
	write("d15/new.go", "package d15\n")
	write("d29/zz/deep.go", "package zz\n")
	os.Remove(filepath.Join(ws, "d20", "f005.go"))
	write("a/first.go", "package a\n")
	save("add and remove")
}
