package toolhost

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSnapshotFormatTarGz: a configuration of an older version that says
// snapshot.format: tar.gz still loads, says once that snapshots are stored chunked and how
// to get a tar.gz, and stores chunked; any other value but chunked is an error naming the
// key.
func TestSnapshotFormatTarGz(t *testing.T) {
	cfg := storageConfig(t)
	if err := cfg.Set("snapshot.format", "tar.gz"); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	st, err := OpenStorage(context.Background(), cfg, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatalf("a configuration saying tar.gz: %v", err)
	}
	defer st.Close()
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 || !strings.Contains(logs.String(), "snapshot.format") ||
		!strings.Contains(logs.String(), "toolhost snapshot export") {
		t.Errorf("want one warning naming snapshot.format and snapshot export, got:\n%s", logs.String())
	}
	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "a.txt"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	info, _, err := st.SaveDir(context.Background(), "p", ws)
	if err != nil || !strings.HasSuffix(info.Key, ".snap") {
		t.Errorf("a save under snapshot.format: tar.gz stored %q (%v), want a chunked snapshot", info.Key, err)
	}

	for _, f := range []string{"zip", "TAR.GZ"} {
		bad := storageConfig(t)
		err := bad.Set("snapshot.format", f)
		if err == nil {
			err = bad.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), "snapshot.format") || !strings.Contains(err.Error(), "must be chunked") {
			t.Errorf("snapshot.format %q: %v", f, err)
		}
	}
}

// storageConfig is the default configuration with a fresh directory store.
func storageConfig(t *testing.T) Config {
	t.Helper()
	cfg := DefaultConfig()
	cfg.DataDir = t.TempDir()
	if err := cfg.Set("store.dir", t.TempDir()); err != nil {
		t.Fatal(err)
	}
	return cfg
}
