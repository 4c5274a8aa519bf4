package host

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"maps"
	"slices"
	"time"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
)

// Terminals: a program on a pseudo-terminal that outlives the call that started it (a
// REPL, the prompts of npm init, a test watcher). terminal_start runs it and waits for its
// first output; terminal_io writes to it (Ctrl-C is the byte 0x03) and waits for what it
// says back. Each call returns once the program has been quiet for a moment after its last
// output, or at a bound, so a model reads what a person at the terminal would have seen.
// The sandbox keeps the output between calls (bounded); the session restarts a terminal's
// program after a rotation and says so in the next reply.

const (
	// maxTerminals bounds the terminals one plugin keeps open in a session.
	maxTerminals = 8
	// Defaults and bounds of a terminal call's wait.
	defaultTermWait   = 10 * time.Second
	maxTermWait       = 5 * time.Minute
	defaultTermQuiet  = 250 * time.Millisecond
	defaultTermBytes  = 64 << 10
	maxTermBytes      = 1 << 20
	defaultTermCols   = 120
	defaultTermRows   = 40
	maxTermDimensions = 1000
)

// terminalCall is a decoded terminal_start or terminal_io.
type terminalCall struct {
	start abi.TerminalStartRequest
	io    abi.TerminalIORequest
}

func (o *owned) addTerm(plugin, id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.terms == nil {
		o.terms = map[string][]string{}
	}
	if !slices.Contains(o.terms[plugin], id) {
		o.terms[plugin] = append(o.terms[plugin], id)
	}
}

func (o *owned) dropTerm(plugin, id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.terms[plugin] = slices.DeleteFunc(o.terms[plugin], func(t string) bool { return t == id })
}

func (o *owned) term(plugin, id string) (found bool, count int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Contains(o.terms[plugin], id), len(o.terms[plugin])
}

// termWait turns the plugin's wait into the sandbox's, with defaults and bounds.
func termWait(w abi.TerminalWait) sandbox.TerminalWait {
	tw := sandbox.TerminalWait{Wait: defaultTermWait, Quiet: defaultTermQuiet, MaxBytes: defaultTermBytes}
	if w.WaitMS > 0 {
		tw.Wait = min(time.Duration(w.WaitMS)*time.Millisecond, maxTermWait)
	}
	if w.QuietMS > 0 {
		tw.Quiet = min(time.Duration(w.QuietMS)*time.Millisecond, tw.Wait)
	}
	if w.MaxBytes > 0 {
		tw.MaxBytes = min(w.MaxBytes, maxTermBytes)
	}
	return tw
}

func (h *Host) decodeTerminalStart(_ context.Context, inst *instance, stack []uint64, c *hostCall) bool {
	c.outPtr, c.outCap = uint32(stack[2]), uint32(stack[3])
	req := &c.terminal.start
	if !inst.jsonArg(stack, c, "terminal_start", maxInputBytes, req) {
		return false
	}
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		stack[0] = inst.status(abi.StatusInvalid, "terminal_start: argv is empty")
		return false
	}
	if req.Cols < 0 || req.Rows < 0 || req.Cols > maxTermDimensions || req.Rows > maxTermDimensions {
		stack[0] = inst.status(abi.StatusInvalid, "terminal_start: cols and rows must be from 1 to %d", maxTermDimensions)
		return false
	}
	if inst.session == nil {
		stack[0] = inst.status(abi.StatusPermission, "terminal_start: there is no session")
		return false
	}
	c.req.Argv = req.Argv
	for name := range req.Env {
		c.req.Env = append(c.req.Env, name)
	}
	slices.Sort(c.req.Env)
	if req.Cwd != "" && !inst.resolvePath(req.Cwd, c, stack) {
		inst.lastErr = "terminal_start: cwd: " + inst.lastErr
		return false
	}
	return true
}

func (h *Host) terminalStart(ctx context.Context, inst *instance, c *hostCall) uint64 {
	req := c.terminal.start
	terms, ok := sandbox.As[sandbox.Terminals](inst.sb)
	if !ok {
		return inst.status(abi.StatusIO, "terminal_start: this sandbox cannot run programs on a terminal")
	}
	if _, n := inst.session.owned.term(inst.p.name, ""); n >= maxTerminals {
		return inst.status(abi.StatusTooLarge, "terminal_start: %d terminals are open, the most a session keeps; end one first (exit the program, or send it KILL)", n)
	}
	treq := sandbox.TerminalRequest{Argv: req.Argv, Cwd: c.abs, Env: req.Env, Cols: req.Cols, Rows: req.Rows}
	if treq.Cols == 0 {
		treq.Cols = defaultTermCols
	}
	if treq.Rows == 0 {
		treq.Rows = defaultTermRows
	}
	if secrets := inst.p.spec.Secrets; len(secrets) > 0 {
		env := maps.Clone(req.Env)
		if env == nil {
			env = make(map[string]string, len(secrets))
		}
		maps.Copy(env, secrets)
		treq.Env = env
	}
	out, err := terms.StartTerminal(ctx, treq, termWait(req.TerminalWait))
	if err != nil {
		return inst.execStatus(err)
	}
	if !out.Exited {
		inst.session.owned.addTerm(inst.p.name, out.ID)
	}
	return inst.terminalReply(c, out)
}

func (h *Host) decodeTerminalIO(_ context.Context, inst *instance, stack []uint64, c *hostCall) bool {
	c.outPtr, c.outCap = uint32(stack[2]), uint32(stack[3])
	req := &c.terminal.io
	if !inst.jsonArg(stack, c, "terminal_io", maxInputBytes, req) {
		return false
	}
	switch sandbox.Signal(req.Signal) {
	case "", sandbox.SignalInterrupt, sandbox.SignalTerm, sandbox.SignalKill:
	default:
		stack[0] = inst.status(abi.StatusInvalid, "terminal_io %s: signal %q is not INT, TERM or KILL", req.ID, req.Signal)
		return false
	}
	if inst.session == nil {
		stack[0] = inst.status(abi.StatusPermission, "terminal_io: there is no session")
		return false
	}
	c.req.Key = req.ID // the audit names the terminal
	return true
}

func (h *Host) terminalIO(ctx context.Context, inst *instance, c *hostCall) uint64 {
	req := c.terminal.io
	if found, _ := inst.session.owned.term(inst.p.name, req.ID); !found {
		return inst.status(abi.StatusNotFound, "terminal %s: no open terminal of this id was started by this plugin in this session", req.ID)
	}
	terms, ok := sandbox.As[sandbox.Terminals](inst.sb)
	if !ok {
		return inst.status(abi.StatusIO, "terminal %s: this sandbox cannot run programs on a terminal", req.ID)
	}
	out, err := terms.TerminalIO(ctx, req.ID, []byte(req.Input), sandbox.Signal(req.Signal), termWait(req.TerminalWait))
	if errors.Is(err, sandbox.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
		inst.session.owned.dropTerm(inst.p.name, req.ID)
		return inst.status(abi.StatusNotFound, "terminal %s: its program has ended and its terminal is gone", req.ID)
	}
	if err != nil {
		return inst.execStatus(err)
	}
	if out.Exited {
		inst.session.owned.dropTerm(inst.p.name, req.ID)
	}
	return inst.terminalReply(c, out)
}

// terminalReply writes the header line and the output, secrets taken out.
func (inst *instance) terminalReply(c *hostCall, out sandbox.TerminalOutput) uint64 {
	output := inst.p.h.secrets.redactBytes(out.Output)
	hdr, _ := json.Marshal(abi.TerminalReply{ID: out.ID, PID: out.PID, OutputLen: len(output), Dropped: out.Dropped,
		Exited: out.Exited, ExitCode: out.ExitCode, Restarted: out.Restarted})
	b := make([]byte, 0, len(hdr)+1+len(output))
	return inst.reply(c.outPtr, c.outCap, append(append(append(b, hdr...), '\n'), output...))
}
