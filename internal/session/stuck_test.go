//go:build linux

package session_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/memsandbox"
	"github.com/toolhost/toolhost/internal/session"
)

// stuckProvider makes memory sandboxes; the first one's commands fail to start as a
// sandbox's do once its processes are used up, after the first `fails` attempts (-1: all).
type stuckProvider struct {
	memsandbox.Provider
	fails int64
	mu    sync.Mutex
	made  int
}

func (p *stuckProvider) Create(ctx context.Context, opts sandbox.CreateOptions) (sandbox.Sandbox, error) {
	sb, err := p.Provider.Create(ctx, opts)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.made++
	if p.made == 1 {
		s := &stuckSandbox{Sandbox: sb}
		s.left.Store(p.fails)
		return s, nil
	}
	return sb, nil
}

type stuckSandbox struct {
	sandbox.Sandbox
	left  atomic.Int64
	tries atomic.Int64
}

func (s *stuckSandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	s.tries.Add(1)
	if s.left.Load() != 0 {
		s.left.Add(-1)
		return sandbox.ExecResult{}, fmt.Errorf("start process: fork/exec /bin/sh: resource temporarily unavailable: %w", sandbox.ErrCannotStart)
	}
	return s.Sandbox.Exec(ctx, req)
}

// A sandbox whose commands can no longer start (the agent answers, every exec fails with
// EAGAIN) is replaced like a dead one, its files kept, and the command runs on the new
// one; one that failed to start a command once but starts the next is kept.
func TestStuckSandboxIsReplaced(t *testing.T) {
	ctx := context.Background()
	t.Run("stuck", func(t *testing.T) {
		p := &stuckProvider{fails: -1}
		s := open(t, session.Config{Provider: p, ProjectID: "stuck", Snapshots: snapshots(t)})
		if err := s.WriteFile(ctx, "/home/user/work.txt", []byte("not committed")); err != nil {
			t.Fatal(err)
		}
		before := s.SandboxID()
		res, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"cat", "work.txt"}})
		if err != nil || string(res.Stdout) != "not committed" {
			t.Fatalf("a command in a sandbox that cannot start any: %q, %v (want it run on a new sandbox)", res.Stdout, err)
		}
		if s.SandboxID() == before {
			t.Fatal("the stuck sandbox was not replaced")
		}
	})
	t.Run("busy once", func(t *testing.T) {
		p := &stuckProvider{fails: 1}
		s := open(t, session.Config{Provider: p, ProjectID: "busy", Snapshots: snapshots(t)})
		before := s.SandboxID()
		_, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}})
		if !errors.Is(err, sandbox.ErrCannotStart) {
			t.Fatalf("a command that could not start: %v, want ErrCannotStart", err)
		}
		if s.SandboxID() != before {
			t.Fatal("a sandbox that starts the next command was replaced")
		}
		if res, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"echo", "ok"}}); err != nil || string(res.Stdout) != "ok\n" {
			t.Fatalf("the next command: %q %v", res.Stdout, err)
		}
	})
}
