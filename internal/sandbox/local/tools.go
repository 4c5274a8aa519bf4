//go:build linux

package local

import (
	"context"

	"github.com/toolhost/toolhost/core/sandbox"
)

// The abilities of the agent tools beyond the Sandbox interface (core/sandbox
// interactive.go), on the agent.

var (
	_ sandbox.Remover         = (*Sandbox)(nil)
	_ sandbox.ProcessSignaler = (*Sandbox)(nil)
)

// Remove removes a workspace entry (a directory with what is in it).
func (s *Sandbox) Remove(ctx context.Context, path string) error {
	if err := s.refused(); err != nil {
		return err
	}
	return s.wrap(s.client.Remove(ctx, path))
}

// Signal signals the process group of the background process id.
func (s *Sandbox) Signal(ctx context.Context, id string, sig sandbox.Signal) error {
	if err := s.refused(); err != nil {
		return err
	}
	return s.wrap(s.client.SignalTag(ctx, id, sig))
}

var _ sandbox.Terminals = (*Sandbox)(nil)

// StartTerminal starts a program on a terminal in the sandbox.
func (s *Sandbox) StartTerminal(ctx context.Context, req sandbox.TerminalRequest, w sandbox.TerminalWait) (sandbox.TerminalOutput, error) {
	if err := s.refused(); err != nil {
		return sandbox.TerminalOutput{}, err
	}
	out, err := s.client.StartTerminal(ctx, req, w)
	return out, s.wrap(err)
}

// TerminalIO talks to a terminal of the sandbox.
func (s *Sandbox) TerminalIO(ctx context.Context, id string, input []byte, sig sandbox.Signal, w sandbox.TerminalWait) (sandbox.TerminalOutput, error) {
	if err := s.refused(); err != nil {
		return sandbox.TerminalOutput{}, err
	}
	out, err := s.client.TerminalIO(ctx, id, input, sig, w)
	return out, s.wrap(err)
}
