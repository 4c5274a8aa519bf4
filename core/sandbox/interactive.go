package sandbox

import (
	"context"
	"fmt"
	"time"
)

// The abilities behind the agent tools that go past running a command and touching a
// file: removing a file (apply_patch's deletes and moves), asking after and stopping a
// background process, and programs on pseudo-terminals that outlive a call (a REPL, the
// prompts of npm init). Like every optional ability they are found with As.

// Remover is a sandbox that can remove one entry of its workspace: a file, a symbolic
// link (never what it points to) or a directory with everything in it. The caller looks
// before it removes when that matters (the host removes files only).
type Remover interface {
	Remove(ctx context.Context, path string) error
}

// Remove removes path from sb's workspace, through any wrappers. A sandbox that cannot
// gives an error wrapping ErrUnsupported.
func Remove(ctx context.Context, sb Sandbox, path string) error {
	r, ok := As[Remover](sb)
	if !ok {
		return fmt.Errorf("sandbox %s cannot remove files: %w", sb.ID(), ErrUnsupported)
	}
	return r.Remove(ctx, path)
}

// Signal is what ProcessSignaler.Signal and a terminal can send.
type Signal string

// Signals.
const (
	SignalTerm      Signal = "TERM"
	SignalKill      Signal = "KILL"
	SignalInterrupt Signal = "INT" // terminals only: what Ctrl-C sends
)

// ProcessSignaler is a sandbox that can signal the whole process group of a background
// process it started (Start; its Process.ID). Which still run, ProcessLister says.
type ProcessSignaler interface {
	// Signal sends SignalTerm or SignalKill to the process group of the background process
	// id; ErrNotFound when none runs under that id.
	Signal(ctx context.Context, id string, sig Signal) error
}

// TerminalRequest starts a program on a pseudo-terminal (Terminals).
type TerminalRequest struct {
	Argv []string
	Cwd  string
	Env  map[string]string
	// Cols and Rows size the terminal; zero means 120 x 40.
	Cols, Rows int
	// Tag names the terminal (its ID); empty means a fresh one. A session restarting a
	// terminal after a rotation passes the old one.
	Tag string
}

// TerminalWait says how long a terminal call collects output: until the program has been
// quiet for Quiet after its last output, Wait in all, the program's end, or MaxBytes.
type TerminalWait struct {
	Wait, Quiet time.Duration
	MaxBytes    int
}

// TerminalOutput is what a terminal call collected.
type TerminalOutput struct {
	ID  string
	PID int
	// Output is what the program wrote since the last call (the terminal's bytes: CR LF
	// line ends, escape sequences as written).
	Output []byte
	// Dropped counts bytes lost because the buffer was full before anybody read them.
	Dropped int64
	// Exited: the program ended; ExitCode is its status (-1 for a signal). The terminal is
	// gone after the call that says so.
	Exited   bool
	ExitCode int
	// Restarted: the program was started again since the last call, in a sandbox that
	// replaced the one it ran in.
	Restarted bool
}

// Terminals is a sandbox that runs programs on pseudo-terminals that outlive a call: the
// program's output is kept (bounded) until a call collects it, and input can be written to
// it at any time.
type Terminals interface {
	// StartTerminal starts the program and collects its first output as w says.
	StartTerminal(ctx context.Context, req TerminalRequest, w TerminalWait) (TerminalOutput, error)
	// TerminalIO writes input to the terminal id (or, with sig, signals its program's
	// process group), then collects output as w says. ErrNotFound when there is no such
	// terminal.
	TerminalIO(ctx context.Context, id string, input []byte, sig Signal, w TerminalWait) (TerminalOutput, error)
}
