//go:build linux

package e2bfake

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/toolhost/toolhost/internal/sandbox/local"
)

// Start runs a fake on 127.0.0.1 for the test t, backed by a local provider of its own,
// and closes it (and every sandbox) when the test ends. cfg.Local, when nil, is made
// here; a test skips when bubblewrap is absent (and fails with CI=true).
func Start(t testing.TB, cfg Config) *Server {
	t.Helper()
	if cfg.Local == nil {
		cfg.Local = NewLocal(t)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Logf("e2bfake: close: %v", err)
		}
	})
	return s
}

// NewLocal makes the local provider a fake's sandboxes run on, for t.
func NewLocal(t testing.TB) *local.Provider {
	t.Helper()
	if _, err := os.Stat(local.BwrapPath); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("bubblewrap is not installed at %s (CI=true: this is a failure, not a skip): %v", local.BwrapPath, err)
		}
		t.Skipf("the fake E2B runs its sandboxes in bubblewrap, which is not installed at %s: %v", local.BwrapPath, err)
	}
	p, err := local.New(local.Config{RunDir: shortTempDir(t), DefaultTimeout: time.Hour, MaxLifetime: 48 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = p.Close(ctx)
	})
	return p
}

// shortTempDir is a temporary directory with a path short enough for unix sockets
// below it (t.TempDir's can pass the 108-byte limit with long test names).
func shortTempDir(t testing.TB) string {
	d, err := os.MkdirTemp("", "e2bfake-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}
