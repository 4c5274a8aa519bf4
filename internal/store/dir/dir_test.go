package dir

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/core/store/storetest"
)

func newStore(t *testing.T) *Store {
	t.Helper()
	s, err := New(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return newStore(t) })
}

// Keys cannot reach outside the store's directory, whatever they contain.
func TestKeysStayInside(t *testing.T) {
	base := t.TempDir()
	s, err := New(filepath.Join(base, "store"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	os.WriteFile(filepath.Join(base, "secret"), []byte("secret"), 0o644)
	ctx := context.Background()
	for _, k := range []string{"../secret", "../../secret", "/etc/passwd", "a/../../secret", "data/../../secret", "..", "."} {
		if _, err := s.Put(ctx, k, strings.NewReader("x"), store.PutOptions{}); !errors.Is(err, store.ErrInvalidKey) {
			t.Errorf("Put %q: %v", k, err)
		}
		if _, _, err := s.Get(ctx, k); !errors.Is(err, store.ErrInvalidKey) {
			t.Errorf("Get %q: %v", k, err)
		}
		if err := s.Delete(ctx, k); !errors.Is(err, store.ErrInvalidKey) {
			t.Errorf("Delete %q: %v", k, err)
		}
	}
	// A symlink planted inside the data dir does not lead out (os.Root).
	if err := os.Symlink(base, filepath.Join(s.Dir(), "data", "escape")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Get(ctx, "escape/secret"); err == nil {
		t.Errorf("Get through a planted symlink succeeded")
	}
	if _, err := s.Put(ctx, "escape/new", strings.NewReader("x"), store.PutOptions{}); err == nil {
		t.Errorf("Put through a planted symlink succeeded")
	}
	if _, err := os.Stat(filepath.Join(base, "new")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a file was written outside the store")
	}
	if b, _ := os.ReadFile(filepath.Join(base, "secret")); string(b) != "secret" {
		t.Errorf("secret changed")
	}
}

func TestURLAndLayout(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	if _, err := s.Put(ctx, "shots/a.webp", strings.NewReader("img"), store.PutOptions{ContentType: "image/webp"}); err != nil {
		t.Fatal(err)
	}
	u, err := s.URL(ctx, "shots/a.webp", 0)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(u); err != nil || string(b) != "img" {
		t.Errorf("URL %s: %q %v", u, b, err)
	}
	if _, err := s.URL(ctx, "shots/missing", 0); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("URL of a missing key: %v", err)
	}
	if oi, _ := s.Head(ctx, "shots/a.webp"); oi.ContentType != "image/webp" {
		t.Errorf("content type %q", oi.ContentType)
	}
	// Staging files are gone and deleting the last key removes its folders.
	if ents, _ := os.ReadDir(filepath.Join(s.Dir(), "tmp")); len(ents) != 0 {
		t.Errorf("staging leftovers: %v", ents)
	}
	if err := s.Delete(ctx, "shots/a.webp"); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"data/shots", "meta/shots"} {
		if _, err := os.Stat(filepath.Join(s.Dir(), d)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s left after deleting its last key", d)
		}
	}
}

func TestKeyFolderConflict(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	if _, err := s.Put(ctx, "a", strings.NewReader("x"), store.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "a/b", strings.NewReader("x"), store.PutOptions{}); !errors.Is(err, store.ErrInvalidKey) {
		t.Errorf("Put a/b over object a: %v", err)
	}
	if _, err := s.Put(ctx, "c/d", strings.NewReader("x"), store.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "c", strings.NewReader("x"), store.PutOptions{}); !errors.Is(err, store.ErrInvalidKey) {
		t.Errorf("Put c over folder c/: %v", err)
	}
	if _, _, err := s.Get(ctx, "c"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get of a folder: %v", err)
	}
}

// Stores opened on one directory (as separate processes would) racing for one key with
// IfNotExists: one wins, and every reader of any instance sees the object whole, its
// metadata with it, or not at all.
func TestExclusivePutAcrossInstances(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	const n = 6
	stores := make([]*Store, n)
	for i := range stores {
		s, err := New(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		stores[i] = s
	}
	ctx := context.Background()
	for round := range 20 {
		key := fmt.Sprintf("projects/p/snapshots/%03d.tar.gz", round)
		errs := make([]error, n)
		var wg sync.WaitGroup
		stop := make(chan struct{})
		var torn atomic.Int32
		wg.Go(func() { // a reader in yet another instance
			for {
				select {
				case <-stop:
					return
				default:
				}
				if oi, err := stores[0].Head(ctx, key); err == nil && oi.Metadata["writer"] == "" {
					torn.Add(1)
				}
			}
		})
		var writers sync.WaitGroup
		for i := range n {
			writers.Go(func() {
				body := strings.Repeat(strconv.Itoa(i), 1000)
				_, errs[i] = stores[i].Put(ctx, key, strings.NewReader(body), store.PutOptions{
					Size: int64(len(body)), Metadata: map[string]string{"writer": strconv.Itoa(i)}, IfNotExists: true})
			})
		}
		writers.Wait()
		close(stop)
		wg.Wait()
		wins := 0
		for i, err := range errs {
			if err == nil {
				wins++
			} else if !errors.Is(err, store.ErrExists) {
				t.Errorf("round %d writer %d: %v", round, i, err)
			}
		}
		if wins != 1 || torn.Load() != 0 {
			t.Fatalf("round %d: %d winners, %d reads of an object without its metadata", round, wins, torn.Load())
		}
	}
}

// The metadata of a writer that crashed between its two links does not block the key
// forever.
func TestOrphanMetadataDoesNotBlockKey(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	key := "projects/p/snapshots/x.tar.gz"
	meta := filepath.Join(s.Dir(), "meta", filepath.FromSlash(key)+".json")
	os.MkdirAll(filepath.Dir(meta), 0o700)
	os.WriteFile(meta, []byte(`{"size":1}`), 0o600)
	if _, err := s.Put(ctx, key, strings.NewReader("x"), store.PutOptions{IfNotExists: true}); !errors.Is(err, store.ErrExists) {
		t.Fatalf("a fresh claim by another writer must hold: %v", err)
	}
	old := time.Now().Add(-2 * orphanAge)
	os.Chtimes(meta, old, old)
	if _, err := s.Put(ctx, key, strings.NewReader("x"), store.PutOptions{IfNotExists: true, Metadata: map[string]string{"a": "b"}}); err != nil {
		t.Fatalf("an orphaned claim blocks the key: %v", err)
	}
	if oi, err := s.Head(ctx, key); err != nil || oi.Metadata["a"] != "b" {
		t.Fatalf("after reclaiming: %+v %v", oi, err)
	}
}
