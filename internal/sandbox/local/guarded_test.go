//go:build linux

package local

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/toolhost/toolhost/core/sandbox"
)

// Two sandboxes (two agents, as two host processes would have) on one host directory: a
// versioned write is decided under a lock both agents take, so of two writes at one
// version exactly one passes and the other is told the file changed; and a scoped
// (NoLinks) write refuses a link the sandbox made.
func TestGuardedWritesAcrossSandboxes(t *testing.T) {
	p := newProvider(t, Config{})
	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "f.txt"), []byte("v1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	a := newSandbox(t, p, sandbox.CreateOptions{Workspace: ws})
	b := newSandbox(t, p, sandbox.CreateOptions{Workspace: ws})
	ctx := context.Background()
	gf := func(sb sandbox.Sandbox) sandbox.GuardedFiles {
		g, ok := sandbox.As[sandbox.GuardedFiles](sb)
		if !ok {
			t.Fatalf("%T is not a GuardedFiles", sb)
		}
		return g
	}
	v1 := sandbox.FileVersion([]byte("v1\n"))
	if err := gf(a).WriteFileGuarded(ctx, "f.txt", []byte("from a\n"), sandbox.FileGuard{Versioned: true, Version: v1}); err != nil {
		t.Fatal(err)
	}
	err := gf(b).WriteFileGuarded(ctx, "f.txt", []byte("from b\n"), sandbox.FileGuard{Versioned: true, Version: v1})
	if !errors.Is(err, sandbox.ErrChanged) {
		t.Fatalf("the second write at the same version: %v, want ErrChanged", err)
	}
	if got, _ := os.ReadFile(filepath.Join(ws, "f.txt")); string(got) != "from a\n" {
		t.Fatalf("f.txt holds %q", got)
	}
	if res, err := b.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "mkdir -p out scope && ln -s ../out scope/evil"}}); err != nil || res.ExitCode != 0 {
		t.Fatalf("make a link: %v %s", err, res.Stderr)
	}
	if err := gf(a).WriteFileGuarded(ctx, "scope/evil/x.txt", []byte("x"), sandbox.FileGuard{NoLinks: true}); !errors.Is(err, sandbox.ErrLink) {
		t.Fatalf("a scoped write through a link: %v, want ErrLink", err)
	}
	if _, err := os.Stat(filepath.Join(ws, "out", "x.txt")); err == nil {
		t.Fatal("the write went through the link")
	}
}
