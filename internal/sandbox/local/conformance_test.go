//go:build linux

package local

import (
	"testing"

	"github.com/toolhost/toolhost/core/sandbox/sandboxtest"
)

// TestConformance runs the suite every provider passes, with private workspaces (each its
// own volume as root) and, in its HostWorkspace part, a host directory.
func TestConformance(t *testing.T) {
	sandboxtest.Run(t, newProvider(t, Config{}))
}
