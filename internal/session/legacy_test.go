//go:build linux

package session_test

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/session"
	"github.com/toolhost/toolhost/internal/snapshot"
	"github.com/toolhost/toolhost/internal/store/dir"
)

// legacyStore is testdata/store-main (see its README): a store as toolhost left it
// before tar.gz stopped being a storage format, copied so the test may write to it.
func legacyStore(t *testing.T) *dir.Store {
	t.Helper()
	root := t.TempDir()
	if err := os.CopyFS(root, os.DirFS("testdata/store-main")); err != nil {
		t.Fatal(err)
	}
	st, err := dir.New(root)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// wokeFrom is a snapshot manager that remembers what each wake restored.
type wokeFrom struct {
	*snapshot.Manager
	mu   sync.Mutex
	woke []snapshot.Info
}

func (w *wokeFrom) RestoreTo(ctx context.Context, project string, t snapshot.Target) (snapshot.Info, error) {
	in, err := w.Manager.RestoreTo(ctx, project, t)
	w.mu.Lock()
	w.woke = append(w.woke, in)
	w.mu.Unlock()
	return in, err
}

func (w *wokeFrom) last() snapshot.Info {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.woke[len(w.woke)-1]
}

// TestWakeConvertsTarGzSnapshot: a project whose newest snapshot is a tar.gz one, written
// by an older toolhost (testdata/store-main), wakes with its files; the wake writes a
// chunked snapshot of the same content naming the tar.gz one as its origin, and leaves
// the tar.gz one where it was; the next wake restores the chunked one. A project already
// chunked wakes and writes nothing.
func TestWakeConvertsTarGzSnapshot(t *testing.T) {
	ctx := context.Background()
	st := legacyStore(t)
	const legacyKey = "projects/legacy/snapshots/20261128T100000Z-000-50f14f.tar.gz"
	m, err := snapshot.New(snapshot.Config{Store: st, Backoff: time.Millisecond, TempDir: t.TempDir(),
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	snaps := &wokeFrom{Manager: m}
	p := provider(t)
	check := func(s *session.Workspace) {
		t.Helper()
		res, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"/bin/sh", "-c",
			`cat README.md src/pkg/main.go && readlink main-link && stat -c %a run.sh && ./run.sh`}, Timeout: time.Minute})
		want := "# legacy\nwritten as tar.gz\npackage main\n\nfunc main() {}\nsrc/pkg/main.go\n755\nrun\n"
		if err != nil || string(res.Stdout) != want {
			t.Fatalf("the woken workspace: %q (err %v, stderr %q), want %q", res.Stdout, err, res.Stderr, want)
		}
	}

	s := open(t, session.Config{Provider: p, ProjectID: "legacy", Snapshots: snaps})
	check(s)
	if got := snaps.last(); got.Key != legacyKey || got.Format != snapshot.FormatTarGz {
		t.Fatalf("the first wake restored %s (%s), want %s", got.Key, got.Format, legacyKey)
	}
	list, err := m.List(ctx, "legacy")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[1].Key != legacyKey || list[0].Format != snapshot.FormatChunked {
		t.Fatalf("after the first wake the project has %+v; want a chunked snapshot before the tar.gz one, which stays", keys(list))
	}
	conv := list[0].Key
	cps, err := m.Checkpoints(ctx, "legacy")
	if err != nil {
		t.Fatal(err)
	}
	if cps[0].Origin != legacyKey || !strings.Contains(cps[0].Label, legacyKey) || cps[0].Files != 3 {
		t.Errorf("the converted snapshot: %+v; want its origin and label naming %s, and 3 files", cps[0], legacyKey)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}

	s2 := open(t, session.Config{Provider: p, ProjectID: "legacy", Snapshots: snaps})
	check(s2)
	if got := snaps.last(); got.Key != conv || got.Format != snapshot.FormatChunked {
		t.Fatalf("the second wake restored %s (%s), want the converted %s", got.Key, got.Format, conv)
	}
	if list, _ := m.List(ctx, "legacy"); len(list) != 2 {
		t.Errorf("the second wake wrote a snapshot: %v", keys(list))
	}
	s2.Close(ctx)

	// A project stored chunked already wakes and writes nothing.
	s3 := open(t, session.Config{Provider: p, ProjectID: "modern", Snapshots: snaps})
	check(s3)
	if list, _ := m.List(ctx, "modern"); len(list) != 1 || list[0].Format != snapshot.FormatChunked {
		t.Errorf("project modern after a wake: %v", keys(list))
	}
}

func keys(in []snapshot.Info) []string {
	out := make([]string, len(in))
	for i, x := range in {
		out[i] = x.Key
	}
	return out
}
