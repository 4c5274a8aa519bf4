package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"time"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/audit"
	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/policy"
)

// What a plugin may do is decided in one place: acting (hostfuncs.go) decodes every acting
// host call, resolves its path (resolvePath), and asks decide, which asks the plugin's
// policy and, for a path its patterns scope, makes sure no part of the path is a symbolic
// link. Dispatch admits the tool call itself (calls per minute), keeps secrets out of its
// result and audits it.

// decide asks the plugin's policy about the call c. ok false means the check itself failed
// and st is the status to return.
func (h *Host) decide(ctx context.Context, inst *instance, c *hostCall) (d policy.Decision, st uint64, ok bool) {
	// Asked even without a scope (a nil policy allows everything it knows): an operation
	// the policy has no class for is refused whatever the plugin was given.
	p := inst.p.policy
	d = p.Decide(inst.p.name, c.req)
	if !d.Allowed || !d.CheckLinks {
		return d, 0, true
	}
	// The sandbox follows links inside the workspace: docs/evil -> ../src/main.go would
	// take a write allowed by docs/** to src/main.go. A scoped path goes through none.
	// A path found whole and free of links once in a tool call (edit_file reads, then
	// writes) is not looked at again in that call: a process of the sandbox could swap a
	// link in after the look either way; the sandbox's own check as it uses the path
	// (hostCall.noLinks, sandbox.GuardedFiles) is what closes that (see docs/POLICY.md).
	cs, _ := ctx.Value(callStateKey{}).(*callState)
	if cs != nil && cs.linkFree == c.abs {
		return d, 0, true
	}
	link, whole, err := inst.firstLink(ctx, c)
	if errors.Is(err, errTooDeep) {
		return d, inst.status(abi.StatusInvalid, "%s %v", c.req.Op, err), false
	}
	if err != nil {
		return d, inst.fileStatus(c.req.Op+" "+c.req.Path, err), false
	}
	if link != "" {
		return p.LinkRefusal(inst.p.name, c.req, link), 0, true
	}
	if cs != nil && whole {
		cs.linkFree = c.abs
	}
	return d, 0, true
}

// maxScopedDepth bounds the parts of a scoped path: each is a look, and a look is a round
// trip to a real sandbox's agent.
const maxScopedDepth = 64

// firstLink looks at the parts of the call's path in the sandbox from the root down, one
// after another, until one is a link or does not exist (policy.CheckLinks). Looking at
// them at once was tried: in a local sandbox it saved little of the round trips, and the
// goroutines cost more than the looks in an in-memory one.
func (inst *instance) firstLink(ctx context.Context, c *hostCall) (link string, whole bool, err error) {
	if n := strings.Count(c.req.Path, "/") + 1; n > maxScopedDepth {
		return "", false, fmt.Errorf("%s is %d levels deep, more than the %d a plugin with scoped paths may use: %w",
			c.req.Path, n, maxScopedDepth, errTooDeep)
	}
	link, err = policy.CheckLinks(c.req.Path, func(rel string) (bool, bool, error) {
		// rel is a prefix of the call's path, so its absolute form is a prefix of c.abs.
		fi, err := inst.sb.Stat(ctx, c.abs[:len(sandbox.WorkspaceRoot)+1+len(rel)])
		switch {
		case errors.Is(err, sandbox.ErrNotFound), errors.Is(err, fs.ErrNotExist), errors.Is(err, sandbox.ErrNotDir):
			return false, false, nil
		case errors.Is(err, sandbox.ErrOutside):
			return true, true, nil // only a link can lead out
		case err != nil:
			return false, false, err
		}
		whole = len(rel) == len(c.req.Path)
		return fi.Mode&fs.ModeSymlink != 0, true, nil
	})
	return link, whole && link == "", err
}

var errTooDeep = errors.New("path too deep")

// callState is what the host calls of one tool call share: the tool (for the audit) and
// the last path the link check found whole and free of links. It travels in the call's
// context when the audit is on or the plugin has a policy.
type callState struct {
	tool     *tool
	linkFree string
}

type callStateKey struct{}

// records pools the audit records of host calls: a Sink must not keep the pointer.
var records = sync.Pool{New: func() any { return new(audit.Record) }}

// auditCall records one host call: what it was, the decision and why, the status it
// returned (result), how long it took since start and the bytes it moved.
func (h *Host) auditCall(ctx context.Context, inst *instance, c *hostCall, start time.Time, decision, why string, result uint64) {
	if h.audit == nil {
		return
	}
	now := time.Now()
	r := records.Get().(*audit.Record)
	*r = audit.Record{
		Time: now, Plugin: inst.p.name, Cap: string(c.req.Cap), Op: c.req.Op,
		Path: h.secrets.redact(c.req.Path), Argv: h.secrets.redactAll(c.req.Argv), Env: c.req.Env,
		Port: c.req.Port, Key: h.secrets.redact(c.req.Key), Decision: decision, Why: why,
		Micros: now.Sub(start).Microseconds(), In: c.in,
	}
	if cs, ok := ctx.Value(callStateKey{}).(*callState); ok {
		r.Tool = cs.tool.def.Name
	}
	if inst.sb != nil {
		r.Sandbox = inst.sb.ID()
	}
	if n := int64(result); n < 0 {
		r.Status, r.Error = n, inst.lastErr // already redacted by status
	} else if c.outCap > 0 || c.req.Op == abi.FnStoreGet || c.req.Op == abi.FnStoreList {
		r.Out = int(n) // the length of the reply
	}
	if decision == audit.Invalid {
		r.Why = ""
	}
	h.audit.Record(r)
	records.Put(r)
}

// hostCalls pools the decoded calls: acting takes one per call and gives it back.
var hostCalls = sync.Pool{New: func() any { return new(hostCall) }}

// execTimeouts are the default and the longest timeout of the plugin's commands: the
// host's, cut to the plugin's own max_timeout.
func (p *plugin) execTimeouts() (def, maxTimeout time.Duration) {
	def, maxTimeout = p.h.cfg.DefaultExecTimeout, p.h.cfg.MaxExecTimeout
	if m := p.policy.MaxTimeout(); m > 0 && m < maxTimeout {
		maxTimeout, def = m, min(def, m)
	}
	return def, maxTimeout
}

// callTimeout is the plugin's budget for its own work per call.
func (p *plugin) callTimeout() time.Duration {
	if p.spec.CallTimeout > 0 {
		return p.spec.CallTimeout
	}
	return p.h.cfg.CallTimeout
}

// rateLimiter admits at most n calls in any minute: it remembers the times of the last n
// it admitted.
type rateLimiter struct {
	mu    sync.Mutex
	n     int
	times []time.Time // a ring of the last n admissions
	next  int
}

func newRateLimiter(n int) *rateLimiter {
	if n <= 0 {
		return nil
	}
	return &rateLimiter{n: n, times: make([]time.Time, 0, n)}
}

// admit admits a call at now, or says how long until one would be.
func (l *rateLimiter) admit(now time.Time) (wait time.Duration, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.times) < l.n {
		l.times = append(l.times, now)
		return 0, true
	}
	if age := now.Sub(l.times[l.next]); age < time.Minute {
		return time.Minute - age, false
	}
	l.times[l.next] = now
	l.next = (l.next + 1) % l.n
	return 0, true
}

// Dispatch runs one tool call. A tool's own failure (bad input, file not found, a failing
// command, an unknown tool) is a Result with IsError set and a nil error, for the model to
// read; so is a call over its plugin's calls per minute. A non-nil error means the host
// could not run the tool (the plugin trapped or ran past its budget, ctx ended, the host
// is closed); the Result then still holds an is_error text saying so, ready to send back
// as a tool_result. No text of the result holds the value of a plugin's secret.
func (s *Dispatcher) Dispatch(ctx context.Context, name string, input json.RawMessage) (abi.Result, error) {
	h := s.h
	t := h.tools[name]
	if t == nil {
		return s.dispatch(ctx, name, input)
	}
	var start time.Time
	if h.audit != nil {
		start = time.Now()
	}
	if h.audit != nil || t.plugin.policy != nil {
		ctx = context.WithValue(ctx, callStateKey{}, &callState{tool: t})
	}
	if lim := t.plugin.limiter; lim != nil {
		if wait, ok := lim.admit(time.Now()); !ok {
			msg := fmt.Sprintf("policy: plugin %s may make at most %d calls a minute; try again in %s",
				t.plugin.name, lim.n, wait.Round(time.Second)+time.Second)
			h.auditTool(s, t, start, audit.Deny, fmt.Sprintf("calls_per_minute: %d", lim.n), len(input), abi.Result{}, errors.New(msg))
			return abi.ErrorText("[" + name + ": " + msg + "]"), nil
		}
	}
	res, err := s.dispatch(ctx, name, input)
	h.secrets.redactResult(&res)
	if err != nil && h.secrets != nil {
		err = redactedError{err, h.secrets.redact(err.Error())} // a plugin's stderr is quoted in it
	}
	if h.audit != nil {
		why := "" // nothing decides a tool call but its calls per minute
		if t.plugin.limiter != nil {
			why = fmt.Sprintf("calls_per_minute: %d", t.plugin.limiter.n)
		}
		h.auditTool(s, t, start, audit.Allow, why, len(input), res, err)
	}
	return res, err
}

// auditTool records a tool call.
func (h *Host) auditTool(s *Dispatcher, t *tool, start time.Time, decision, why string, in int, res abi.Result, err error) {
	if h.audit == nil {
		return
	}
	now := time.Now()
	r := records.Get().(*audit.Record)
	*r = audit.Record{Time: now, Plugin: t.plugin.name, Tool: t.def.Name, Cap: audit.CapTool, Op: "call",
		Decision: decision, Why: why, IsError: res.IsError, Micros: now.Sub(start).Microseconds(), In: in}
	if s.sb != nil {
		r.Sandbox = s.sb.ID()
	}
	for _, c := range res.Content {
		r.Out += len(c.Text)
		if c.Source != nil {
			r.Out += len(c.Source.Data)
		}
	}
	if err != nil {
		r.Error = h.secrets.redact(err.Error())
	}
	h.audit.Record(r)
	records.Put(r)
}
