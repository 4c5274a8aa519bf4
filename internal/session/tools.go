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
	_ sandbox.Remover         = (*Workspace)(nil)
	_ sandbox.ProcessSignaler = (*Workspace)(nil)
	_ sandbox.ProcessLister   = (*Workspace)(nil)
)

// Remove removes a workspace entry in the current sandbox.
func (s *Workspace) Remove(ctx context.Context, path string) error {
	tries := 0
	_, err := do(ctx, s, func(sb sandbox.Sandbox) (struct{}, error) {
		tries++
		return struct{}{}, goneOnRetry(tries, sandbox.Remove(ctx, sb, path))
	})
	return err
}

// Signal signals the background process id in the current sandbox. A process told to
// stop is forgotten first, so that a rotation never starts it again, whether or not the
// signal finds it.
func (s *Workspace) Signal(ctx context.Context, id string, sig sandbox.Signal) error {
	if sig == sandbox.SignalTerm || sig == sandbox.SignalKill {
		s.forget(id)
	}
	tries := 0
	_, err := do(ctx, s, func(sb sandbox.Sandbox) (struct{}, error) {
		ps, ok := sandbox.As[sandbox.ProcessSignaler](sb)
		if !ok {
			return struct{}{}, errNoBackground(sb)
		}
		tries++
		err := ps.Signal(ctx, id, sig)
		if sig == sandbox.SignalTerm || sig == sandbox.SignalKill {
			err = goneOnRetry(tries, err) // it ended with the old sandbox, and was not restarted
		}
		return struct{}{}, err
	})
	return err
}

func errNoBackground(sb sandbox.Sandbox) error {
	return fmt.Errorf("sandbox %s cannot signal its background processes: %w", sb.ID(), sandbox.ErrUnsupported)
}

// forget drops a remembered background process.
func (s *Workspace) forget(id string) {
	defer s.changed()
	s.bg.mu.Lock()
	defer s.bg.mu.Unlock()
	s.bg.procs = slices.DeleteFunc(s.bg.procs, func(p *bgProc) bool { return p.tag == id })
}

// Processes lists the background processes of the current sandbox, under the session's
// lock like every call (found through Unwrap, the sandbox's own would run beside a swap,
// on a sandbox being retired). Under one that cannot tell, the error wraps
// sandbox.ErrUnsupported.
func (s *Workspace) Processes(ctx context.Context) ([]sandbox.ProcessInfo, error) {
	return do(ctx, s, func(sb sandbox.Sandbox) ([]sandbox.ProcessInfo, error) {
		pl, ok := sandbox.As[sandbox.ProcessLister](sb)
		if !ok {
			return nil, fmt.Errorf("sandbox %s cannot list its background processes: %w", sb.ID(), sandbox.ErrUnsupported)
		}
		return pl.Processes(ctx)
	})
}
