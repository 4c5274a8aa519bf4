//go:build linux

package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/testenv"
)

// A versioned write passes only at the version it was given; the loser of two writes at
// one version is told the file changed, and its data is not there.
func TestVersionedWriteConflict(t *testing.T) {
	ws, c, _ := agent(t, nil)
	ctx := t.Context()
	// A new file: "must not exist" passes once.
	if err := c.WriteFileGuarded(ctx, "f.txt", []byte("one\n"), sandbox.FileGuard{Versioned: true}); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteFileGuarded(ctx, "f.txt", []byte("again\n"), sandbox.FileGuard{Versioned: true}); !errors.Is(err, sandbox.ErrChanged) {
		t.Fatalf("a create over an existing file: %v, want ErrChanged", err)
	}
	v := sandbox.FileVersion([]byte("one\n"))
	var wins, losses atomic.Int32
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			err := c.WriteFileGuarded(ctx, "f.txt", fmt.Appendf(nil, "writer %d\n", i), sandbox.FileGuard{Versioned: true, Version: v})
			switch {
			case err == nil:
				wins.Add(1)
			case errors.Is(err, sandbox.ErrChanged):
				losses.Add(1)
			default:
				t.Errorf("writer %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if wins.Load() != 1 || losses.Load() != 7 {
		t.Fatalf("8 writes at one version: %d passed, %d told it changed; want 1 and 7", wins.Load(), losses.Load())
	}
	got, _ := os.ReadFile(filepath.Join(ws, "f.txt"))
	if !strings.HasPrefix(string(got), "writer ") {
		t.Fatalf("the file holds %q", got)
	}
	if err := c.WriteFileGuarded(ctx, "gone.txt", []byte("x"), sandbox.FileGuard{Versioned: true, Version: v}); !errors.Is(err, sandbox.ErrChanged) {
		t.Fatalf("a versioned write of a file that is not there: %v, want ErrChanged", err)
	}
	ents, _ := os.ReadDir(ws)
	for _, e := range ents {
		if strings.Contains(e.Name(), ".toolhost-") {
			t.Errorf("left behind: %s", e.Name())
		}
	}
}

// The case: 16 edits from 4 processes, each with its own agent, on one file of
// one shared directory: none is lost. Each process is this test binary running
// TestHelperEditor; an edit reads the file with its version, appends a line and writes at
// that version, reading again when told the file changed.
func TestEditsFromFourProcessesNoneLost(t *testing.T) {
	shared := t.TempDir()
	if err := os.WriteFile(filepath.Join(shared, "notes.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), testenv.HangBound)
	defer cancel()
	var wg sync.WaitGroup
	outs := make([]string, 4)
	for p := range 4 {
		wg.Go(func() {
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperEditor$", "-test.count=1")
			cmd.Env = append(os.Environ(), "TOOLHOST_TEST_EDITOR="+shared, fmt.Sprintf("TOOLHOST_TEST_EDITOR_ID=%d", p))
			cmd.WaitDelay = 10 * time.Second
			out, err := cmd.CombinedOutput()
			outs[p] = string(out)
			if err != nil {
				t.Errorf("editor %d: %v\n%s", p, err, out)
			}
		})
	}
	wg.Wait()
	got, err := os.ReadFile(filepath.Join(shared, "notes.txt"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(got), "\n"), "\n")
	seen := map[string]bool{}
	for _, l := range lines {
		seen[l] = true
	}
	for p := range 4 {
		for e := range 4 {
			if l := fmt.Sprintf("edit %d of process %d", e, p); !seen[l] {
				t.Errorf("lost: %q", l)
			}
		}
	}
	if len(lines) != 16 {
		t.Errorf("%d lines, want 16:\n%s", len(lines), got)
	}
	conflicts := 0
	for _, o := range outs {
		conflicts += strings.Count(o, "conflict")
	}
	t.Logf("16 edits from 4 processes: %d conflicts answered and retried", conflicts)
}

// TestHelperEditor is one process of TestEditsFromFourProcessesNoneLost.
func TestHelperEditor(t *testing.T) {
	shared := os.Getenv("TOOLHOST_TEST_EDITOR")
	if shared == "" {
		t.Skip("run by TestEditsFromFourProcessesNoneLost")
	}
	id := os.Getenv("TOOLHOST_TEST_EDITOR_ID")
	_, c, _ := agentWith(t, Config{Workspace: shared}, nil)
	ctx := t.Context()
	for e := range 4 {
		for {
			cur, err := c.ReadFile(ctx, "notes.txt", 0)
			if err != nil {
				t.Fatal(err)
			}
			next := append(cur, fmt.Sprintf("edit %d of process %s\n", e, id)...)
			err = c.WriteFileGuarded(ctx, "notes.txt", next, sandbox.FileGuard{Versioned: true, Version: sandbox.FileVersion(cur)})
			if errors.Is(err, sandbox.ErrChanged) {
				fmt.Println("conflict")
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			break
		}
	}
}

// NoLinks refuses a link at any part of the path, for reads and writes, and says which
// part; nothing is written through it.
func TestNoLinksRefusesLinks(t *testing.T) {
	ws, c, _ := agent(t, nil)
	ctx := t.Context()
	for _, d := range []string{"docs", "src"} {
		if err := os.Mkdir(filepath.Join(ws, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(ws, "src", "main.go"), []byte("package main\n"), 0o644)
	os.Symlink("../src", filepath.Join(ws, "docs", "evil"))
	os.Symlink("../src/main.go", filepath.Join(ws, "docs", "main.md"))
	no := sandbox.FileGuard{NoLinks: true}
	cases := []struct{ path, link string }{
		{"docs/evil/main.go", "/home/user/docs/evil"},
		{"docs/main.md", "/home/user/docs/main.md"},
		{"docs/evil/new/x.go", "/home/user/docs/evil"},
	}
	for _, tc := range cases {
		if _, err := c.ReadFileGuarded(ctx, tc.path, 0, no); !errors.Is(err, sandbox.ErrLink) || !strings.Contains(err.Error(), tc.link+" is a symbolic link") {
			t.Errorf("read %s: %v, want ErrLink naming %s", tc.path, err, tc.link)
		}
		if err := c.WriteFileGuarded(ctx, tc.path, []byte("owned\n"), no); !errors.Is(err, sandbox.ErrLink) {
			t.Errorf("write %s: %v, want ErrLink", tc.path, err)
		}
		if err := c.WriteFileGuarded(ctx, tc.path, []byte("owned\n"), sandbox.FileGuard{NoLinks: true, Versioned: true}); !errors.Is(err, sandbox.ErrLink) {
			t.Errorf("versioned write %s: %v, want ErrLink", tc.path, err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "src", "main.go")); string(b) != "package main\n" {
		t.Errorf("src/main.go became %q", b)
	}
	if _, err := os.Stat(filepath.Join(ws, "src", "new")); err == nil {
		t.Error("a directory was made through the link")
	}
	// Without links the same calls work, parents made as needed.
	if err := c.WriteFileGuarded(ctx, "docs/a/b/c.md", []byte("ok\n"), no); err != nil {
		t.Fatal(err)
	}
	if b, err := c.ReadFileGuarded(ctx, "docs/a/b/c.md", 0, no); err != nil || string(b) != "ok\n" {
		t.Fatalf("read back: %q, %v", b, err)
	}
	// Without NoLinks a link inside the workspace is followed, as a plain write does.
	if err := c.WriteFileGuarded(ctx, "docs/main.md", []byte("package main // v2\n"), sandbox.FileGuard{Versioned: true, Version: sandbox.FileVersion([]byte("package main\n"))}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "src", "main.go")); string(b) != "package main // v2\n" {
		t.Errorf("src/main.go is %q after a versioned write through its link", b)
	}
}

// A process of the sandbox swaps a directory of a scoped path for a link out of the scope
// as fast as it can while the host writes through that path: no write lands outside.
func TestNoLinksRaceWithASwap(t *testing.T) {
	ws, c, _ := agent(t, nil)
	scope, outside := filepath.Join(ws, "scope"), filepath.Join(ws, "outside")
	for _, d := range []string{scope, outside, filepath.Join(scope, "sub")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("../outside", filepath.Join(scope, "sublink")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var swaps atomic.Int64
	done := make(chan struct{})
	go func() { // owned by the test: ends with ctx
		defer close(done)
		// sub is a real directory or a link to ../outside, exchanged atomically.
		sub, link := filepath.Join(scope, "sub"), filepath.Join(scope, "sublink")
		for ctx.Err() == nil {
			if unix.Renameat2(unix.AT_FDCWD, sub, unix.AT_FDCWD, link, unix.RENAME_EXCHANGE) != nil {
				return
			}
			swaps.Add(1)
		}
	}()
	var refused, written int
	for i := 0; i < 400; i++ {
		err := c.WriteFileGuarded(t.Context(), fmt.Sprintf("scope/sub/f%d.txt", i), []byte("x"), sandbox.FileGuard{NoLinks: true})
		switch {
		case err == nil:
			written++
		case errors.Is(err, sandbox.ErrLink):
			refused++
		default:
			t.Fatalf("write %d: %v (want done or refused as a link)", i, err)
		}
	}
	cancel()
	<-done
	ents, _ := os.ReadDir(outside)
	if len(ents) != 0 {
		t.Fatalf("%d writes landed outside the scope (%d swaps): %v", len(ents), swaps.Load(), ents)
	}
	t.Logf("400 writes against %d swaps: %d written inside, %d refused, none outside", swaps.Load(), written, refused)
}

// Stat, list and remove of a scoped path are decided as they are used, like the guarded
// writes: while a process exchanges scope/sub between a real directory and a link to
// ../outside, none of them ever sees or touches what lies outside. A list of scope
// without the guard enters no link either (the walk opens each directory with
// O_NOFOLLOW relative to its parent).
func TestNoLinksStatListRemoveRaceWithASwap(t *testing.T) {
	ws, c, _ := agent(t, nil)
	scope, outside := filepath.Join(ws, "scope"), filepath.Join(ws, "outside")
	for _, d := range []string{scope, outside, filepath.Join(scope, "sub")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("../outside", filepath.Join(scope, "sublink")); err != nil {
		t.Fatal(err)
	}
	const victims = 300
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o644); err != nil {
		t.Fatal(err)
	}
	for i := range victims {
		// The same names on both sides: only the ones inside may go.
		for _, d := range []string{outside, filepath.Join(scope, "sub")} {
			if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("v%d", i)), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	var swaps atomic.Int64
	done := make(chan struct{})
	go func() { // owned by the test: ends with ctx
		defer close(done)
		sub, link := filepath.Join(scope, "sub"), filepath.Join(scope, "sublink")
		for ctx.Err() == nil {
			if unix.Renameat2(unix.AT_FDCWD, sub, unix.AT_FDCWD, link, unix.RENAME_EXCHANGE) != nil {
				return
			}
			swaps.Add(1)
		}
	}()
	defer func() { cancel(); <-done }()
	g := sandbox.FileGuard{NoLinks: true}
	refusedOr := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, sandbox.ErrLink) {
			t.Fatalf("%s: %v (want done or refused as a link)", what, err)
		}
	}
	var done_, refused int
	for i := range victims {
		// Stat of a name only outside has: never found.
		if fi, err := c.StatGuarded(t.Context(), "scope/sub/secret", g); err == nil {
			t.Fatalf("stat %d of scope/sub/secret found %+v: it exists only outside the scope", i, fi)
		} else if !errors.Is(err, sandbox.ErrLink) && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, sandbox.ErrNotFound) {
			t.Fatalf("stat %d: %v", i, err)
		}
		// Stat of scope/sub: a directory or a refusal, never a link described.
		if fi, err := c.StatGuarded(t.Context(), "scope/sub", g); err == nil {
			if !fi.IsDir() {
				t.Fatalf("stat %d of scope/sub: %v, want a directory or a refusal", i, fi.Mode)
			}
		} else {
			refusedOr("stat scope/sub", err)
		}
		// Lists: never an entry of outside.
		for _, lr := range []struct {
			req   sandbox.ListRequest
			guard bool
		}{
			{sandbox.ListRequest{Path: "scope/sub"}, true},
			{sandbox.ListRequest{Path: "scope", Recursive: true}, true},
			{sandbox.ListRequest{Path: "scope", Recursive: true}, false},
		} {
			var res sandbox.ListResult
			var err error
			if lr.guard {
				res, err = c.ListGuarded(t.Context(), lr.req, g)
			} else {
				res, err = c.List(t.Context(), lr.req)
			}
			if err != nil {
				refusedOr("list "+lr.req.Path, err)
				continue
			}
			for _, e := range res.Entries {
				if strings.HasSuffix(e.Path, "secret") {
					t.Fatalf("list %d of %s (guarded %v) shows %s: it exists only outside the scope", i, lr.req.Path, lr.guard, e.Path)
				}
			}
		}
		// Remove: only the one inside may go.
		err := c.RemoveFileGuarded(t.Context(), fmt.Sprintf("scope/sub/v%d", i), g)
		switch {
		case err == nil:
			done_++
		case errors.Is(err, sandbox.ErrLink):
			refused++
		default:
			t.Fatalf("remove %d: %v (want done or refused as a link)", i, err)
		}
	}
	cancel()
	<-done
	ents, _ := os.ReadDir(outside)
	if len(ents) != victims+1 {
		t.Fatalf("outside holds %d entries, want %d: a remove went through the link (%d swaps)", len(ents), victims+1, swaps.Load())
	}
	t.Logf("%d rounds against %d swaps: %d removed inside, %d refused, nothing outside touched", victims, swaps.Load(), done_, refused)
}

// A guarded remove removes one file, never a directory, and never what a link points to.
func TestRemoveFileGuarded(t *testing.T) {
	ws, c, _ := agent(t, nil)
	ctx := t.Context()
	for _, d := range []string{"dir/inner", "out"} {
		if err := os.MkdirAll(filepath.Join(ws, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"dir/f", "dir/inner/g", "out/h"} {
		if err := os.WriteFile(filepath.Join(ws, f), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("../out", filepath.Join(ws, "dir/l")); err != nil {
		t.Fatal(err)
	}
	if err := c.RemoveFileGuarded(ctx, "dir/inner", sandbox.FileGuard{}); !errors.Is(err, sandbox.ErrIsDir) {
		t.Fatalf("remove of a directory: %v, want ErrIsDir", err)
	}
	if err := c.RemoveFileGuarded(ctx, "dir/l/h", sandbox.FileGuard{NoLinks: true}); !errors.Is(err, sandbox.ErrLink) {
		t.Fatalf("remove through a link with NoLinks: %v, want ErrLink", err)
	}
	if err := c.RemoveFileGuarded(ctx, "dir/l", sandbox.FileGuard{NoLinks: true}); !errors.Is(err, sandbox.ErrLink) {
		t.Fatalf("remove of a link with NoLinks: %v, want ErrLink", err)
	}
	if err := c.RemoveFileGuarded(ctx, "dir/missing", sandbox.FileGuard{NoLinks: true}); !errors.Is(err, os.ErrNotExist) && !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("remove of a missing file: %v, want not found", err)
	}
	if err := c.RemoveFileGuarded(ctx, "dir/f", sandbox.FileGuard{NoLinks: true}); err != nil {
		t.Fatal(err)
	}
	if err := c.RemoveFileGuarded(ctx, ".", sandbox.FileGuard{}); err == nil {
		t.Fatal("the workspace root was removed")
	}
	for _, f := range []string{"dir/inner/g", "out/h", "dir/l"} {
		if _, err := os.Lstat(filepath.Join(ws, f)); err != nil {
			t.Fatalf("%s: %v (want kept)", f, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(ws, "dir/f")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("dir/f still there: %v", err)
	}
}
