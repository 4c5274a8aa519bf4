package snapshot_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/archive"
	"github.com/toolhost/toolhost/internal/chunked"
	"github.com/toolhost/toolhost/internal/chunked/chunkedtest"
	"github.com/toolhost/toolhost/internal/snapshot"
)

// putTarGz stores data (a tar.gz) as a snapshot of the project taken at at, as versions
// before chunked became the only storage format wrote one: one object under a .tar.gz
// key, with its SHA-256 and content digest in its metadata. Tests of reading, restoring,
// exporting, pruning and converting such snapshots make them with it.
func putTarGz(t testing.TB, st store.Store, project string, at time.Time, data []byte) snapshot.Info {
	t.Helper()
	sum := sha256.Sum256(data)
	md := map[string]string{snapshot.MetaSHA256: hex.EncodeToString(sum[:])}
	if d, err := chunked.TarTreeDigest(bytes.NewReader(data)); err == nil {
		md[snapshot.MetaTree] = d.String()
	}
	key := snapshot.Key(project, at, snapshot.NewNonce())
	if _, err := st.Put(context.Background(), key, bytes.NewReader(data), store.PutOptions{
		Size: int64(len(data)), ContentType: "application/gzip", Metadata: md, IfNotExists: true}); err != nil {
		t.Fatal(err)
	}
	return snapshot.Info{ProjectID: project, Key: key, Time: at.UTC().Truncate(time.Millisecond), Size: int64(len(data)),
		SHA256: md[snapshot.MetaSHA256], Format: snapshot.FormatTarGz, Tree: md[snapshot.MetaTree]}
}

// restoreConverting restores the project's newest snapshot into a fresh directory, as a
// session's wake does (Target.Convert set to allow), and returns it and the directory.
func restoreConverting(t *testing.T, m *snapshot.Manager, project string, allow func() error) (snapshot.Info, string) {
	t.Helper()
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "ws")
	info, err := m.RestoreTo(ctx, project, snapshot.Target{Extract: func(r io.Reader) error {
		os.RemoveAll(dir)
		_, err := archive.Extract(ctx, r, dir, archive.ExtractOptions{})
		return err
	}, Convert: allow})
	if err != nil {
		t.Fatal(err)
	}
	return info, dir
}

// oldProject stores a tree as a tar.gz snapshot of the project, as older versions did,
// and returns it and the tree as the archive holds it (times to the second).
func oldProject(t *testing.T, st store.Store, project string, at time.Time) (snapshot.Info, string) {
	t.Helper()
	ctx := context.Background()
	ws := filepath.Join(t.TempDir(), "ws")
	chunkedtest.MakeTree(t, ws, 11)
	var arc bytes.Buffer
	if _, err := archive.Pack(ctx, &arc, ws, archive.PackOptions{}); err != nil {
		t.Fatal(err)
	}
	held := filepath.Join(t.TempDir(), "held")
	if _, err := archive.Extract(ctx, bytes.NewReader(arc.Bytes()), held, archive.ExtractOptions{}); err != nil {
		t.Fatal(err)
	}
	return putTarGz(t, st, project, at, arc.Bytes()), held
}

// A wake (a restore with Convert) from a project whose newest snapshot is a tar.gz one
// restores it and stores a chunked snapshot of the same content, naming it as its origin;
// the tar.gz snapshot stays, even under a retention of one. A restore without Convert
// (snapshot restore) writes nothing; nor does one whose Convert refuses, nor a wake from
// a chunked snapshot.
func TestRestoreConvertsTarGz(t *testing.T) {
	ctx := tctx(t)
	st := newDir(t).s
	m, clk, logs := newManager(t, st, func(c *snapshot.Config) { c.Keep = 1 })
	old, ws := oldProject(t, st, "p", clk.Now())
	clk.Add(time.Minute)

	count := func() int {
		t.Helper()
		list, err := m.List(ctx, "p")
		if err != nil {
			t.Fatal(err)
		}
		return len(list)
	}
	if _, _, err := m.RestoreDir(ctx, "p", filepath.Join(t.TempDir(), "plain"), false); err != nil || count() != 1 {
		t.Fatalf("a restore without Convert: %v, %d snapshots", err, count())
	}
	lost := errors.New("test: the lease is lost")
	if info, dir := restoreConverting(t, m, "p", func() error { return lost }); info.Converted != "" || count() != 1 {
		t.Fatalf("a restore whose Convert refused wrote %q (%d snapshots)", info.Converted, count())
	} else {
		sameContent(t, ws, dir)
	}
	if !strings.Contains(logs.String(), "the lease is lost") {
		t.Errorf("the refused conversion is not logged")
	}

	info, dir := restoreConverting(t, m, "p", func() error { return nil })
	sameContent(t, ws, dir)
	if info.Key != old.Key || info.Converted == "" || snapshot.FormatOf(info.Converted) != snapshot.FormatChunked {
		t.Fatalf("the wake restored %s and converted it to %q", info.Key, info.Converted)
	}
	list, err := m.List(ctx, "p")
	if err != nil || len(list) != 2 || list[0].Key != info.Converted || list[1].Key != old.Key {
		t.Fatalf("after the conversion: %v %v; want the converted snapshot newest and the tar.gz one kept", keysOf(list), err)
	}
	cps, err := m.Checkpoints(ctx, "p")
	if err != nil || cps[0].Origin != old.Key || !strings.Contains(cps[0].Label, old.Key) {
		t.Errorf("the converted snapshot's checkpoint: %+v %v", cps, err)
	}
	again, dir := restoreConverting(t, m, "p", func() error { return nil })
	sameContent(t, ws, dir)
	if again.Key != info.Converted || again.Tree != old.Tree || again.Origin != old.Key || again.Converted != "" || count() != 2 {
		t.Errorf("the next wake: %+v (%d snapshots); want the converted snapshot, of the tar.gz one's content (%s)", again, count(), old.Tree)
	}
	// What works on chunked snapshots works from it: a rewind to it.
	if _, _, err := m.Rewind(ctx, "p", info.Converted); err != nil {
		t.Errorf("rewind to the converted snapshot: %v", err)
	}
}

// Two hosts waking the same project at once both convert: the two chunked snapshots hold
// the same content (its chunks stored once), and either restores it. A host whose store
// is fenced off (it lost the project's lease) writes nothing, and its wake still works.
func TestConcurrentConversionsAndFence(t *testing.T) {
	ctx := tctx(t)
	st := newDir(t).s
	m1, _, _ := newManager(t, st, nil)
	m2, _, _ := newManager(t, st, nil)
	old, ws := oldProject(t, st, "p", time.Now().Add(-time.Hour))

	g := &gate{Store: st, shut: true}
	if info, dir := restoreConverting(t, m1.WithStore(g), "p", func() error { return nil }); info.Converted != "" {
		t.Errorf("a fenced-off host converted: %s", info.Converted)
	} else {
		sameContent(t, ws, dir)
	}
	if list, _ := m1.List(ctx, "p"); len(list) != 1 {
		t.Fatalf("a fenced-off host wrote a snapshot: %v", keysOf(list))
	}

	var wg sync.WaitGroup
	for _, m := range []*snapshot.Manager{m1, m2} {
		wg.Go(func() { restoreConverting(t, m, "p", func() error { return nil }) })
	}
	wg.Wait()
	list, err := m1.List(ctx, "p")
	if err != nil || len(list) < 2 || len(list) > 3 || list[len(list)-1].Key != old.Key {
		t.Fatalf("after two conversions at once: %v %v", keysOf(list), err)
	}
	for _, in := range list[:len(list)-1] {
		dst := filepath.Join(t.TempDir(), "ws")
		got, _, err := m2.RestoreDirKey(ctx, "p", in.Key, dst, false)
		if err != nil || got.Tree != old.Tree {
			t.Fatalf("%s: %v, tree %s, want %s", in.Key, err, got.Tree, old.Tree)
		}
		sameContent(t, ws, dst)
	}
}

// sameContent compares two trees' content: paths, types, permission bits, file bytes,
// link targets (not times: an archive of older versions keeps them to the second, and
// its extraction leaves a link's to the clock).
func sameContent(t *testing.T, want, got string) {
	t.Helper()
	read := func(root string) map[string]string {
		out := map[string]string{}
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			fi, err := d.Info()
			if err != nil {
				return err
			}
			v := fi.Mode().String()
			switch {
			case fi.Mode()&fs.ModeSymlink != 0:
				tgt, err := os.Readlink(p)
				if err != nil {
					return err
				}
				v += " -> " + tgt
			case fi.Mode().IsRegular():
				b, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				v += " " + string(b)
			}
			out[filepath.ToSlash(rel)] = v
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	a, b := read(want), read(got)
	if len(a) != len(b) {
		t.Errorf("%d entries, want %d", len(b), len(a))
	}
	for p, v := range a {
		if b[p] != v {
			t.Errorf("%s differs", p)
		}
	}
}
