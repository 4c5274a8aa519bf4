package host

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestPruneCache(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	put := func(rel string, size int, mtime, atime time.Time) {
		t.Helper()
		p := filepath.Join(dir, "cache", rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, make([]byte, size), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, atime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	day := 24 * time.Hour
	put("wazero-v1.0.0-amd64-linux/old", 100, now.Add(-30*day), now.Add(-30*day))
	put("wazero-v1.0.0-amd64-linux/read-lately", 100, now.Add(-30*day), now.Add(-time.Hour)) // old but read
	put("wazero-v1.12.0-amd64-linux/new", 100, now.Add(-day), now.Add(-day))
	put("toolhost-records-v1/r.json", 10, now.Add(-2*day), now.Add(-2*day))
	put("wazero-v1.12.0-amd64-linux/x.123.tmp", 5, now.Add(-2*time.Hour), now.Add(-2*time.Hour)) // a crashed write
	put("wazero-v1.12.0-amd64-linux/y.456.tmp", 5, now, now)                                     // a write under way

	res, err := PruneCache(dir, 210)
	if err != nil {
		t.Fatal(err)
	}
	if res.Files != 6 || res.Bytes != 320 || res.RemovedFiles != 3 || res.RemovedBytes != 115 {
		t.Errorf("result %+v", res)
	}
	var left []string
	filepath.WalkDir(filepath.Join(dir, "cache"), func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			left = append(left, filepath.Base(p))
		}
		return nil
	})
	slices.Sort(left)
	if want := []string{"new", "read-lately", "y.456.tmp"}; !slices.Equal(left, want) {
		t.Errorf("left %v, want %v (the least recently used go first)", left, want)
	}

	if res, err := PruneCache(t.TempDir(), 0); err != nil || res.Files != 0 {
		t.Errorf("an empty data dir: %+v, %v", res, err)
	}
}

// New prunes past the bound, in the background, without touching what it uses.
func TestNewPrunesTheCache(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, "cache", "wazero-v0.0.1-amd64-linux", "stale")
	if err := os.MkdirAll(filepath.Dir(stale), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stale, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-365 * 24 * time.Hour)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	h, err := New(context.Background(), Config{DataDir: dir, MaxCacheBytes: 1})
	if err != nil {
		t.Fatal(err)
	}
	h.Close(context.Background()) // waits for the pruning
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("the stale entry is still there: %v", err)
	}
}
