package memsandbox_test

import (
	"testing"

	"github.com/toolhost/toolhost/core/sandbox/sandboxtest"
	"github.com/toolhost/toolhost/internal/memsandbox"
)

// The in-memory sandbox keeps the same contract as the real ones.
func TestConformance(t *testing.T) {
	sandboxtest.Run(t, &memsandbox.Provider{})
}
