package client

import (
	"context"
	"fmt"
	"github.com/toolhost/toolhost/internal/envd"

	"github.com/toolhost/toolhost/core/sandbox"
)

// Signalling a background process (sandbox.ProcessSignaler) on the data plane: envd's
// process.Process/SendSignal, by tag.

// SignalTag sends sig (sandbox.SignalTerm or envd.SignalKill) to the background process tagged
// tag: to its whole process group on our agent, to the process on E2B's envd.
func (c *Client) SignalTag(ctx context.Context, tag string, sig sandbox.Signal) error {
	var s string
	switch sig {
	case sandbox.SignalTerm:
		s = envd.SignalTerm
	case sandbox.SignalKill:
		s = envd.SignalKill
	default:
		return fmt.Errorf("signal %s: unsupported signal %q", tag, sig)
	}
	return c.signal(ctx, envd.ProcessSelector{Tag: tag}, s)
}
