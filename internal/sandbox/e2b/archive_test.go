//go:build linux

package e2b_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/archive"
	"github.com/toolhost/toolhost/internal/sandbox/e2b/e2bfake"
	"github.com/toolhost/toolhost/internal/sandbox/local"
	"github.com/toolhost/toolhost/internal/testenv"
)

// TestArchiveWhenTmpIsFull: the sandbox's tar writes the archive uncompressed into its
// /tmp; when /tmp has no room for that (here a 4 MiB /tmp and a 12 MB workspace), it
// compresses in the sandbox instead, and the snapshot is whole all the same.
func TestArchiveWhenTmpIsFull(t *testing.T) {
	testenv.NeedBwrap(t)
	runDir, err := os.MkdirTemp("", "e2btmp-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(runDir) })
	lp, err := local.New(local.Config{RunDir: runDir, DefaultTimeout: time.Hour, MaxLifetime: 48 * time.Hour,
		Limits: local.Limits{TmpBytes: 4 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = lp.Close(ctx)
	})
	f := startFake(t, byHeader, e2bfake.Config{Local: lp})
	sb := newSandbox(t, newProvider(t, providerConfig(t, f, byHeader)), sandbox.CreateOptions{})
	if res := sh(t, sb, "yes 'a line of text that compresses well' | head -c 12000000 > big.txt && echo small > small.txt && chmod 640 small.txt"); res.ExitCode != 0 {
		t.Fatalf("fill: %+v %q", res, res.Stderr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // a hang bound
	defer cancel()
	var buf bytes.Buffer
	if err := sb.Archive(ctx, &buf, nil); err != nil {
		t.Fatalf("Archive with a /tmp too small for the uncompressed archive: %v", err)
	}
	dst := filepath.Join(t.TempDir(), "restored")
	if _, err := archive.Extract(ctx, &buf, dst, archive.ExtractOptions{}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dst, "big.txt"))
	if err != nil || fi.Size() != 12000000 {
		t.Fatalf("big.txt restored: %v %v", fi, err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "small.txt")); err != nil || string(b) != "small\n" {
		t.Errorf("small.txt restored: %q %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(dst, "small.txt")); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("small.txt's mode: %v %v", fi, err)
	}
	if res := sh(t, sb, "ls /tmp | grep -c toolhost-archive"); string(res.Stdout) != "0\n" {
		t.Errorf("the provider's archive files left in /tmp: %q", res.Stdout)
	}
}
