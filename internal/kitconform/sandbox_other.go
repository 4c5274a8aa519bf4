//go:build !linux

package kitconform

import (
	"testing"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/testenv"
)

// newSandbox: the local sandbox is Linux's; elsewhere the checks that need one skip.
func newSandbox(t *testing.T) (sandbox.Sandbox, string) {
	t.Helper()
	testenv.Skipf(t, "the local sandbox (bubblewrap) is Linux's")
	return nil, ""
}
