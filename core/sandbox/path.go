package sandbox

import (
	"fmt"
	"path"
	"strings"
)

// Resolve turns a tool path into an absolute, clean path inside the workspace: a relative
// path resolves against WorkspaceRoot, and any path that lands outside it (through "..", or
// by being absolute elsewhere) is refused with ErrOutside. It is purely lexical: symbolic
// links are refused by the provider when the path is opened.
func Resolve(p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("empty path: %w", ErrNotFound)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", fmt.Errorf("path %q contains a NUL byte: %w", p, ErrOutside)
	}
	abs := p
	if !path.IsAbs(p) {
		abs = path.Join(WorkspaceRoot, p)
	}
	abs = path.Clean(abs)
	if abs != WorkspaceRoot && !strings.HasPrefix(abs, WorkspaceRoot+"/") {
		return "", fmt.Errorf("%s: %w", p, ErrOutside)
	}
	return abs, nil
}

// Rel returns the workspace-relative form of a path Resolve accepted ("." for the root).
func Rel(abs string) string {
	if abs == WorkspaceRoot {
		return "."
	}
	return strings.TrimPrefix(abs, WorkspaceRoot+"/")
}
