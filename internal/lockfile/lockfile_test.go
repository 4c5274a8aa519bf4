//go:build linux

package lockfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

func TestCreateStaleRemove(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a.lock")
	l, err := Create(path, []byte("host"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Create(path, nil); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second Create: %v, want fs.ErrExist", err)
	}
	// flock locks belong to open file descriptions, so another open in this process
	// conflicts exactly as another process's would.
	if _, _, err := Stale(path); !errors.Is(err, ErrHeld) {
		t.Fatalf("Stale of a held lock: %v, want ErrHeld", err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	s, content, err := Stale(path)
	if err != nil {
		t.Fatalf("Stale of a released lock: %v", err)
	}
	if string(content) != "host" {
		t.Errorf("content %q, want %q", content, "host")
	}
	if _, _, err := Stale(path); !errors.Is(err, ErrHeld) {
		t.Fatalf("Stale while another took it: %v, want ErrHeld", err)
	}
	if err := s.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("after Remove: %v", err)
	}
	if _, _, err := Stale(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Stale of nothing: %v, want fs.ErrNotExist", err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 0 {
		t.Errorf("left in the directory: %v", ents)
	}
}

// A lock taken as stale was removed by its owner meanwhile, and a new owner made a new one
// at the same path: Stale must not report the old file as the path's.
func TestStaleChecksTheFileIsStillThePaths(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.lock")
	old, err := Create(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path) // a pruner opened the old file...
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := old.Remove(); err != nil { // ...its owner removed it...
		t.Fatal(err)
	}
	l := &Lock{f: f, path: path}
	if l.current() {
		t.Fatal("a removed file is reported current")
	}
	fresh, err := Create(path, nil) // ...and a new owner made a new one.
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Release()
	if l.current() {
		t.Fatal("the old file is reported as the path's")
	}
}

// Owners create, hold and remove lock files while pruners scan the directory and take
// whatever they can: a pruner never takes a lock whose owner is alive, at any point of
// its life, and nothing is left at the end.
func TestPrunersNeverTakeALiveLock(t *testing.T) {
	dir := t.TempDir()
	var live sync.Map // path -> true while its owner holds it
	var stop atomic.Bool
	var taken, made atomic.Int64
	var wrong atomic.Value
	var owners, pruners sync.WaitGroup
	for o := range 4 {
		owners.Go(func() {
			for i := 0; i < 300; i++ {
				path := filepath.Join(dir, fmt.Sprintf("o%d-%d.lock", o, i))
				l, err := Create(path, []byte("x"))
				if err != nil {
					wrong.Store(fmt.Sprintf("Create: %v", err))
					return
				}
				made.Add(1)
				live.Store(path, true)
				if i%3 == 0 {
					// Died: the lock is let go and the file stays for a pruner.
					live.Delete(path)
					l.Release()
					continue
				}
				live.Delete(path)
				if err := l.Remove(); err != nil {
					wrong.Store(fmt.Sprintf("Remove: %v", err))
				}
			}
		})
	}
	for range 3 {
		pruners.Go(func() {
			for !stop.Load() {
				ents, _ := os.ReadDir(dir)
				for _, e := range ents {
					if strings.HasPrefix(e.Name(), TempPrefix) {
						continue
					}
					path := filepath.Join(dir, e.Name())
					l, _, err := Stale(path)
					if err != nil {
						continue
					}
					if _, ok := live.Load(path); ok {
						wrong.Store("a pruner took the live lock " + path)
					}
					taken.Add(1)
					l.Remove()
				}
			}
		})
	}
	owners.Wait()
	stop.Store(true)
	pruners.Wait()
	if w := wrong.Load(); w != nil {
		t.Fatal(w)
	}
	// What the dead left, one last prune takes.
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		l, _, err := Stale(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatalf("after every owner ended, %s: %v", e.Name(), err)
		}
		l.Remove()
		taken.Add(1)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left: %d entries", len(ents))
	}
	t.Logf("%d lock files made, %d taken as stale", made.Load(), taken.Load())
}

// Without O_TMPFILE (the fallback's path, run directly): the same contract.
func TestCreateNamed(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "b.lock")
	l, err := createNamed(path, []byte("k"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := createNamed(path, nil); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second createNamed: %v", err)
	}
	if _, _, err := Stale(path); !errors.Is(err, ErrHeld) {
		t.Fatalf("Stale of a held lock: %v", err)
	}
	if err := l.Remove(); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left: %v", ents)
	}
}
