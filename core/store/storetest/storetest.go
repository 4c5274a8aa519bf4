// Package storetest is the conformance suite every store.Store backend runs: the
// behaviour callers rely on (round trips with metadata, ErrNotFound, ErrExists, lexical
// paged listing past 1,000 keys, prefix isolation, batch deletes).
package storetest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/store"
)

// Run runs the suite. newStore returns an empty store for one subtest.
func Run(t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Run("PutGetHead", func(t *testing.T) { testPutGetHead(t, newStore(t)) })
	t.Run("PutUnseekableReader", func(t *testing.T) { testUnseekable(t, newStore(t)) })
	t.Run("PutSizeMismatch", func(t *testing.T) { testSizeMismatch(t, newStore(t)) })
	t.Run("Overwrite", func(t *testing.T) { testOverwrite(t, newStore(t)) })
	t.Run("IfNotExists", func(t *testing.T) { testIfNotExists(t, newStore(t)) })
	t.Run("IfNotExistsRace", func(t *testing.T) { testIfNotExistsRace(t, newStore(t)) })
	t.Run("IfNotExistsListedAndDeleted", func(t *testing.T) { testIfNotExistsListed(t, newStore(t)) })
	t.Run("NotFound", func(t *testing.T) { testNotFound(t, newStore(t)) })
	t.Run("ListPagingPast1000", func(t *testing.T) { testListPaging(t, newStore(t)) })
	t.Run("ListOrderAndPrefix", func(t *testing.T) { testListOrder(t, newStore(t)) })
	t.Run("DeleteMany", func(t *testing.T) { testDeleteMany(t, newStore(t)) })
	t.Run("InvalidKeys", func(t *testing.T) { testInvalidKeys(t, newStore(t)) })
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

func put(t *testing.T, s store.Store, key string, data []byte, md map[string]string) store.ObjectInfo {
	t.Helper()
	oi, err := s.Put(ctx(t), key, bytes.NewReader(data), store.PutOptions{Size: int64(len(data)), Metadata: md})
	if err != nil {
		t.Fatalf("Put %s: %v", key, err)
	}
	return oi
}

func get(t *testing.T, s store.Store, key string) ([]byte, store.ObjectInfo) {
	t.Helper()
	rc, oi, err := s.Get(ctx(t), key)
	if err != nil {
		t.Fatalf("Get %s: %v", key, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read %s: %v", key, err)
	}
	return b, oi
}

func testPutGetHead(t *testing.T, s store.Store) {
	data := bytes.Repeat([]byte("snapshot bytes "), 70_000) // ~1 MiB
	sum := sha256.Sum256(data)
	md := map[string]string{"sha256": hex.EncodeToString(sum[:]), "project": "p-1"}
	oi := put(t, s, "projects/p-1/snapshots/a.tar.gz", data, md)
	if oi.Size != int64(len(data)) || oi.Key != "projects/p-1/snapshots/a.tar.gz" {
		t.Errorf("Put info %+v", oi)
	}
	got, gi := get(t, s, "projects/p-1/snapshots/a.tar.gz")
	if !bytes.Equal(got, data) {
		t.Fatalf("Get returned %d bytes, different from the %d put", len(got), len(data))
	}
	if gi.Size != int64(len(data)) || gi.Metadata["sha256"] != md["sha256"] || gi.Metadata["project"] != "p-1" {
		t.Errorf("Get info %+v", gi)
	}
	hi, err := s.Head(ctx(t), "projects/p-1/snapshots/a.tar.gz")
	if err != nil {
		t.Fatal(err)
	}
	if hi.Size != int64(len(data)) || hi.Metadata["sha256"] != md["sha256"] || hi.LastModified.IsZero() {
		t.Errorf("Head info %+v", hi)
	}
	if time.Since(hi.LastModified) > time.Hour || time.Until(hi.LastModified) > time.Hour {
		t.Errorf("LastModified %v is not now", hi.LastModified)
	}
	// Empty object.
	put(t, s, "empty", nil, nil)
	if b, oi := get(t, s, "empty"); len(b) != 0 || oi.Size != 0 {
		t.Errorf("empty object: %d bytes, info %+v", len(b), oi)
	}
}

// onlyReader hides every interface but io.Reader.
type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }

func testUnseekable(t *testing.T, s store.Store) {
	data := bytes.Repeat([]byte{1, 2, 3, 4, 5, 6, 7}, 300_000)
	for _, size := range []int64{int64(len(data)), -1} {
		key := fmt.Sprintf("pipe/%d", size)
		if _, err := s.Put(ctx(t), key, onlyReader{bytes.NewReader(data)}, store.PutOptions{Size: size}); err != nil {
			t.Fatalf("Put from a plain reader (size %d): %v", size, err)
		}
		if got, _ := get(t, s, key); !bytes.Equal(got, data) {
			t.Errorf("size %d: round trip differs", size)
		}
	}
}

func testSizeMismatch(t *testing.T, s store.Store) {
	_, err := s.Put(ctx(t), "short", onlyReader{strings.NewReader("abc")}, store.PutOptions{Size: 10})
	if err == nil {
		t.Fatal("Put with a reader shorter than Size succeeded")
	}
	if _, err := s.Head(ctx(t), "short"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a failed Put left an object: %v", err)
	}
}

func testOverwrite(t *testing.T, s store.Store) {
	put(t, s, "k", []byte("one"), map[string]string{"v": "1"})
	put(t, s, "k", []byte("two!"), map[string]string{"v": "2"})
	b, oi := get(t, s, "k")
	if string(b) != "two!" || oi.Metadata["v"] != "2" || oi.Size != 4 {
		t.Errorf("after overwrite: %q %+v", b, oi)
	}
}

func testIfNotExists(t *testing.T, s store.Store) {
	key := "projects/x/snapshots/20260101T000000Z.tar.gz"
	if _, err := s.Put(ctx(t), key, strings.NewReader("first"), store.PutOptions{Size: 5, IfNotExists: true}); err != nil {
		t.Fatal(err)
	}
	_, err := s.Put(ctx(t), key, strings.NewReader("second"), store.PutOptions{Size: 6, IfNotExists: true})
	if !errors.Is(err, store.ErrExists) {
		t.Fatalf("second exclusive Put: %v, want ErrExists", err)
	}
	if b, _ := get(t, s, key); string(b) != "first" {
		t.Errorf("exclusive Put overwrote: %q", b)
	}
}

// Writers racing for one key with IfNotExists: exactly one wins, the others get ErrExists,
// and what is stored is the winner's bytes with the winner's metadata.
func testIfNotExistsRace(t *testing.T, s store.Store) {
	const n = 8
	key := "race/object"
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			body := fmt.Sprintf("written by writer %d", i)
			_, errs[i] = s.Put(ctx(t), key, strings.NewReader(body), store.PutOptions{
				Size: int64(len(body)), Metadata: map[string]string{"writer": strconv.Itoa(i)}, IfNotExists: true})
		})
	}
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && winner >= 0:
			t.Errorf("writers %d and %d both won the key", winner, i)
		case err == nil:
			winner = i
		case !errors.Is(err, store.ErrExists):
			t.Errorf("writer %d: %v, want ErrExists", i, err)
		}
	}
	if winner < 0 {
		t.Fatal("no writer won the key")
	}
	b, oi := get(t, s, key)
	if string(b) != fmt.Sprintf("written by writer %d", winner) || oi.Metadata["writer"] != strconv.Itoa(winner) {
		t.Errorf("stored %q with metadata %v; the winner was writer %d", b, oi.Metadata, winner)
	}
}

// What internal/lease relies on: an exclusively created object is listed at once (the
// listing is as consistent as the create), and once deleted its key can be created
// exclusively again.
func testIfNotExistsListed(t *testing.T, s store.Store) {
	prefix := "projects/x/lease/"
	for i := range 3 {
		key := fmt.Sprintf("%s%020d", prefix, i)
		if _, err := s.Put(ctx(t), key, strings.NewReader("gen"), store.PutOptions{Size: 3, IfNotExists: true}); err != nil {
			t.Fatalf("exclusive Put %s: %v", key, err)
		}
		objs, err := store.ListAll(ctx(t), s, prefix)
		if err != nil || len(objs) != 1 || objs[0].Key != key {
			t.Fatalf("listing right after the exclusive Put of %s: %v %v, want it alone", key, objs, err)
		}
		if err := s.Delete(ctx(t), key); err != nil {
			t.Fatal(err)
		}
	}
	key := prefix + "again"
	for i := range 2 {
		if _, err := s.Put(ctx(t), key, strings.NewReader("v"), store.PutOptions{Size: 1, IfNotExists: true}); err != nil {
			t.Fatalf("exclusive Put %d after a delete: %v", i, err)
		}
		if err := s.Delete(ctx(t), key); err != nil {
			t.Fatal(err)
		}
	}
}

func testNotFound(t *testing.T, s store.Store) {
	if _, _, err := s.Get(ctx(t), "nope/missing"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get missing: %v", err)
	}
	if _, err := s.Head(ctx(t), "nope/missing"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Head missing: %v", err)
	}
	if err := s.Delete(ctx(t), "nope/missing"); err != nil {
		t.Errorf("Delete missing: %v", err)
	}
	page, err := s.List(ctx(t), store.ListOptions{Prefix: "nope/"})
	if err != nil || len(page.Objects) != 0 || page.Next != "" {
		t.Errorf("List of an empty prefix: %+v %v", page, err)
	}
}

// putMany stores n small objects key(i) with 16 workers.
func putMany(t *testing.T, s store.Store, n int, key func(int) string) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	work := make(chan int)
	for range 16 {
		wg.Go(func() {
			for i := range work {
				k := key(i)
				if _, err := s.Put(ctx(t), k, strings.NewReader(k), store.PutOptions{Size: int64(len(k))}); err != nil {
					errs <- err
				}
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func testListPaging(t *testing.T, s store.Store) {
	const n = 1205
	key := func(i int) string { return fmt.Sprintf("many/k%05d", i) }
	putMany(t, s, n, key)
	put(t, s, "many0", []byte("outside the prefix"), nil)

	all, err := store.ListAll(ctx(t), s, "many/")
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != n {
		t.Fatalf("ListAll returned %d keys, want %d", len(all), n)
	}
	for i, o := range all {
		if o.Key != key(i) {
			t.Fatalf("key %d is %q, want %q", i, o.Key, key(i))
		}
		if o.Size != int64(len(key(i))) {
			t.Fatalf("key %s size %d", o.Key, o.Size)
		}
	}
	// Default page size is 1,000; explicit 250 gives 5 pages.
	page, err := s.List(ctx(t), store.ListOptions{Prefix: "many/"})
	if err != nil || len(page.Objects) != 1000 || page.Next == "" {
		t.Fatalf("first default page: %d keys, next %q, %v", len(page.Objects), page.Next, err)
	}
	pages, count := 0, 0
	opts := store.ListOptions{Prefix: "many/", MaxKeys: 250}
	for {
		page, err := s.List(ctx(t), opts)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		count += len(page.Objects)
		if page.Next == "" {
			break
		}
		opts.Token = page.Next
	}
	if pages != 5 || count != n {
		t.Errorf("MaxKeys 250: %d pages, %d keys; want 5, %d", pages, count, n)
	}
}

func testListOrder(t *testing.T, s store.Store) {
	keys := []string{
		"projects/1/snapshots/b", "projects/1/snapshots/a", "projects/10/snapshots/a",
		"projects/1-x/a", "projects/1/z/deeper/key", "projects/1/snapshots/a-b", "projects/1/snapshots/a.b",
	}
	for _, k := range keys {
		put(t, s, k, []byte(k), nil)
	}
	list := func(prefix string) []string {
		all, err := store.ListAll(ctx(t), s, prefix)
		if err != nil {
			t.Fatal(err)
		}
		var ks []string
		for _, o := range all {
			ks = append(ks, o.Key)
		}
		return ks
	}
	want := slices.Clone(keys)
	slices.Sort(want)
	if got := list(""); !slices.Equal(got, want) {
		t.Errorf("full listing %q, want byte order %q", got, want)
	}
	if got := list("projects/1/"); !slices.Equal(got, []string{"projects/1/snapshots/a", "projects/1/snapshots/a-b", "projects/1/snapshots/a.b", "projects/1/snapshots/b", "projects/1/z/deeper/key"}) {
		t.Errorf(`prefix "projects/1/": %q`, got)
	}
	if got := list("projects/1"); len(got) != len(keys) {
		t.Errorf(`prefix "projects/1" (no slash) should match 1, 1-x and 10: %q`, got)
	}
	if got := list("projects/1/snapshots/a"); !slices.Equal(got, []string{"projects/1/snapshots/a", "projects/1/snapshots/a-b", "projects/1/snapshots/a.b"}) {
		t.Errorf("partial-segment prefix: %q", got)
	}
}

func testDeleteMany(t *testing.T, s store.Store) {
	const n = 1010
	key := func(i int) string { return fmt.Sprintf("del/%04d", i) }
	putMany(t, s, n, key)
	put(t, s, "keep/me", []byte("x"), nil)
	var keys []string
	for i := range n {
		keys = append(keys, key(i))
	}
	keys = append(keys, "del/never-existed")
	if err := s.Delete(ctx(t), keys...); err != nil {
		t.Fatal(err)
	}
	if all, err := store.ListAll(ctx(t), s, "del/"); err != nil || len(all) != 0 {
		t.Errorf("after Delete: %d keys left, %v", len(all), err)
	}
	if _, err := s.Head(ctx(t), "keep/me"); err != nil {
		t.Errorf("unrelated key: %v", err)
	}
	if err := s.Delete(ctx(t)); err != nil {
		t.Errorf("Delete of nothing: %v", err)
	}
}

func testInvalidKeys(t *testing.T, s store.Store) {
	for _, k := range []string{"", "/abs", "a/../b", "../x", "a//b", "dir/", "./a", "a\x00b"} {
		if _, err := s.Put(ctx(t), k, strings.NewReader("x"), store.PutOptions{Size: 1}); !errors.Is(err, store.ErrInvalidKey) {
			t.Errorf("Put %q: %v, want ErrInvalidKey", k, err)
		}
	}
}
