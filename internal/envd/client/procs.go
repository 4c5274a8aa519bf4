package client

import (
	"context"
	"fmt"
	"github.com/toolhost/toolhost/internal/envd"
	"strings"

	"github.com/toolhost/toolhost/core/sandbox"
)

// The background-process ability (sandbox.BackgroundProcesses) on the data plane: envd's
// process.Process/List and /SendSignal, by tag. Foreground commands are tagged fg-, terminals
// term-; every other tag is a background process (Start's, or the one a session restarted it under).

// Running lists the background processes the agent still runs.
func (c *Client) Running(ctx context.Context) ([]sandbox.Process, error) {
	infos, err := c.Processes(ctx)
	if err != nil {
		return nil, err
	}
	var out []sandbox.Process
	for _, in := range infos {
		if in.Tag == "" || strings.HasPrefix(in.Tag, "fg-") || strings.HasPrefix(in.Tag, envd.TerminalTagPrefix) {
			continue
		}
		out = append(out, sandbox.Process{ID: in.Tag, PID: int(in.Pid)})
	}
	return out, nil
}

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
