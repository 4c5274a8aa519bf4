package session

import (
	"context"
	"fmt"
	"slices"

	"github.com/toolhost/toolhost/core/sandbox"
)

// The abilities of the agent tools (core/sandbox interactive.go) through the session: on
// the current sandbox, retried on a replacement where that is safe, and remembered where a
// rotation must know (a process the agent stopped is not started again).

var (
	_ sandbox.Remover         = (*Session)(nil)
	_ sandbox.ProcessSignaler = (*Session)(nil)
)

// Remove removes a workspace entry in the current sandbox.
func (s *Session) Remove(ctx context.Context, path string) error {
	_, err := do(ctx, s, func(sb sandbox.Sandbox) (struct{}, error) { return struct{}{}, sandbox.Remove(ctx, sb, path) })
	return err
}

// Signal signals the background process id in the current sandbox. A process told to
// stop is forgotten first, so that a rotation never starts it again, whether or not the
// signal finds it.
func (s *Session) Signal(ctx context.Context, id string, sig sandbox.Signal) error {
	if sig == sandbox.SignalTerm || sig == sandbox.SignalKill {
		s.forget(id)
	}
	_, err := do(ctx, s, func(sb sandbox.Sandbox) (struct{}, error) {
		ps, ok := sandbox.As[sandbox.ProcessSignaler](sb)
		if !ok {
			return struct{}{}, errNoBackground(sb)
		}
		return struct{}{}, ps.Signal(ctx, id, sig)
	})
	return err
}

func errNoBackground(sb sandbox.Sandbox) error {
	return fmt.Errorf("sandbox %s cannot signal its background processes: %w", sb.ID(), sandbox.ErrUnsupported)
}

// forget drops a remembered background process.
func (s *Session) forget(id string) {
	defer s.changed()
	s.bg.mu.Lock()
	defer s.bg.mu.Unlock()
	s.bg.procs = slices.DeleteFunc(s.bg.procs, func(p *bgProc) bool { return p.tag == id })
}
