package e2b

import (
	"context"
	"fmt"

	"github.com/toolhost/toolhost/core/sandbox"
)

// The abilities of the agent tools beyond the Sandbox interface (core/sandbox
// interactive.go), on E2B's envd. Terminals are not among them: envd runs programs on a
// pseudo-terminal only for as long as a client holds the stream, and this provider keeps
// none between calls.

var (
	_ sandbox.Remover         = (*Sandbox)(nil)
	_ sandbox.ProcessSignaler = (*Sandbox)(nil)
)

// Remove removes a workspace entry. A symbolic link is removed itself, never what it
// points to; a path through a link that leads out of the workspace is refused.
func (s *Sandbox) Remove(ctx context.Context, p string) error {
	if err := s.closedErr(); err != nil {
		return err
	}
	abs, err := sandbox.Resolve(p)
	if err != nil {
		return fmt.Errorf("remove: %w", err)
	}
	if abs == sandbox.WorkspaceRoot {
		return fmt.Errorf("remove %s: refusing to remove the workspace root: %w", p, sandbox.ErrOutside)
	}
	real, e, err := s.resolve(ctx, abs, false)
	switch {
	case err != nil:
		return fmt.Errorf("remove %s: %w", p, err)
	case e == nil:
		return fmt.Errorf("remove %s: %w", p, sandbox.ErrNotFound)
	}
	s.touched.Store(true)
	return s.wrap(s.client.RemovePath(ctx, real))
}

// Signal signals the background process id (envd signals the process itself; its
// wrapper exec'd it, so that is the command).
func (s *Sandbox) Signal(ctx context.Context, id string, sig sandbox.Signal) error {
	if err := s.closedErr(); err != nil {
		return err
	}
	return s.wrap(s.client.SignalTag(ctx, id, sig))
}
