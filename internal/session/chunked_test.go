//go:build linux

package session_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/chunked"
	"github.com/toolhost/toolhost/internal/session"
	"github.com/toolhost/toolhost/internal/snapshot"
	"github.com/toolhost/toolhost/internal/store/dir"
)

// TestChunkedCommitReadsWhatChanged: with the chunked format a commit has the sandbox's
// agent list the workspace and read only the files that changed since the last commit;
// a new session wakes from it, checked against its manifest.
func TestChunkedCommitReadsWhatChanged(t *testing.T) {
	ctx := context.Background()
	st, err := dir.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m, err := snapshot.New(snapshot.Config{Store: st, Backoff: time.Millisecond,
		TempDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	p := provider(t)
	cfg := session.Config{Provider: p, ProjectID: "chunky", Snapshots: m}
	s := open(t, cfg)
	sh := func(cmd string) string {
		t.Helper()
		res, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"/bin/sh", "-c", cmd}, Timeout: time.Minute})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("%s: %v %+v", cmd, err, res)
		}
		return string(res.Stdout)
	}
	// 200 files of 4 KiB, dated an hour back (as if written long before the commit).
	sh(`mkdir -p src && for i in $(seq 1 200); do head -c 4096 /dev/urandom > src/f$i; done && touch -d '1 hour ago' src/* src`)
	first, err := s.Commit(ctx, "first")
	if err != nil {
		t.Fatal(err)
	}
	if first.Format != snapshot.FormatChunked {
		t.Fatalf("format %q", first.Format)
	}
	read := func(i snapshot.Info) int64 {
		ph, _ := i.Transfer.Phase("pack")
		return ph.Bytes
	}
	if got := read(first); got != 200*4096 {
		t.Errorf("the first commit read %d bytes, want every file's", got)
	}
	sh(`echo changed > src/f7`)
	second, err := s.Commit(ctx, "second")
	if err != nil {
		t.Fatal(err)
	}
	if got := read(second); got != int64(len("changed\n")) {
		t.Errorf("the second commit read %d bytes; want only the changed file's", got)
	}
	s.Close(ctx)

	// A new session wakes in it.
	s2 := open(t, cfg)
	res, err := s2.Exec(ctx, sandbox.ExecRequest{Argv: []string{"/bin/sh", "-c", "cat src/f7; ls src | wc -l"}, Timeout: time.Minute})
	if err != nil || !strings.HasPrefix(string(res.Stdout), "changed\n200") {
		t.Fatalf("after the wake: %q %v", res.Stdout, err)
	}
	_ = fmt.Sprint
}

// TestDamagedSnapshotDoesNotStopCommits is issue 29 through a session: the newest
// snapshot's pack rots; the next session (another process: its own snapshot manager)
// wakes in the snapshot before it, and its commit, which failed ("read the snapshot saved
// over") until the damaged snapshot was deleted by hand, stores the session's work, which
// the session after it finds. The damaged snapshot is set aside in the quarantine.
func TestDamagedSnapshotDoesNotStopCommits(t *testing.T) {
	ctx := context.Background()
	storeDir := t.TempDir()
	st, err := dir.New(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	manager := func() *snapshot.Manager {
		m, err := snapshot.New(snapshot.Config{Store: st, Backoff: time.Millisecond,
			TempDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	p := provider(t)
	cfg := session.Config{Provider: p, ProjectID: "hurt", Snapshots: manager()}
	sh := func(s *session.Workspace, cmd string) string {
		t.Helper()
		res, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"/bin/sh", "-c", cmd}, Timeout: time.Minute})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("%s: %v %+v", cmd, err, res)
		}
		return string(res.Stdout)
	}
	s := open(t, cfg)
	sh(s, `echo one > one.txt && touch -d '1 hour ago' one.txt`)
	first, err := s.Commit(ctx, "first")
	if err != nil {
		t.Fatal(err)
	}
	packs := func() map[string]bool {
		objs, err := store.ListAll(ctx, st, chunked.PrefixPacks)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, o := range objs {
			out[o.Key] = true
		}
		return out
	}
	before := packs()
	sh(s, `head -c 3000000 /dev/urandom > big.bin`)
	second, err := s.Commit(ctx, "second")
	if err != nil {
		t.Fatal(err)
	}
	s.Close(ctx)
	rotted := 0
	for k := range packs() {
		if before[k] {
			continue
		}
		f := filepath.Join(storeDir, "data", filepath.FromSlash(k))
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)/2] ^= 0xff
		if err := os.WriteFile(f, b, 0o644); err != nil {
			t.Fatal(err)
		}
		rotted++
	}
	if rotted == 0 {
		t.Fatal("the second commit stored no pack")
	}

	cfg.Snapshots = manager()
	s2 := open(t, cfg)
	if got := sh(s2, `ls`); got != "one.txt\n" {
		t.Fatalf("the wake after the damage holds %q; want the first commit's one.txt alone", got)
	}
	sh(s2, `echo work > work.txt`)
	third, err := s2.Commit(ctx, "after the damage")
	if err != nil {
		t.Fatalf("the commit after the damage: %v", err)
	}
	if third.Unchanged || third.Key <= second.Key {
		t.Fatalf("the commit after the damage: %+v", third)
	}
	s2.Close(ctx)

	m := manager()
	q, err := m.Quarantined(ctx, "hurt")
	if err != nil || len(q) != 1 || q[0].Snapshot != second.Key {
		t.Errorf("quarantine: %+v %v; want %s", q, err, second.Key)
	}
	cfg.Snapshots = m
	s3 := open(t, cfg)
	if got := sh(s3, `cat work.txt one.txt`); got != "work\none\n" {
		t.Fatalf("the session after holds %q", got)
	}
	_ = first
}
