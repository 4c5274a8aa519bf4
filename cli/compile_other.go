//go:build !unix

package cli

import (
	"context"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/experimental"
)

// settleOneShot waits for the compile of the plugins a one-shot call ran interpreted, so
// that the next call finds them in the compilation cache (on Unix it is left to a
// detached process: compile_unix.go).
func (c *cli) settleOneShot(ctx context.Context, th *toolhost.Toolhost, _ bool) {
	if err := experimental.Settle(ctx, th); err != nil {
		c.quietLog().Debug("compiling the called plugins for the next start", "err", err)
	}
}

// waitCompiled returns at once: here the call itself compiles before it exits, so no
// compile outlives it.
func waitCompiled(context.Context, string) error { return nil }

// compileLocked runs compile: here no compile outlives the process that started it, so
// there is no lock to wait for.
func compileLocked(_ context.Context, _ string, compile func() error) error { return compile() }
