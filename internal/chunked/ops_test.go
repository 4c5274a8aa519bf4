package chunked

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/internal/tree"
)

func TestForkDiffMerge(t *testing.T) {
	ctx := testCtx(t)
	r := newRepo(t, dirStore(t))
	ws := filepath.Join(t.TempDir(), "ws")
	makeTree(t, ws, 11)
	write := func(p, s string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(ws, p), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("notes.txt", "one\ntwo\nthree\nfour\nfive\nsix\nseven\n")
	backdate(t, ws)
	_, kp := save(t, r, "origin", ws, nil)
	mp, _ := r.Manifest(ctx, kp)
	before, _ := storedBytes(t, r.Store(), PrefixPacks)

	// Fork: a new project whose first snapshot is the origin's; no chunk copied.
	fk := ManifestKey("fork", time.Now(), NewNonce())
	fork, err := r.Copy(ctx, mp, fk, "fork of origin", kp)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Copy(ctx, mp, OriginKey("fork"), "origin", kp); err != nil {
		t.Fatal(err)
	}
	if after, _ := storedBytes(t, r.Store(), PrefixPacks); after != before {
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
	changes := DiffEntries(ea, eb)
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
	base, err := r.Manifest(ctx, OriginKey("fork"))
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
	mk := ManifestKey("origin", time.Now(), NewNonce())
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
	if _, err := r.CommitMerge(ctx, res, merged, ManifestKey("origin", time.Now(), NewNonce()), "merge"); err == nil {
		t.Fatal("a merge with conflicts was written")
	}
	if keys2, _ := r.ListManifests(ctx, "origin"); len(keys2) != len(keys) {
		t.Error("a refused merge left a snapshot")
	}
}

func TestCorruptChunkRefused(t *testing.T) {
	ctx := testCtx(t)
	st := dirStore(t)
	r := newRepo(t, st)
	ws := filepath.Join(t.TempDir(), "ws")
	makeTree(t, ws, 12)
	_, key := save(t, r, "p", ws, nil)
	m, _ := r.Manifest(ctx, key)
	// Flip one byte in every pack on disk (behind the store's back).
	root := st.(interface{ Dir() string }).Dir()
	n := 0
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() && strings.Contains(p, "/chunks/packs/") {
			b, _ := os.ReadFile(p)
			b[len(b)/3] ^= 0xff
			os.WriteFile(p, b, 0o600)
			n++
		}
		return nil
	})
	if n == 0 {
		t.Fatal("no pack found to corrupt")
	}
	fresh := newRepo(t, st)
	m, _ = fresh.Manifest(ctx, key)
	_, err := fresh.Verify(ctx, m)
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("verify of a corrupted snapshot: %v", err)
	}
	out := filepath.Join(t.TempDir(), "out")
	if _, err := fresh.RestoreDir(ctx, m, out, tree.WriterOptions{}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("restore of a corrupted snapshot: %v", err)
	}
}
