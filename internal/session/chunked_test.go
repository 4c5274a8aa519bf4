//go:build linux

package session_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
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
	m, err := snapshot.New(snapshot.Config{Store: st, Format: snapshot.FormatChunked, Backoff: time.Millisecond,
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
