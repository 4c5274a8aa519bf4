package memsandbox

import (
	"context"
	"fmt"
	"path"
	"strings"

	"github.com/toolhost/toolhost/core/sandbox"
)

var _ sandbox.Remover = (*Sandbox)(nil)

// Remove removes a workspace entry: a file, a link (not its target) or a directory with
// everything below it.
func (s *Sandbox) Remove(_ context.Context, p string) error {
	abs, err := sandbox.Resolve(p)
	if err != nil {
		return err
	}
	if abs == sandbox.WorkspaceRoot {
		return fmt.Errorf("remove %s: refusing to remove the workspace root: %w", p, sandbox.ErrOutside)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.closedErr(); err != nil {
		return err
	}
	dir, err := s.resolve(path.Dir(abs), true)
	if err != nil {
		return err
	}
	target := path.Join(dir, path.Base(abs))
	if s.files[target] == nil {
		return fmt.Errorf("remove %s: %w", p, sandbox.ErrNotFound)
	}
	for name := range s.files {
		if name == target || strings.HasPrefix(name, target+"/") {
			delete(s.files, name)
		}
	}
	return nil
}
