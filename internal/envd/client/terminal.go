package client

import (
	"context"
	"fmt"
	"github.com/toolhost/toolhost/internal/envd"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
)

// The client's side of the terminals (terminal_wire.go): sandbox.Terminals on the agent.
// A wait longer than the agent's bound on one request is made of several requests, each
// collecting on from where the last stopped, so no request is ever silent for longer than
// the client's idle bound.

// StartTerminal starts a program on a terminal and collects its first output.
func (c *Client) StartTerminal(ctx context.Context, r sandbox.TerminalRequest, w sandbox.TerminalWait) (sandbox.TerminalOutput, error) {
	sr, err := startRequest(sandbox.ExecRequest{Argv: r.Argv, Cwd: r.Cwd, Env: r.Env}, "")
	if err != nil {
		return sandbox.TerminalOutput{}, fmt.Errorf("start terminal: %w", err)
	}
	tag := r.Tag
	if tag == "" {
		tag = newTag(envd.TerminalTagPrefix)
	}
	req := envd.TerminalStartRequest{Process: sr.Process, Tag: tag, Cols: r.Cols, Rows: r.Rows}
	if req.Cols <= 0 {
		req.Cols = 120
	}
	if req.Rows <= 0 {
		req.Rows = 40
	}
	began := time.Now()
	req.Wait = chunk(w, began, 0)
	var out envd.TerminalOutput
	if err := c.unary(ctx, envd.PathTerminalStart, req, &out); err != nil {
		return sandbox.TerminalOutput{}, fmt.Errorf("start terminal %s: %w", r.Argv[0], err)
	}
	return c.collectOn(ctx, tag, w, began, out)
}

// TerminalIO writes input to the terminal id, or signals its program, and collects output.
func (c *Client) TerminalIO(ctx context.Context, id string, input []byte, sig sandbox.Signal, w sandbox.TerminalWait) (sandbox.TerminalOutput, error) {
	began := time.Now()
	req := envd.TerminalIORequest{Tag: id, Input: input, Signal: string(sig), Wait: chunk(w, began, 0)}
	var out envd.TerminalOutput
	if err := c.unary(ctx, envd.PathTerminalIO, req, &out); err != nil {
		return sandbox.TerminalOutput{}, fmt.Errorf("terminal %s: %w", id, err)
	}
	return c.collectOn(ctx, id, w, began, out)
}

// chunk is the wait of one request, began the start of the whole call, got what it has
// collected so far.
func chunk(w sandbox.TerminalWait, began time.Time, got int) envd.TerminalWaitSpec {
	left := w.Wait - time.Since(began)
	spec := envd.TerminalWaitSpec{WaitMs: max(min(left.Milliseconds(), envd.MaxTerminalWaitMs), 0), QuietMs: max(w.Quiet.Milliseconds(), 1)}
	if w.MaxBytes > 0 {
		spec.MaxBytes = max(w.MaxBytes-got, 1)
	}
	return spec
}

// collectOn asks again while a request ended at its own bound and the call's wait is not
// over, and joins what the requests collected.
func (c *Client) collectOn(ctx context.Context, id string, w sandbox.TerminalWait, began time.Time, out envd.TerminalOutput) (sandbox.TerminalOutput, error) {
	res := sandbox.TerminalOutput{ID: id, PID: out.Pid}
	for {
		res.Output = append(res.Output, out.Output...)
		res.Dropped += out.Dropped
		if out.Exited {
			res.Exited, res.ExitCode = true, out.ExitCode
		}
		if out.Reason != envd.ReasonWait || time.Since(began) >= w.Wait || (w.MaxBytes > 0 && len(res.Output) >= w.MaxBytes) {
			return res, nil
		}
		out = envd.TerminalOutput{}
		req := envd.TerminalIORequest{Tag: id, Wait: chunk(w, began, len(res.Output))}
		if err := c.unary(ctx, envd.PathTerminalIO, req, &out); err != nil {
			return res, fmt.Errorf("terminal %s: %w", id, err)
		}
	}
}
