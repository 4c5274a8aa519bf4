// Package chunkedtest is the conformance suite of the chunked snapshot format on a store:
// what a save, a restore, a fork, a merge and a collection promise, run on every store
// backend (the directory store and S3, through a real S3-compatible server), as storetest
// is for the store itself.
package chunkedtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/chunked"
	"github.com/toolhost/toolhost/internal/tree"
)

// Run runs the suite; newStore returns an empty store for one subtest.
func Run(t *testing.T, newStore func(t *testing.T) store.Store) {
	for _, c := range []struct {
		name string
		fn   func(*testing.T, store.Store)
	}{
		{"RoundTripBitForBit", testRoundTrip},
		{"OneChangedByteStoresOneChunksPack", testOneChangedByte},
		{"TwoProjectsShareChunks", testSharedAcrossProjects},
		{"TouchStoresNothing", testUnchanged},
		{"ExportReadsBack", testExportReadsBack},
		{"ForkDiffMerge", testForkDiffMerge},
		{"CorruptChunkRefused", testCorruptRefused},
		{"CollectAfterRetention", testCollectAfterRetention},
		{"DamagedPackSetAside", testDamagedPackSetAside},
		{"CorruptIndexAndDoomedList", testCorruptIndexAndDoomedList},
	} {
		t.Run(c.name, func(t *testing.T) { c.fn(t, newStore(t)) })
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func newRepo(t *testing.T, st store.Store) *chunked.Repo {
	r, err := chunked.New(chunked.Config{Store: st, Retry: store.Retry{Attempts: 2, Backoff: 10 * time.Millisecond}, TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// makeTree writes a small workspace: text files, an empty file, a large file of several
// chunks, nested directories with odd modes, and links.
// MakeTree writes a small workspace: text files, an empty file, a large file of several
// chunks, nested directories with odd modes, links, and an excluded directory.
func MakeTree(t *testing.T, root string, seed uint64) {
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
	big := make([]byte, 3*chunked.MaxChunk+12345)
	for i := range big {
		big[i] = byte(r.Uint32() >> (i % 3 * 8))
	}
	must(os.WriteFile(filepath.Join(root, "big.bin"), big, 0o644))
	must(os.Symlink("src/pkg/f01.go", filepath.Join(root, "link")))
	must(os.Symlink("../big.bin", filepath.Join(root, "a.b", "up")))
	must(os.Mkdir(filepath.Join(root, "src", "emptydir"), 0o700))
	must(os.MkdirAll(filepath.Join(root, "node_modules", "x"), 0o755)) // excluded
	must(os.WriteFile(filepath.Join(root, "node_modules", "x", "i.js"), []byte("x"), 0o644))
	Backdate(t, root)
}

// backdate moves every modification time an hour back, as if the files were written
// long before the save (a file changed within a second of a save is read again by the
// next one: the racily-clean rule).
func Backdate(t *testing.T, root string) {
	t.Helper()
	if err := BackdateDir(root); err != nil {
		t.Fatal(err)
	}
}

// BackdateDir is Backdate for benchmarks.
func BackdateDir(root string) error {
	old := time.Now().Add(-time.Hour)
	return filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			return os.Chtimes(p, old, old)
		}
		return nil
	})
}

// sameTree fails unless a and b hold the same entries, bit for bit: types, modes, sizes,
// contents, link targets and modification times.
// SameTree fails unless a and b hold the same entries, bit for bit.
func SameTree(t *testing.T, a, b string) {
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

func save(t *testing.T, r *chunked.Repo, project, dir string, base *chunked.Manifest) (*chunked.BuildResult, string) {
	t.Helper()
	ctx := testCtx(t)
	src := chunked.DirSource{Dir: dir}
	mode, mtime := src.Root()
	res, err := r.Build(ctx, src, chunked.BuildOptions{Project: project, Base: base, RootMode: mode, RootMTime: mtime})
	if err != nil {
		t.Fatalf("save %s: %v", project, err)
	}
	key := chunked.ManifestKey(project, time.Now(), chunked.NewNonce())
	if err := r.Commit(ctx, res, key); err != nil {
		t.Fatalf("commit %s: %v", key, err)
	}
	return res, key
}

func testRoundTrip(t *testing.T, st store.Store) {
	ws := filepath.Join(t.TempDir(), "ws")
	MakeTree(t, ws, 1)
	r := newRepo(t, st)
	res, key := save(t, r, "p1", ws, nil)
	if res.Stats.Files != 43 || res.Stats.Symlinks != 2 || res.Stats.NewChunks < 43 {
		t.Errorf("stats %+v", res.Stats)
	}
	// A fresh chunked.Repo (another process) restores it.
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
	SameTree(t, ws, out)
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

func testOneChangedByte(t *testing.T, st store.Store) {
	ws := filepath.Join(t.TempDir(), "ws")
	MakeTree(t, ws, 2)
	r := newRepo(t, st)
	first, key := save(t, r, "p", ws, nil)
	_, packsBefore := storedBytes(t, r.Store(), chunked.PrefixPacks)
	// Change one byte in the middle of the large file.
	f, err := os.OpenFile(filepath.Join(ws, "big.bin"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{'!'}, chunked.MaxChunk+100)
	f.Close()
	m, _ := r.Manifest(testCtx(t), key)
	second, _ := save(t, r, "p", ws, m)
	if second.Stats.Read != 1 {
		t.Errorf("the second save read %d files, want the one changed", second.Stats.Read)
	}
	if second.Stats.NewChunks < 1 || second.Stats.NewChunks > 2 {
		t.Errorf("the second save stored %d new chunks, want the one around the change (or two when it moved a cut)", second.Stats.NewChunks)
	}
	_, packsAfter := storedBytes(t, r.Store(), chunked.PrefixPacks)
	if packsAfter != packsBefore+1 {
		t.Errorf("packs: %d before, %d after; want one more", packsBefore, packsAfter)
	}
	if second.Stats.Uploaded >= first.Stats.Uploaded/2 || second.Stats.Uploaded > 3*chunked.MaxChunk {
		t.Errorf("second save uploaded %d bytes (first %d)", second.Stats.Uploaded, first.Stats.Uploaded)
	}
}

func testSharedAcrossProjects(t *testing.T, st store.Store) {
	ws := filepath.Join(t.TempDir(), "ws")
	MakeTree(t, ws, 3)
	save(t, newRepo(t, st), "alpha", ws, nil)
	before, _ := storedBytes(t, st, chunked.PrefixPacks)
	// Another host saves another project with the same files.
	res, _ := save(t, newRepo(t, st), "beta", ws, nil)
	after, _ := storedBytes(t, st, chunked.PrefixPacks)
	if res.Stats.NewChunks != 0 {
		t.Errorf("the second project stored %d new chunks; want none", res.Stats.NewChunks)
	}
	if grow := after - before; grow > 64<<10 {
		t.Errorf("packs grew by %d bytes for the second project (its segments only expected)", grow)
	}
}

func testUnchanged(t *testing.T, st store.Store) {
	ws := filepath.Join(t.TempDir(), "ws")
	MakeTree(t, ws, 4)
	r := newRepo(t, st)
	_, key := save(t, r, "p", ws, nil)
	m, _ := r.Manifest(testCtx(t), key)
	before, n := storedBytes(t, r.Store(), "")
	// Touch the root and a file: times change, content does not.
	now := time.Now()
	os.Chtimes(ws, now, now)
	os.Chtimes(filepath.Join(ws, "src", "pkg", "f03.go"), now, now)
	res, err := r.Build(testCtx(t), chunked.DirSource{Dir: ws}, chunked.BuildOptions{Project: "p", Base: m, Newest: &m.Tree})
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

func testExportReadsBack(t *testing.T, st store.Store) {
	ws := filepath.Join(t.TempDir(), "ws")
	MakeTree(t, ws, 5)
	r := newRepo(t, st)
	_, key := save(t, r, "p", ws, nil)
	m, _ := r.Manifest(testCtx(t), key)
	var exp bytes.Buffer
	if _, err := r.Export(testCtx(t), m, &exp); err != nil {
		t.Fatal(err)
	}
	// Round trip: the export read back as a Streamer gives the same tree.
	ts := &chunked.TarSource{R: bytes.NewReader(exp.Bytes())}
	res, err := r.Build(testCtx(t), ts, chunked.BuildOptions{Project: "q"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Manifest.Tree != m.Tree {
		t.Errorf("export read back has tree %s, want %s", res.Manifest.Tree, m.Tree)
	}
	_ = io.Discard
}

func testForkDiffMerge(t *testing.T, st store.Store) {
	ctx := testCtx(t)
	r := newRepo(t, st)
	ws := filepath.Join(t.TempDir(), "ws")
	MakeTree(t, ws, 11)
	write := func(p, s string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(ws, p), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("notes.txt", "one\ntwo\nthree\nfour\nfive\nsix\nseven\n")
	Backdate(t, ws)
	_, kp := save(t, r, "origin", ws, nil)
	mp, _ := r.Manifest(ctx, kp)
	before, _ := storedBytes(t, r.Store(), chunked.PrefixPacks)

	// Fork: a new project whose first snapshot is the origin's; no chunk copied.
	fk := chunked.ManifestKey("fork", time.Now(), chunked.NewNonce())
	fork, err := r.Copy(ctx, mp, fk, "fork of origin", kp)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Copy(ctx, mp, chunked.OriginKey("fork"), "origin", kp); err != nil {
		t.Fatal(err)
	}
	if after, _ := storedBytes(t, r.Store(), chunked.PrefixPacks); after != before {
		t.Errorf("a fork stored %d bytes of packs", after-before)
	}
	if fork.Tree != mp.Tree {
		t.Error("the fork's tree differs from its origin's")
	}

	// The fork edits notes.txt at the end and adds a file; the origin edits its start.
	forkWS := filepath.Join(t.TempDir(), "fork")
	if _, err := r.RestoreDir(ctx, fork, forkWS, tree.WriterOptions{}); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(forkWS, "notes.txt"), []byte("one\ntwo\nthree\nfour\nfive\nsix\nSEVEN\n"), 0o644)
	os.WriteFile(filepath.Join(forkWS, "added.txt"), []byte("new in the fork\n"), 0o644)
	_, fk2 := save(t, r, "fork", forkWS, fork)
	theirs, _ := r.Manifest(ctx, fk2)
	write("notes.txt", "ONE\ntwo\nthree\nfour\nfive\nsix\nseven\n")
	_, kp2 := save(t, r, "origin", ws, mp)
	ours, _ := r.Manifest(ctx, kp2)

	// Diff across projects: what the fork changed.
	ea, _ := r.Entries(ctx, mp)
	eb, _ := r.Entries(ctx, theirs)
	changes := chunked.DiffEntries(ea, eb)
	if len(changes) != 2 || changes[0].Path != "added.txt" || changes[0].Kind != "added" || changes[1].Path != "notes.txt" {
		t.Fatalf("changes %+v", changes)
	}
	var sb strings.Builder
	if err := r.TextDiff(ctx, &sb, changes, "a", "b"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(sb.String(), "-seven\n+SEVEN\n") || !strings.Contains(sb.String(), "+new in the fork\n") {
		t.Errorf("diff:\n%s", sb.String())
	}

	// Merge the fork back: both edits of notes.txt land, and the added file.
	base, err := r.Manifest(ctx, chunked.OriginKey("fork"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Merge(ctx, base, ours, theirs)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Conflicts) != 0 || len(res.Merged) != 1 {
		t.Fatalf("merge: %+v", res)
	}
	mk := chunked.ManifestKey("origin", time.Now(), chunked.NewNonce())
	merged, err := r.CommitMerge(ctx, res, ours, mk, "merge fork")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "merged")
	if _, err := r.RestoreDir(ctx, merged, out, tree.WriterOptions{}); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join(out, "notes.txt"))
	if string(got) != "ONE\ntwo\nthree\nfour\nfive\nsix\nSEVEN\n" {
		t.Errorf("merged notes.txt: %q", got)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "added.txt")); string(b) != "new in the fork\n" {
		t.Errorf("added.txt: %q", b)
	}

	// A conflicting edit: reported, nothing written.
	os.WriteFile(filepath.Join(forkWS, "notes.txt"), []byte("uno\ntwo\nthree\nfour\nfive\nsix\nSEVEN\n"), 0o644)
	_, fk3 := save(t, r, "fork", forkWS, theirs)
	theirs2, _ := r.Manifest(ctx, fk3)
	res, err = r.Merge(ctx, base, merged, theirs2)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Conflicts) != 1 || res.Conflicts[0].Path != "notes.txt" {
		t.Fatalf("conflicts %+v", res.Conflicts)
	}
	keys, _ := r.ListManifests(ctx, "origin")
	if _, err := r.CommitMerge(ctx, res, merged, chunked.ManifestKey("origin", time.Now(), chunked.NewNonce()), "merge"); err == nil {
		t.Fatal("a merge with conflicts was written")
	}
	if keys2, _ := r.ListManifests(ctx, "origin"); len(keys2) != len(keys) {
		t.Error("a refused merge left a snapshot")
	}
}

func testCorruptRefused(t *testing.T, st store.Store) {
	ctx := testCtx(t)
	r := newRepo(t, st)
	ws := filepath.Join(t.TempDir(), "ws")
	MakeTree(t, ws, 12)
	_, key := save(t, r, "p", ws, nil)
	if _, err := r.Manifest(ctx, key); err != nil {
		t.Fatal(err)
	}
	// Flip one byte in every pack, behind the snapshot's back: the store's own SHA-256
	// is rewritten to match, as a bad disk or a careless copy would leave it, so only the
	// chunks' digests can tell.
	packs, err := store.ListAll(ctx, st, chunked.PrefixPacks)
	if err != nil || len(packs) == 0 {
		t.Fatalf("packs: %v %v", packs, err)
	}
	for _, o := range packs {
		rc, _, err := st.Get(ctx, o.Key)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(rc)
		rc.Close()
		b[len(b)/3] ^= 0xff
		sum := sha256.Sum256(b)
		if _, err := st.Put(ctx, o.Key, bytes.NewReader(b), store.PutOptions{Size: int64(len(b)), Metadata: map[string]string{"sha256": hex.EncodeToString(sum[:])}}); err != nil {
			t.Fatal(err)
		}
	}
	fresh := newRepo(t, st)
	m, _ := fresh.Manifest(ctx, key)
	_, err = fresh.Verify(ctx, m)
	if !errors.Is(err, chunked.ErrCorrupt) {
		t.Fatalf("verify of a corrupted snapshot: %v", err)
	}
	out := filepath.Join(t.TempDir(), "out")
	if _, err := fresh.RestoreDir(ctx, m, out, tree.WriterOptions{}); !errors.Is(err, chunked.ErrCorrupt) {
		t.Fatalf("restore of a corrupted snapshot: %v", err)
	}
}

// keepNewest deletes all but the project's newest n manifests (retention).
// KeepNewest deletes all but the project's newest n manifests (retention).
func KeepNewest(ctx context.Context, r *chunked.Repo, project string, n int) error {
	keys, err := r.ListManifests(ctx, project)
	if err != nil {
		return err
	}
	slices.Sort(keys)
	if len(keys) <= n {
		return nil
	}
	return r.Delete(ctx, keys[:len(keys)-n]...)
}

func testCollectAfterRetention(t *testing.T, st store.Store) {
	ctx := testCtx(t)
	clock := time.Now()
	var mu sync.Mutex
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
	r, err := chunked.New(chunked.Config{Store: st, Grace: time.Hour, Now: now, TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(t.TempDir(), "ws")
	MakeTree(t, ws, 9)
	_, k1 := save(t, r, "p", ws, nil)
	m1, _ := r.Manifest(ctx, k1)
	// The workspace is replaced by something else entirely: every pack of the first
	// snapshot is referenced by it alone.
	os.RemoveAll(ws)
	os.MkdirAll(ws, 0o755)
	os.WriteFile(filepath.Join(ws, "new.txt"), []byte("a new start\n"), 0o644)
	Backdate(t, ws)
	_, k2 := save(t, r, "p", ws, m1)
	if err := KeepNewest(ctx, r, "p", 1); err != nil {
		t.Fatal(err)
	}
	// The packs are younger than the grace period: nothing is marked yet. (The directory
	// store's times are the files'; age them.)
	cs, err := r.Collect(ctx)
	if err != nil || cs.Marked != 0 {
		t.Fatalf("first collection: %+v, %v", cs, err)
	}
	advance(2 * time.Hour)
	cs, err = r.Collect(ctx)
	if err != nil || cs.Marked == 0 || cs.Deleted != 0 {
		t.Fatalf("mark: %+v, %v", cs, err)
	}
	before, _ := storedBytes(t, st, chunked.PrefixPacks)
	advance(2 * time.Hour)
	cs, err = r.Collect(ctx)
	if err != nil || cs.Deleted == 0 || cs.Freed < int64(3*chunked.MaxChunk) {
		t.Fatalf("sweep: %+v, %v", cs, err)
	}
	after, _ := storedBytes(t, st, chunked.PrefixPacks)
	if before-after < int64(3*chunked.MaxChunk) {
		t.Errorf("packs shrank by %d bytes; the large file's chunks (%d) were expected to go", before-after, 3*chunked.MaxChunk)
	}
	// What is left still restores, in a fresh process's view.
	r2 := newRepo(t, st)
	m2, err := r2.Manifest(ctx, k2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r2.Verify(ctx, m2); err != nil {
		t.Fatalf("the kept snapshot no longer verifies: %v", err)
	}
}

// rot flips a byte of the object key, keeping the checksum stored with it: as a bad disk
// leaves it.
func rot(t *testing.T, st store.Store, key string) {
	t.Helper()
	ctx := testCtx(t)
	rc, oi, err := st.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	b[len(b)/3] ^= 0xff
	if _, err := st.Put(ctx, key, bytes.NewReader(b), store.PutOptions{Size: int64(len(b)), Metadata: oi.Metadata}); err != nil {
		t.Fatal(err)
	}
}

// testDamagedPackSetAside: a snapshot whose pack rots is examined and set aside; a save
// then stores anew what was in the pack; a collection keeps the pack while the
// quarantined snapshot references it, and takes it, with its damage record, once that
// snapshot is deleted.
func testDamagedPackSetAside(t *testing.T, st store.Store) {
	ctx := testCtx(t)
	clock := time.Now()
	var mu sync.Mutex
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
	repo := func() *chunked.Repo {
		r, err := chunked.New(chunked.Config{Store: st, Grace: time.Hour, Now: now, TempDir: t.TempDir(),
			Retry: store.Retry{Attempts: 2, Backoff: 10 * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	r := repo()
	ws := filepath.Join(t.TempDir(), "ws")
	MakeTree(t, ws, 13)
	_, k1 := save(t, r, "p", ws, nil)
	m1, _ := r.Manifest(ctx, k1)
	before, _ := store.ListAll(ctx, st, chunked.PrefixPacks)
	extra := make([]byte, 2*chunked.MaxChunk)
	for i := range extra {
		extra[i] = byte(i * 7 / 3)
	}
	extra[0] = 'x'
	rand.New(rand.NewPCG(5, 5)).Shuffle(len(extra), func(i, j int) { extra[i], extra[j] = extra[j], extra[i] })
	if err := os.WriteFile(filepath.Join(ws, "extra.bin"), extra, 0o644); err != nil {
		t.Fatal(err)
	}
	Backdate(t, ws)
	_, k2 := save(t, r, "p", ws, m1)
	// The pack of extra.bin's first chunk rots (one pack: the others are sound).
	m2, _ := r.Manifest(ctx, k2)
	entries, err := r.Entries(ctx, m2)
	if err != nil {
		t.Fatal(err)
	}
	var damaged []chunked.PackID
	for _, e := range entries {
		if e.Path == "extra.bin" {
			damaged = append(damaged, e.Chunks[0].Pack)
		}
	}
	if len(damaged) != 1 || slices.ContainsFunc(before, func(b store.ObjectInfo) bool { return b.Key == chunked.PackKey(damaged[0]) }) {
		t.Fatalf("extra.bin's first chunk is in %v, not in a pack of the second save", damaged)
	}
	rot(t, st, chunked.PackKey(damaged[0]))

	// Another process finds it: the pack is named, checked, recorded; the snapshot set aside.
	r2 := repo()
	m2, err = r2.Manifest(ctx, k2)
	if err != nil {
		t.Fatal(err)
	}
	_, verr := r2.Verify(ctx, m2)
	var pe *chunked.PackError
	if !errors.Is(verr, chunked.ErrCorrupt) || !errors.As(verr, &pe) || !slices.Contains(damaged, pe.Pack) {
		t.Fatalf("verify of the damaged snapshot: %v", verr)
	}
	d, err := r2.NewExaminer().Examine(ctx, k2, verr)
	if err != nil || !d.Damaged || d.Reason != chunked.DamagedPack || len(d.Packs) == 0 {
		t.Fatalf("examination: %+v %v", d, err)
	}
	q, err := r2.SetAside(ctx, k2, d.Reason, d.Why, d.Packs)
	if err != nil {
		t.Fatal(err)
	}
	qs, err := r2.Quarantined(ctx, "p")
	if err != nil || len(qs) != 1 || qs[0].Key != q || qs[0].Snapshot != k2 || qs[0].Reason != chunked.DamagedPack || qs[0].Why == "" || len(qs[0].Packs) == 0 {
		t.Fatalf("quarantine: %+v %v", qs, err)
	}
	if keys, _ := r2.ListManifests(ctx, "p"); slices.Contains(keys, k2) {
		t.Error("the snapshot set aside is still among the project's")
	}
	if again, err := repo().SetAside(ctx, k2, d.Reason, d.Why, d.Packs); err != nil || again != q {
		t.Errorf("a second setting aside (another process): %q %v; want %q", again, err, q)
	}
	if qs, _ := r2.Quarantined(ctx, "p"); len(qs) != 1 {
		t.Errorf("set aside twice: %+v", qs)
	}
	// A save of the same tree over the first snapshot stores the damaged pack's chunks anew.
	res, k3 := save(t, r2, "p", ws, m1)
	if res.Stats.NewChunks < 1 {
		t.Errorf("the save stored %d new chunks; the damaged pack's were to be stored anew", res.Stats.NewChunks)
	}
	m3, _ := r2.Manifest(ctx, k3)
	for _, p := range m3.Packs {
		if slices.Contains(damaged, p) {
			t.Fatalf("the save reused the damaged pack %s", p)
		}
	}
	if _, err := repo().Verify(ctx, m3); err != nil {
		t.Fatalf("the save after the damage does not verify: %v", err)
	}
	// Collections keep the damaged pack for the quarantined snapshot...
	if err := KeepNewest(ctx, r2, "p", 1); err != nil {
		t.Fatal(err)
	}
	collect := func() {
		t.Helper()
		advance(2 * time.Hour)
		if _, err := r2.Collect(ctx); err != nil {
			t.Fatal(err)
		}
	}
	collect()
	collect()
	for _, p := range damaged {
		if _, err := st.Head(ctx, chunked.PackKey(p)); err != nil {
			t.Fatalf("a collection took pack %s, which a quarantined snapshot needs: %v", p, err)
		}
	}
	// ...until it is deleted.
	if err := st.Delete(ctx, q); err != nil {
		t.Fatal(err)
	}
	collect()
	collect()
	for _, p := range damaged {
		if _, err := st.Head(ctx, chunked.PackKey(p)); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("pack %s outlived its last snapshot: %v", p, err)
		}
	}
	if recs, _ := store.ListAll(ctx, st, chunked.PrefixDamaged); len(recs) != 0 {
		t.Errorf("damage records of deleted packs are left: %v", recs)
	}
	if _, err := repo().Verify(ctx, m3); err != nil {
		t.Errorf("the kept snapshot does not verify after the collections: %v", err)
	}
}

// testCorruptIndexAndDoomedList: an index object and a doomed list that do not read stop
// no save (the save reuses nothing it cannot vouch for, and stores it anew); a
// collection drops the doomed list.
func testCorruptIndexAndDoomedList(t *testing.T, st store.Store) {
	ctx := testCtx(t)
	r := newRepo(t, st)
	ws := filepath.Join(t.TempDir(), "ws")
	MakeTree(t, ws, 14)
	_, k1 := save(t, r, "p", ws, nil)
	garbage := []byte("not what it claims to be")
	for _, k := range []string{chunked.PrefixIndex + "20990101T000000Z-deadbeef", chunked.PrefixDoomed + "20200101T000000Z-deadbeef"} {
		if _, err := st.Put(ctx, k, bytes.NewReader(garbage), store.PutOptions{Size: int64(len(garbage))}); err != nil {
			t.Fatal(err)
		}
	}
	r2 := newRepo(t, st)
	m1, err := r2.Manifest(ctx, k1)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(ws, "later.txt"), []byte("later\n"), 0o644)
	res, k2 := save(t, r2, "p", ws, m1)
	if res.Stats.NewChunks < 43 {
		t.Errorf("a save that cannot know what is doomed reused chunks: %d new", res.Stats.NewChunks)
	}
	m2, _ := r2.Manifest(ctx, k2)
	out := filepath.Join(t.TempDir(), "out")
	if _, err := newRepo(t, st).RestoreDir(ctx, m2, out, tree.WriterOptions{}); err != nil {
		t.Fatalf("restore of the save: %v", err)
	}
	if _, err := r2.Collect(ctx); err != nil {
		t.Fatalf("collection: %v", err)
	}
	if left, _ := store.ListAll(ctx, st, chunked.PrefixDoomed); len(left) != 0 {
		t.Errorf("the doomed list that does not read is still there: %v", left)
	}
}

var words = strings.Fields(`func return if else for range package import type struct interface
	map string int error nil err ctx context defer go select case switch default var const
	buf len make append copy delete close chan bool true false byte rune float64 uint64
	handler request response server client config options logger value result index count`)

// SourceTree writes a source-like tree under root: files small text files of 0.5 to
// 11.5 KiB in 60 packages of 9 directories, and 10 files of 3 MiB (4 JSON-lines logs, 4
// half-random, 2 random). With 19,990 small files it is about 150 MB in 20,000 files.
// It returns the bytes written.
func SourceTree(root string, small int, seed uint64) (int64, error) {
	r := rand.New(rand.NewPCG(seed, 2))
	var total int64
	var sb strings.Builder
	for i := range small {
		dir := filepath.Join(root, fmt.Sprintf("pkg%02d", i%60), fmt.Sprintf("sub%d", i%9))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return total, err
		}
		sb.Reset()
		size := 512 + r.IntN(11*1024)
		fmt.Fprintf(&sb, "// file %d\npackage pkg%02d\n\n", i, i%60)
		for sb.Len() < size {
			sb.WriteString(strings.Repeat("\t", r.IntN(4)))
			for range 3 + r.IntN(8) {
				sb.WriteString(words[r.IntN(len(words))])
				if r.IntN(4) == 0 {
					fmt.Fprintf(&sb, "%d", r.IntN(1000))
				}
				sb.WriteByte(' ')
			}
			sb.WriteString("\n")
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%05d.go", i)), []byte(sb.String()), 0o644); err != nil {
			return total, err
		}
		total += int64(sb.Len())
	}
	large := filepath.Join(root, "data")
	if err := os.MkdirAll(large, 0o755); err != nil {
		return total, err
	}
	const big = 3 << 20
	for i := range 10 {
		buf := make([]byte, 0, big+4096)
		switch {
		case i < 4:
			for k := 0; len(buf) < big; k++ {
				buf = fmt.Appendf(buf, `{"ts":"2026-11-21T09:%02d:%02d.%06dZ","level":"%s","req":"%016x","path":"/api/v1/%s/%d","ms":%d}`+"\n",
					k/60%60, k%60, r.IntN(1e6), []string{"info", "debug", "warn"}[r.IntN(3)], r.Uint64(), words[r.IntN(len(words))], r.IntN(5000), r.IntN(900))
			}
		case i < 8:
			rec := make([]byte, 64)
			for len(buf) < big {
				if r.IntN(2) == 0 {
					for range 512 {
						buf = append(buf, byte(r.Uint32()))
					}
				} else {
					for j := range rec {
						rec[j] = byte(j * (i + 1))
					}
					for range 8 {
						buf = append(buf, rec...)
					}
				}
			}
		default:
			for len(buf) < big {
				u := r.Uint64()
				for k := range 8 {
					buf = append(buf, byte(u>>(8*k)))
				}
			}
		}
		buf = buf[:big]
		if err := os.WriteFile(filepath.Join(large, fmt.Sprintf("large%d.bin", i)), buf, 0o644); err != nil {
			return total, err
		}
		total += int64(len(buf))
	}
	return total, nil
}
