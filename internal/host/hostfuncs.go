package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/audit"
	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/policy"
	"github.com/toolhost/toolhost/internal/tracing"
)

// Host functions never trap on guest input: a bad pointer or length gives StatusBadPointer,
// any failure a negative status plus a message for toolhost.last_error. They use the
// stack-based GoModuleFunc API, which does not allocate per call.

const maxLogBytes = 4 << 10

var (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

// instantiateHostModules gives rt the host functions. They serve every Host using rt
// (engine.go): each finds its Host through the instance making the call.
func instantiateHostModules(ctx context.Context, rt wazero.Runtime) error {
	type fn struct {
		name    string
		f       api.GoModuleFunc
		params  []api.ValueType
		results []api.ValueType
	}
	p4 := []api.ValueType{i32, i32, i32, i32}
	r1 := []api.ValueType{i64}
	modules := map[string][]fn{
		abi.ModuleCore: {
			{abi.FnTake, take, []api.ValueType{i32, i32}, r1},
			{abi.FnLastError, lastError, []api.ValueType{i32, i32}, r1},
		},
		abi.CapLog.Module(): {
			{abi.FnLog, logWrite, []api.ValueType{i32, i32, i32}, nil},
		},
	}
	for _, f := range hostFns {
		params := p4
		switch f.op {
		case abi.FnWriteVersioned:
			params = []api.ValueType{i32, i32, i32, i32, i32, i32}
		case abi.FnStoreDelete, abi.FnRemove:
			params = []api.ValueType{i32, i32}
		}
		m := f.cap.Module()
		modules[m] = append(modules[m], fn{f.op, acting(f), params, r1})
	}
	for module, fns := range modules {
		b := rt.NewHostModuleBuilder(module)
		for _, f := range fns {
			b.NewFunctionBuilder().WithGoModuleFunction(f.f, f.params, f.results).Export(f.name)
		}
		if _, err := b.Instantiate(ctx); err != nil {
			return fmt.Errorf("instantiate host module %s: %w", module, err)
		}
	}
	return nil
}

// hostFn is a host function that acts in the session (the sandbox, the store, the
// browser): its capability and operation, how its arguments are decoded into a hostCall,
// and what it does once the policy allowed the call. Every one of them runs through acting,
// the one place where calls are decided and audited.
type hostFn struct {
	cap abi.Capability
	op  string
	// decode reads the arguments from the stack and resolves them (paths, the default
	// port); false means it failed and stack[0] holds the status.
	decode func(h *Host, ctx context.Context, inst *instance, stack []uint64, c *hostCall) bool
	// run does the call and returns the i64 result.
	run func(h *Host, ctx context.Context, inst *instance, c *hostCall) uint64
}

// hostCall is one call of a hostFn, decoded: what the policy decides on, what run does,
// what the audit records.
type hostCall struct {
	req            policy.Request
	abs            string // the resolved path inside the sandbox (a file's, or a command's cwd)
	noLinks        bool   // the path is scoped: no part of it may be a link (sandbox.FileGuard)
	raw            string // the path as the plugin gave it (stat echoes it)
	outPtr, outCap uint32
	data           []byte // write, write_versioned, put: the bytes to store
	version        []byte // write_versioned: the version the plugin read
	exec           abi.ExecRequest
	list           abi.ListRequest
	text           abi.ReadTextRequest
	process        abi.ProcessRequest
	terminal       terminalCall
	fetch          abi.FetchRequest
	in             int // bytes the call took, for the audit
}

// hostFns lists the acting host functions. Their import names are the ops.
var hostFns = []*hostFn{
	{abi.CapSandboxExec, abi.FnExec, (*Host).decodeExec, (*Host).exec},
	{abi.CapSandboxExec, abi.FnProcess, (*Host).decodeProcess, (*Host).process},
	{abi.CapSandboxExec, abi.FnTerminalStart, (*Host).decodeTerminalStart, (*Host).terminalStart},
	{abi.CapSandboxExec, abi.FnTerminalIO, (*Host).decodeTerminalIO, (*Host).terminalIO},
	{abi.CapSandboxFiles, abi.FnRead, (*Host).decodePathOut, (*Host).readFile},
	{abi.CapSandboxFiles, abi.FnReadText, (*Host).decodeReadText, (*Host).readText},
	{abi.CapSandboxFiles, abi.FnWrite, (*Host).decodePathData, (*Host).writeFile},
	{abi.CapSandboxFiles, abi.FnReadVersioned, (*Host).decodePathOut, (*Host).readVersioned},
	{abi.CapSandboxFiles, abi.FnWriteVersioned, (*Host).decodeWriteVersioned, (*Host).writeVersioned},
	{abi.CapSandboxFiles, abi.FnStat, (*Host).decodePathOut, (*Host).stat},
	{abi.CapSandboxFiles, abi.FnList, (*Host).decodeList, (*Host).list},
	{abi.CapSandboxFiles, abi.FnRemove, (*Host).decodePath, (*Host).remove},
	{abi.CapCapture, abi.FnCapture, (*Host).decodeCapture, (*Host).capture},
	{abi.CapStore, abi.FnStorePut, (*Host).decodeStorePut, (*Host).storePut},
	{abi.CapStore, abi.FnStoreGet, (*Host).decodeStoreKeyOut, (*Host).storeGet},
	{abi.CapStore, abi.FnStoreList, (*Host).decodeStoreKeyOut, (*Host).storeList},
	{abi.CapStore, abi.FnStoreDelete, (*Host).decodeStoreKey, (*Host).storeDelete},
	{abi.CapWeb, abi.FnFetch, (*Host).decodeFetch, (*Host).fetch},
	{abi.CapSession, abi.FnSessionGet, (*Host).decodeStateGet, (*Host).stateGet},
	{abi.CapSession, abi.FnSessionSet, (*Host).decodeStateSet, (*Host).stateSet},
}

// status stores msg for last_error and returns s as the i64 result.
func (inst *instance) status(s abi.Status, format string, args ...any) uint64 {
	inst.lastErr = inst.p.h.secrets.redact(fmt.Sprintf(format, args...))
	return statusWord(s)
}

// reply writes data to the guest's buffer when it fits, else parks it for take.
func (inst *instance) reply(outPtr, outCap uint32, data []byte) uint64 {
	if len(data) > maxResultBytes {
		return inst.status(abi.StatusTooLarge, "reply of %d bytes is over the %d limit", len(data), maxResultBytes)
	}
	if uint32(len(data)) <= outCap {
		if !inst.mem.Write(outPtr, data) {
			return inst.status(abi.StatusBadPointer, "output buffer %#x+%d lies outside memory", outPtr, outCap)
		}
		return uint64(len(data))
	}
	inst.parked = data
	return uint64(len(data))
}

// acting makes the host function of fn. Outside a tool call it answers StatusPermission.
// Inside one, with the plugin's time budget paused, it decodes the call's arguments (every
// path through resolvePath), asks the plugin's policy (decide), runs fn only when the
// policy allowed it, and audits the call: the one decision point of every acting host
// call.
func acting(fn *hostFn) api.GoModuleFunc {
	subject := string(fn.cap) + "." + fn.op // the name of its span: "host sandbox_exec.run"
	return func(ctx context.Context, _ api.Module, stack []uint64) {
		inst := enter(ctx)
		if inst == nil {
			noCall(stack)
			return
		}
		defer inst.leave()
		h := inst.p.h
		var start time.Time
		if h.audit != nil {
			start = time.Now()
		}
		ctx, span := tracing.Child(ctx, trace.SpanKindInternal, tracing.SpanHostCall, subject)
		c := hostCalls.Get().(*hostCall)
		defer hostCalls.Put(c)
		*c = hostCall{req: policy.Request{Cap: fn.cap, Op: fn.op}}
		decision, why := audit.Allow, ""
		if !fn.decode(h, ctx, inst, stack, c) {
			decision, why = audit.Invalid, inst.lastErr
		} else {
			d, st, ok := h.decide(ctx, inst, c)
			why = d.Rule
			switch {
			case !ok:
				stack[0] = st
			case !d.Allowed:
				stack[0] = inst.status(abi.StatusPermission, "%s", d.Message)
				decision = audit.Deny
			default:
				c.noLinks = d.CheckLinks // the sandbox checks again as it uses the path
				stack[0] = fn.run(h, ctx, inst, c)
			}
		}
		h.auditCall(ctx, inst, c, start, decision, why, stack[0])
		endHostSpan(span, fn, decision, stack[0])
	}
}

// endHostSpan ends a host call's span (when it records): its capability, operation, the
// policy's decision and, when it failed, its status. Never its path, data or arguments.
func endHostSpan(span trace.Span, fn *hostFn, decision string, result uint64) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(tracing.Capability.String(string(fn.cap)), tracing.HostOp.String(fn.op),
		tracing.Decision.String(decision))
	if n := int64(result); n < 0 {
		span.SetAttributes(tracing.Status.String(abi.Status(n).String()))
	}
	switch decision {
	case audit.Deny:
		span.SetStatus(codes.Error, "refused by the plugin's policy")
	case audit.Invalid:
		span.SetStatus(codes.Error, "the call's arguments were invalid")
	}
	span.End()
}

// enter is the common start of a host function that acts: it finds the call's instance,
// drops any parked reply, and pauses the plugin's time budget until leave.
func enter(ctx context.Context) *instance {
	inst := instanceFrom(ctx)
	if inst == nil {
		return nil
	}
	inst.parked = nil
	if inst.budget != nil {
		inst.budget.pause()
	}
	return inst
}

func (inst *instance) leave() {
	if inst.budget != nil {
		inst.budget.resume()
	}
}

// noCall is the status for a host function called outside a tool call (while describing).
func noCall(stack []uint64) {
	stack[0] = statusWord(abi.StatusPermission)
}

// statusWord is a status as the i64 word a host function returns.
func statusWord(s abi.Status) uint64 { return uint64(int64(s)) }

func take(ctx context.Context, _ api.Module, stack []uint64) {
	inst := instanceFrom(ctx)
	if inst == nil {
		noCall(stack)
		return
	}
	outPtr, outCap := uint32(stack[0]), uint32(stack[1])
	switch {
	case inst.parked == nil:
		stack[0] = inst.status(abi.StatusNotFound, "no reply is waiting to be taken")
	case uint32(len(inst.parked)) > outCap:
		stack[0] = inst.status(abi.StatusTooLarge, "buffer of %d bytes is too small for the %d-byte reply", outCap, len(inst.parked))
	case !inst.mem.Write(outPtr, inst.parked):
		stack[0] = inst.status(abi.StatusBadPointer, "output buffer %#x+%d lies outside memory", outPtr, outCap)
	default:
		stack[0] = uint64(len(inst.parked))
		inst.parked = nil
	}
}

func lastError(ctx context.Context, _ api.Module, stack []uint64) {
	inst := instanceFrom(ctx)
	if inst == nil {
		stack[0] = 0
		return
	}
	outPtr, outCap := uint32(stack[0]), uint32(stack[1])
	msg := inst.lastErr
	if n := min(uint32(len(msg)), outCap); n > 0 && !inst.mem.Write(outPtr, []byte(msg[:n])) {
		stack[0] = statusWord(abi.StatusBadPointer)
		return
	}
	stack[0] = uint64(len(msg))
}

func logWrite(ctx context.Context, m api.Module, stack []uint64) {
	level, ptr, n := int32(uint32(stack[0])), uint32(stack[1]), uint32(stack[2])
	buf, ok := m.Memory().Read(ptr, min(n, maxLogBytes))
	if !ok {
		return
	}
	name := "(describing)"
	h := hostFrom(ctx)
	if inst := instanceFrom(ctx); inst != nil {
		name, h = inst.p.name, inst.p.h
	}
	if h == nil {
		return
	}
	msg := h.secrets.redact(strings.ToValidUTF8(string(buf), "\uFFFD"))
	h.log.Log(ctx, slog.Level(level), msg, "plugin", name)
}

// guestBytes copies an argument out of guest memory.
func (inst *instance) guestBytes(ptr, n uint32, limit int) ([]byte, abi.Status, string) {
	buf, ok := inst.mem.Read(ptr, n) // a view: bounds are checked before any size limit
	if !ok {
		return nil, abi.StatusBadPointer, fmt.Sprintf("argument %#x+%d lies outside memory", ptr, n)
	}
	if int64(n) > int64(limit) {
		return nil, abi.StatusTooLarge, fmt.Sprintf("argument of %d bytes is over the %d limit", n, limit)
	}
	return append([]byte(nil), buf...), 0, ""
}

// jsonArg decodes the JSON request a host function got as (ptr, len) in stack[0:2] into
// v. When it returns false, stack[0] holds the status to return.
func (inst *instance) jsonArg(stack []uint64, c *hostCall, what string, limit int, v any) bool {
	raw, s, msg := inst.guestBytes(uint32(stack[0]), uint32(stack[1]), limit)
	if s != 0 {
		stack[0] = inst.status(s, "%s: %s", what, msg)
		return false
	}
	c.in += len(raw)
	if err := json.Unmarshal(raw, v); err != nil {
		stack[0] = inst.status(abi.StatusInvalid, "%s: request is not valid JSON: %v", what, err)
		return false
	}
	return true
}

// resolvePath is the one place where a path a plugin gave becomes a path in the sandbox:
// a relative path resolves against the workspace, the result is made clean, and a path that
// leaves the workspace (by .., or absolute elsewhere) is refused. The policy and the audit
// see its workspace-relative form. False means stack[0] holds the status.
func (inst *instance) resolvePath(raw string, c *hostCall, stack []uint64) bool {
	// A file's path names a file: "docs/" would otherwise be cleaned to "docs", and a
	// write meant for a directory would make a file of its name.
	if class, _ := policy.ClassOf(c.req.Cap, c.req.Op); (class == policy.ClassRead || class == policy.ClassWrite) && strings.HasSuffix(raw, "/") {
		c.req.Path = raw
		stack[0] = inst.status(abi.StatusIsDir, "%s %s: the path ends in /, which names a directory; a file's path names the file (such as %sname)", c.req.Op, raw, raw)
		return false
	}
	abs, err := sandbox.Resolve(raw)
	if err != nil {
		stack[0] = inst.resolveStatus(err)
		c.req.Path = raw
		return false
	}
	c.abs, c.req.Path = abs, sandbox.Rel(abs)
	return true
}

// pathArg reads the path argument in stack[0:2] and resolves it.
func (inst *instance) pathArg(stack []uint64, c *hostCall) bool {
	raw, s, msg := inst.guestBytes(uint32(stack[0]), uint32(stack[1]), 4096)
	if s != 0 {
		stack[0] = inst.status(s, "path: %s", msg)
		return false
	}
	c.raw = string(raw)
	return inst.resolvePath(c.raw, c, stack)
}

// decodePathOut decodes (path_ptr, path_len, out_ptr, out_cap).
func (h *Host) decodePathOut(_ context.Context, inst *instance, stack []uint64, c *hostCall) bool {
	c.outPtr, c.outCap = uint32(stack[2]), uint32(stack[3])
	return inst.pathArg(stack, c)
}

// decodePathData decodes (path_ptr, path_len, data_ptr, data_len).
func (h *Host) decodePathData(_ context.Context, inst *instance, stack []uint64, c *hostCall) bool {
	dataPtr, dataLen := uint32(stack[2]), uint32(stack[3])
	if !inst.pathArg(stack, c) {
		return false
	}
	data, s, msg := inst.guestBytes(dataPtr, dataLen, int(h.cfg.MaxReadBytes))
	if s != 0 {
		stack[0] = inst.status(s, "write %s: %s", c.req.Path, msg)
		return false
	}
	c.data, c.in = data, len(data)
	return true
}

func (h *Host) decodeExec(_ context.Context, inst *instance, stack []uint64, c *hostCall) bool {
	c.outPtr, c.outCap = uint32(stack[2]), uint32(stack[3])
	req := &c.exec
	if !inst.jsonArg(stack, c, "exec", maxInputBytes, req) {
		return false
	}
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		stack[0] = inst.status(abi.StatusInvalid, "exec: argv is empty")
		return false
	}
	c.req.Argv, c.req.Background = req.Argv, req.Background
	for name := range req.Env {
		c.req.Env = append(c.req.Env, name)
	}
	slices.Sort(c.req.Env)
	if req.Cwd != "" {
		if !inst.resolvePath(req.Cwd, c, stack) {
			inst.lastErr = "exec: cwd: " + inst.lastErr
			return false
		}
	}
	return true
}

func (h *Host) exec(ctx context.Context, inst *instance, c *hostCall) uint64 {
	req := c.exec
	sreq := sandbox.ExecRequest{Argv: req.Argv, Cwd: c.abs, Env: req.Env, MaxOutputBytes: h.cfg.MaxExecOutputBytes}
	if secrets := inst.p.spec.Secrets; len(secrets) > 0 {
		// The plugin's secrets reach the commands it runs, never the plugin: they override
		// what it asked for under the same names.
		env := maps.Clone(req.Env)
		if env == nil {
			env = make(map[string]string, len(secrets))
		}
		maps.Copy(env, secrets)
		sreq.Env = env
	}
	ctx, span := tracing.Child(ctx, trace.SpanKindInternal, tracing.SpanExec, "")
	defer span.End()
	if span.IsRecording() {
		span.SetAttributes(tracing.Sandbox.String(tracing.Text(inst.sb.ID())), tracing.Background.Bool(req.Background))
	}
	if req.Background {
		proc, err := inst.sb.Start(ctx, sreq)
		if err != nil {
			return inst.execFailed(span, err)
		}
		if inst.session != nil && proc.ID != "" {
			inst.session.owned.addProc(inst.p.name, proc.ID, proc.LogPath)
		}
		out, _ := json.Marshal(abi.ExecResult{ID: proc.ID, PID: proc.PID, LogPath: proc.LogPath})
		return inst.reply(c.outPtr, c.outCap, append(out, '\n'))
	}
	def, maxTimeout := inst.p.execTimeouts()
	sreq.Timeout = def
	if req.TimeoutMS > 0 {
		sreq.Timeout = min(time.Duration(req.TimeoutMS)*time.Millisecond, maxTimeout)
	}
	// The command's own name: the egress gateway attributes its connections to it, and what
	// it refused reaches the model in a note at the end of the tool's result.
	sreq.Tag = newCommandTag()
	res, err := inst.sb.Exec(ctx, sreq)
	inst.refused = append(inst.refused, sandbox.EgressRefused(inst.sb, sreq.Tag)...)
	if err != nil {
		return inst.execFailed(span, err)
	}
	if span.IsRecording() {
		span.SetAttributes(tracing.ExitCode.Int(res.ExitCode), tracing.TimedOut.Bool(res.TimedOut), tracing.OOMKilled.Bool(res.OOMKilled))
	}
	stdout, stderr := h.secrets.redactBytes(res.Stdout), h.secrets.redactBytes(res.Stderr)
	header, err := json.Marshal(abi.ExecResult{
		ExitCode:   res.ExitCode,
		StdoutLen:  len(stdout),
		StderrLen:  len(stderr),
		StdoutCut:  res.StdoutCut,
		StderrCut:  res.StderrCut,
		TimedOut:   res.TimedOut,
		OOMKilled:  res.OOMKilled,
		DurationMS: res.Duration.Milliseconds(),
	})
	if err != nil {
		return inst.status(abi.StatusIO, "exec: encode reply: %v", err)
	}
	// Header line, then the raw streams: the guest never unescapes output byte by byte.
	out := make([]byte, 0, len(header)+1+len(stdout)+len(stderr))
	out = append(append(append(append(out, header...), '\n'), stdout...), stderr...)
	return inst.reply(c.outPtr, c.outCap, out)
}

// execFailed is execStatus of a command that could not be run, its span marked so with
// the words the plugin gets.
func (inst *instance) execFailed(span trace.Span, err error) uint64 {
	st := inst.execStatus(err)
	if span.IsRecording() {
		span.SetStatus(codes.Error, inst.lastErr)
	}
	return st
}

// execStatus maps a failure to start a command. A program that does not exist is a
// normal reply (exit 127, as a shell would say), everything else a status whose message
// says what happened in words, never the provider's internals.
func (inst *instance) execStatus(err error) uint64 {
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return inst.status(abi.StatusTimeout, "exec: the call ran out of time")
	case errors.Is(err, sandbox.ErrUnresponsive):
		return inst.status(abi.StatusIO, "exec: the sandbox stopped answering and was replaced; try again")
	case errors.Is(err, sandbox.ErrClosed):
		return inst.status(abi.StatusIO, "exec: the sandbox has ended")
	}
	inst.p.h.log.Warn("exec failed", "plugin", inst.p.name, "err", inst.p.h.secrets.redact(err.Error()))
	return inst.status(abi.StatusIO, "exec: the sandbox could not run the command")
}

// fileStatus maps a sandbox error to a status and a message naming what failed. The
// message is for the model: what failed and why, in words (`read notes.txt: no such file
// or directory`), never the provider's internals (protocol codes, host paths, syscalls):
// those go to the host's log.
func (inst *instance) fileStatus(what string, err error) uint64 {
	s, why := abi.StatusIO, ""
	for _, c := range fileErrors {
		if errors.Is(err, c.err) {
			s, why = c.status, c.err.Error()
			break
		}
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		s, why = abi.StatusTimeout, "the call ran out of time"
	case errors.Is(err, sandbox.ErrUnresponsive):
		s, why = abi.StatusIO, "the sandbox stopped answering and was replaced; try again"
	case errors.Is(err, sandbox.ErrClosed):
		s, why = abi.StatusIO, "the sandbox has ended"
	case why == "":
		inst.p.h.log.Warn("sandbox call failed", "plugin", inst.p.name, "op", what, "err", inst.p.h.secrets.redact(err.Error()))
		why = "the sandbox could not do it"
	}
	if what == "" {
		return inst.status(s, "%s", why)
	}
	return inst.status(s, "%s: %s", what, why)
}

// resolveStatus maps a failure of sandbox.Resolve, whose message names the path and says
// what is wrong with it in words, to its status.
func (inst *instance) resolveStatus(err error) uint64 {
	s := abi.StatusInvalid
	for _, c := range fileErrors {
		if errors.Is(err, c.err) {
			s = c.status
			break
		}
	}
	return inst.status(s, "%v", err)
}

// fileErrors maps the sandbox's sentinels (and the io/fs ones) to statuses; their texts are
// what the model reads.
var fileErrors = []struct {
	err    error
	status abi.Status
}{
	{sandbox.ErrOutside, abi.StatusOutside},
	{sandbox.ErrNotFound, abi.StatusNotFound},
	{fs.ErrNotExist, abi.StatusNotFound},
	{sandbox.ErrIsDir, abi.StatusIsDir},
	{sandbox.ErrNotDir, abi.StatusNotDir},
	{sandbox.ErrExists, abi.StatusExists},
	{fs.ErrExist, abi.StatusExists},
	{sandbox.ErrTooLarge, abi.StatusTooLarge},
	{sandbox.ErrNotRegular, abi.StatusInvalid},
	{fs.ErrPermission, abi.StatusPermission},
	{sandbox.ErrLink, abi.StatusPermission},
	{sandbox.ErrChanged, abi.StatusChanged},
}

// sbRead reads the call's file. A scoped path is read by a sandbox that can refuse links
// as it opens it (sandbox.GuardedFiles), so a link swapped in after decide's look cannot
// take the read out of the scope.
func (inst *instance) sbRead(ctx context.Context, c *hostCall, maxBytes int64) ([]byte, error) {
	if c.noLinks {
		if gf, ok := sandbox.As[sandbox.GuardedFiles](inst.sb); ok {
			data, err := gf.ReadFileGuarded(ctx, c.abs, maxBytes, sandbox.FileGuard{NoLinks: true})
			if !errors.Is(err, sandbox.ErrUnsupported) {
				return data, err
			}
		}
	}
	return inst.sb.ReadFile(ctx, c.abs, maxBytes)
}

// sbWrite writes the call's file (see sbRead).
func (inst *instance) sbWrite(ctx context.Context, c *hostCall, data []byte) error {
	if c.noLinks {
		if gf, ok := sandbox.As[sandbox.GuardedFiles](inst.sb); ok {
			err := gf.WriteFileGuarded(ctx, c.abs, data, sandbox.FileGuard{NoLinks: true})
			if !errors.Is(err, sandbox.ErrUnsupported) {
				return err
			}
		}
	}
	return inst.sb.WriteFile(ctx, c.abs, data)
}

func (h *Host) readFile(ctx context.Context, inst *instance, c *hostCall) uint64 {
	data, err := inst.sbRead(ctx, c, h.cfg.MaxReadBytes)
	if err != nil {
		return inst.fileStatus("read "+c.req.Path, err)
	}
	return inst.reply(c.outPtr, c.outCap, data)
}

func (h *Host) writeFile(ctx context.Context, inst *instance, c *hostCall) uint64 {
	if err := inst.sbWrite(ctx, c, c.data); err != nil {
		return inst.fileStatus("write "+c.req.Path, err)
	}
	return uint64(len(c.data))
}

// sbStat describes the call's path (see sbRead).
func (inst *instance) sbStat(ctx context.Context, c *hostCall) (sandbox.FileInfo, error) {
	if c.noLinks {
		if gf, ok := sandbox.As[sandbox.GuardedFiles](inst.sb); ok {
			fi, err := gf.StatGuarded(ctx, c.abs, sandbox.FileGuard{NoLinks: true})
			if !errors.Is(err, sandbox.ErrUnsupported) {
				return fi, err
			}
		}
	}
	return inst.sb.Stat(ctx, c.abs)
}

// sbList lists the call's directory (see sbRead).
func (inst *instance) sbList(ctx context.Context, c *hostCall, req sandbox.ListRequest) (sandbox.ListResult, error) {
	if c.noLinks {
		if gf, ok := sandbox.As[sandbox.GuardedFiles](inst.sb); ok {
			res, err := gf.ListGuarded(ctx, req, sandbox.FileGuard{NoLinks: true})
			if !errors.Is(err, sandbox.ErrUnsupported) {
				return res, err
			}
		}
	}
	return inst.sb.List(ctx, req)
}

func (h *Host) stat(ctx context.Context, inst *instance, c *hostCall) uint64 {
	fi, err := inst.sbStat(ctx, c)
	if err != nil {
		return inst.fileStatus("stat "+c.req.Path, err)
	}
	if p := inst.p.policy; !p.Visible(c.req.Path, fi.IsDir()) {
		// Allowed as a directory on the way to what may be read, but it is not one.
		d := p.Decide(inst.p.name, policy.Request{Cap: abi.CapSandboxFiles, Op: policy.OpRead, Path: c.req.Path})
		return inst.status(abi.StatusPermission, "%s", d.Message)
	}
	fi.Path = c.raw
	out, _ := json.Marshal(wireInfo(fi))
	return inst.reply(c.outPtr, c.outCap, out)
}

func (h *Host) decodeList(_ context.Context, inst *instance, stack []uint64, c *hostCall) bool {
	c.outPtr, c.outCap = uint32(stack[2]), uint32(stack[3])
	if !inst.jsonArg(stack, c, "list", maxInputBytes, &c.list) {
		return false
	}
	if c.list.Path == "" {
		c.list.Path = "."
	}
	return inst.resolvePath(c.list.Path, c, stack)
}

func (h *Host) list(ctx context.Context, inst *instance, c *hostCall) uint64 {
	req := c.list
	res, err := inst.sbList(ctx, c, sandbox.ListRequest{Path: c.abs, Recursive: req.Recursive, Skip: req.Skip, Limit: req.Limit})
	if err != nil {
		return inst.fileStatus("list "+c.req.Path, err)
	}
	wire := abi.ListResult{Entries: make([]abi.FileInfo, 0, len(res.Entries)), Truncated: res.Truncated}
	p := inst.p.policy
	for _, fi := range res.Entries {
		// A scoped plugin sees what it may read and the directories on the way to it.
		if p != nil && !p.Visible(path.Join(c.req.Path, fi.Path), fi.IsDir()) {
			continue
		}
		wire.Entries = append(wire.Entries, wireInfo(fi))
	}
	out, _ := json.Marshal(wire)
	return inst.reply(c.outPtr, c.outCap, out)
}

func wireInfo(fi sandbox.FileInfo) abi.FileInfo {
	t := abi.TypeOther
	switch {
	case fi.Mode.IsRegular():
		t = abi.TypeFile
	case fi.Mode.IsDir():
		t = abi.TypeDir
	case fi.Mode&fs.ModeSymlink != 0:
		t = abi.TypeSymlink
	}
	return abi.FileInfo{Path: fi.Path, Type: t, Size: fi.Size, Mode: uint32(fi.Mode.Perm()),
		ModTime: fi.ModTime.UnixMilli()}
}
