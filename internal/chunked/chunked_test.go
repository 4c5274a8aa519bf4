package chunked

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/store/dir"
	"github.com/toolhost/toolhost/internal/tree"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func dirStore(t *testing.T) store.Store {
	st, err := dir.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func newRepo(t *testing.T, st store.Store) *Repo {
	r, err := New(Config{Store: st, Retry: store.Retry{Attempts: 2, Backoff: 10 * time.Millisecond}, TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// makeTree writes a small workspace: text files, an empty file, a large file of several
// chunks, nested directories with odd modes, and links.
func makeTree(t *testing.T, root string, seed uint64) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 7))
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "src", "pkg"), 0o755))
	must(os.MkdirAll(filepath.Join(root, "a.b"), 0o750))
	for i := range 40 {
		var sb strings.Builder
		for range 20 + r.IntN(200) {
			fmt.Fprintf(&sb, "line %d of file %d: %x\n", r.IntN(1000), i, r.Uint32())
		}
		must(os.WriteFile(filepath.Join(root, "src", "pkg", fmt.Sprintf("f%02d.go", i)), []byte(sb.String()), 0o644))
	}
	must(os.WriteFile(filepath.Join(root, "empty"), nil, 0o600))
	must(os.WriteFile(filepath.Join(root, "a.b", "run.sh"), []byte("#!/bin/sh\necho hi\n"), 0o755))
	big := make([]byte, 3*MaxChunk+12345)
	for i := range big {
		big[i] = byte(r.Uint32() >> (i % 3 * 8))
	}
	must(os.WriteFile(filepath.Join(root, "big.bin"), big, 0o644))
	must(os.Symlink("src/pkg/f01.go", filepath.Join(root, "link")))
	must(os.Symlink("../big.bin", filepath.Join(root, "a.b", "up")))
	must(os.Mkdir(filepath.Join(root, "src", "emptydir"), 0o700))
	must(os.MkdirAll(filepath.Join(root, "node_modules", "x"), 0o755)) // excluded
	must(os.WriteFile(filepath.Join(root, "node_modules", "x", "i.js"), []byte("x"), 0o644))
	backdate(t, root)
}

// backdate moves every modification time an hour back, as if the files were written
// long before the save (a file changed within a second of a save is read again by the
// next one: the racily-clean rule).
func backdate(t *testing.T, root string) {
	t.Helper()
	old := time.Now().Add(-time.Hour)
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			return os.Chtimes(p, old, old)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// sameTree fails unless a and b hold the same entries, bit for bit: types, modes, sizes,
// contents, link targets and modification times.
func sameTree(t *testing.T, a, b string) {
	t.Helper()
	list := func(root string) map[string]tree.Entry {
		m := map[string]tree.Entry{}
		_, err := tree.Walk(context.Background(), root, tree.WalkOptions{}, func(e tree.Entry, _ tree.Opener) error {
			e.CTime, e.Ino = 0, 0
			m[e.Path] = e
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	ea, eb := list(a), list(b)
	if len(ea) != len(eb) {
		t.Errorf("%d entries in %s, %d in %s", len(ea), a, len(eb), b)
	}
	for p, x := range ea {
		y, ok := eb[p]
		if !ok {
			t.Errorf("%s: missing from the restore", p)
			continue
		}
		if x != y {
			t.Errorf("%s: %+v, restored %+v", p, x, y)
			continue
		}
		if x.Type == tree.File {
			da, _ := os.ReadFile(filepath.Join(a, p))
			db, _ := os.ReadFile(filepath.Join(b, p))
			if !bytes.Equal(da, db) {
				t.Errorf("%s: contents differ", p)
			}
		}
	}
}

func save(t *testing.T, r *Repo, project, dir string, base *Manifest) (*BuildResult, string) {
	t.Helper()
	ctx := testCtx(t)
	src := DirSource{Dir: dir}
	mode, mtime := src.Root()
	res, err := r.Build(ctx, src, BuildOptions{Project: project, Base: base, RootMode: mode, RootMTime: mtime})
	if err != nil {
		t.Fatalf("save %s: %v", project, err)
	}
	key := ManifestKey(project, time.Now(), NewNonce())
	if err := r.Commit(ctx, res, key); err != nil {
		t.Fatalf("commit %s: %v", key, err)
	}
	return res, key
}

func TestRoundTrip(t *testing.T) {
	ws := filepath.Join(t.TempDir(), "ws")
	makeTree(t, ws, 1)
	r := newRepo(t, dirStore(t))
	res, key := save(t, r, "p1", ws, nil)
	if res.Stats.Files != 43 || res.Stats.Symlinks != 2 || res.Stats.NewChunks < 43 {
		t.Errorf("stats %+v", res.Stats)
	}
	// A fresh Repo (another process) restores it.
	r2 := newRepo(t, r.Store())
	m, err := r2.Manifest(testCtx(t), key)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out")
	if _, err := r2.RestoreDir(testCtx(t), m, out, tree.WriterOptions{}); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(filepath.Join(ws, "node_modules"))
	sameTree(t, ws, out)
	if _, err := os.Stat(filepath.Join(out, "node_modules")); err == nil {
		t.Error("an excluded directory was saved")
	}
}

// storedBytes sums the objects under prefix.
func storedBytes(t *testing.T, st store.Store, prefix string) (int64, int) {
	objs, err := store.ListAll(testCtx(t), st, prefix)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, o := range objs {
		n += o.Size
	}
	return n, len(objs)
}

func TestOneChangedByteStoresOneChunksPack(t *testing.T) {
	ws := filepath.Join(t.TempDir(), "ws")
	makeTree(t, ws, 2)
	r := newRepo(t, dirStore(t))
	first, key := save(t, r, "p", ws, nil)
	_, packsBefore := storedBytes(t, r.Store(), PrefixPacks)
	// Change one byte in the middle of the large file.
	f, err := os.OpenFile(filepath.Join(ws, "big.bin"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{'!'}, MaxChunk+100)
	f.Close()
	m, _ := r.Manifest(testCtx(t), key)
	second, _ := save(t, r, "p", ws, m)
	if second.Stats.Read != 1 {
		t.Errorf("the second save read %d files, want the one changed", second.Stats.Read)
	}
	if second.Stats.NewChunks < 1 || second.Stats.NewChunks > 2 {
		t.Errorf("the second save stored %d new chunks, want the one around the change (or two when it moved a cut)", second.Stats.NewChunks)
	}
	_, packsAfter := storedBytes(t, r.Store(), PrefixPacks)
	if packsAfter != packsBefore+1 {
		t.Errorf("packs: %d before, %d after; want one more", packsBefore, packsAfter)
	}
	if second.Stats.Uploaded >= first.Stats.Uploaded/2 || second.Stats.Uploaded > 3*MaxChunk {
		t.Errorf("second save uploaded %d bytes (first %d)", second.Stats.Uploaded, first.Stats.Uploaded)
	}
}

func TestTwoProjectsShareChunks(t *testing.T) {
	ws := filepath.Join(t.TempDir(), "ws")
	makeTree(t, ws, 3)
	st := dirStore(t)
	save(t, newRepo(t, st), "alpha", ws, nil)
	before, _ := storedBytes(t, st, PrefixPacks)
	// Another host saves another project with the same files.
	res, _ := save(t, newRepo(t, st), "beta", ws, nil)
	after, _ := storedBytes(t, st, PrefixPacks)
	if res.Stats.NewChunks != 0 {
		t.Errorf("the second project stored %d new chunks; want none", res.Stats.NewChunks)
	}
	if grow := after - before; grow > 64<<10 {
		t.Errorf("packs grew by %d bytes for the second project (its segments only expected)", grow)
	}
}

func TestUnchangedStoresNothing(t *testing.T) {
	ws := filepath.Join(t.TempDir(), "ws")
	makeTree(t, ws, 4)
	r := newRepo(t, dirStore(t))
	_, key := save(t, r, "p", ws, nil)
	m, _ := r.Manifest(testCtx(t), key)
	before, n := storedBytes(t, r.Store(), "")
	// Touch the root and a file: times change, content does not.
	now := time.Now()
	os.Chtimes(ws, now, now)
	os.Chtimes(filepath.Join(ws, "src", "pkg", "f03.go"), now, now)
	res, err := r.Build(testCtx(t), DirSource{Dir: ws}, BuildOptions{Project: "p", Base: m, Newest: &m.Tree})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Unchanged {
		t.Fatalf("a touch made a new snapshot: tree %s vs %s", res.Manifest.Tree, m.Tree)
	}
	after, n2 := storedBytes(t, r.Store(), "")
	if after != before || n2 != n {
		t.Errorf("an unchanged save stored %d bytes in %d objects", after-before, n2-n)
	}
}

func TestExportEqualsTarGz(t *testing.T) {
	ws := filepath.Join(t.TempDir(), "ws")
	makeTree(t, ws, 5)
	r := newRepo(t, dirStore(t))
	_, key := save(t, r, "p", ws, nil)
	m, _ := r.Manifest(testCtx(t), key)
	var exp bytes.Buffer
	if _, err := r.Export(testCtx(t), m, &exp); err != nil {
		t.Fatal(err)
	}
	// Round trip: the export read back as a Streamer gives the same tree.
	ts := &TarSource{R: bytes.NewReader(exp.Bytes())}
	res, err := r.Build(testCtx(t), ts, BuildOptions{Project: "q"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Manifest.Tree != m.Tree {
		t.Errorf("export read back has tree %s, want %s", res.Manifest.Tree, m.Tree)
	}
	_ = io.Discard
}
