package snapshot_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/chunked/chunkedtest"
	"github.com/toolhost/toolhost/internal/snapshot"
)

// gate is a store wrapper that counts the writes it sees and, once shut, refuses them as
// a fenced-off writer's store does.
type gate struct {
	store.Store
	mu     sync.Mutex
	writes int
	shut   bool
}

func (g *gate) write() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.writes++
	if g.shut {
		return fmt.Errorf("test: %w", store.ErrFenced)
	}
	return nil
}

func (g *gate) Put(ctx context.Context, key string, r io.Reader, o store.PutOptions) (store.ObjectInfo, error) {
	if err := g.write(); err != nil {
		return store.ObjectInfo{}, err
	}
	return g.Store.Put(ctx, key, r, o)
}

func (g *gate) Delete(ctx context.Context, keys ...string) error {
	if err := g.write(); err != nil {
		return err
	}
	return g.Store.Delete(ctx, keys...)
}

func (g *gate) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.writes
}

// A view of a Manager on a wrapper of its store (a session's fenced store) writes through
// the wrapper and shares the Manager's knowledge: a save of the same tree through the
// Manager afterwards stores nothing. A write the wrapper fences off is not retried, and
// fails the save.
func TestWithStore(t *testing.T) {
	ctx := tctx(t)
	b := newDir(t)
	m, clk, _ := newManager(t, b.s, nil)
	g := &gate{Store: b.s}
	v := m.WithStore(g)
	ws := filepath.Join(t.TempDir(), "ws")
	chunkedtest.MakeTree(t, ws, 7)
	in, _, err := v.SaveDir(ctx, "p", ws)
	if err != nil {
		t.Fatal(err)
	}
	if g.count() == 0 {
		t.Fatal("the view's save wrote nothing through its store")
	}
	clk.Add(time.Second)
	again, _, err := m.SaveDir(ctx, "p", ws)
	if err != nil || !again.Unchanged || again.Key != in.Key {
		t.Fatalf("the Manager's save of the same tree: %+v %v, want unchanged at %s", again, err, in.Key)
	}

	g.mu.Lock()
	g.shut = true
	g.mu.Unlock()
	before := g.count()
	if err := os.WriteFile(filepath.Join(ws, "new.txt"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err = v.SaveDir(ctx, "p", ws)
	if !errors.Is(err, store.ErrFenced) || !errors.Is(err, snapshot.ErrSaveFailed) {
		t.Fatalf("a save whose writes are fenced off: %v", err)
	}
	if n := g.count() - before; n != 1 {
		t.Errorf("%d writes tried after the fence, want 1 (no retry)", n)
	}
	if strings.Contains(fmt.Sprint(err), "attempts") {
		t.Errorf("a fenced write was retried: %v", err)
	}
}
