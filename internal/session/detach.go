package session

import (
	"context"

	"github.com/toolhost/toolhost/core/sandbox"
)

// Detach stops the keepalive loop and lets the current sandbox go without ending it,
// when it lives apart from this process (sandbox.Detacher): its files and processes stay
// for another process to reconnect to. A sandbox that cannot be detached is closed, as
// Close does. It does not save: call Commit first. It reports whether the sandbox was
// left running.
func (s *Workspace) Detach(ctx context.Context) (bool, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return false, nil
	}
	sb := s.sb
	s.mu.Unlock()
	d, ok := sandbox.As[sandbox.Detacher](sb)
	if !ok {
		return false, s.Close(ctx)
	}
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.stop()
	err := d.Detach(ctx)
	s.wg.Wait()
	s.uploadLocalAtEnd(ctx)
	return err == nil, err
}
