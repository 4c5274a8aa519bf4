package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strings"
	"time"

	"github.com/tetratelabs/wazero/api"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
)

// Host functions never trap on guest input: a bad pointer or length gives StatusBadPointer,
// any failure a negative status plus a message for toolhost.last_error. They use the
// stack-based GoModuleFunc API, which does not allocate per call.

const maxLogBytes = 4 << 10

var (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

func (h *Host) instantiateHostModules(ctx context.Context) error {
	type fn struct {
		name    string
		f       api.GoModuleFunc
		params  []api.ValueType
		results []api.ValueType
	}
	modules := map[string][]fn{
		abi.ModuleCore: {
			{abi.FnTake, h.take, []api.ValueType{i32, i32}, []api.ValueType{i64}},
			{abi.FnLastError, h.lastError, []api.ValueType{i32, i32}, []api.ValueType{i64}},
		},
		abi.CapLog.Module(): {
			{abi.FnLog, h.logWrite, []api.ValueType{i32, i32, i32}, nil},
		},
		abi.CapSandboxExec.Module(): {
			{abi.FnExec, acting(h.exec), []api.ValueType{i32, i32, i32, i32}, []api.ValueType{i64}},
		},
		abi.CapSandboxFiles.Module(): {
			{abi.FnRead, acting(h.readFile), []api.ValueType{i32, i32, i32, i32}, []api.ValueType{i64}},
			{abi.FnReadText, acting(h.readText), []api.ValueType{i32, i32, i32, i32}, []api.ValueType{i64}},
			{abi.FnWrite, acting(h.writeFile), []api.ValueType{i32, i32, i32, i32}, []api.ValueType{i64}},
			{abi.FnReadVersioned, acting(h.readVersioned), []api.ValueType{i32, i32, i32, i32}, []api.ValueType{i64}},
			{abi.FnWriteVersioned, acting(h.writeVersioned), []api.ValueType{i32, i32, i32, i32, i32, i32}, []api.ValueType{i64}},
			{abi.FnStat, acting(h.stat), []api.ValueType{i32, i32, i32, i32}, []api.ValueType{i64}},
			{abi.FnList, acting(h.list), []api.ValueType{i32, i32, i32, i32}, []api.ValueType{i64}},
		},
		abi.CapCapture.Module(): {
			{abi.FnCapture, acting(h.capture), []api.ValueType{i32, i32, i32, i32}, []api.ValueType{i64}},
		},
		abi.CapStore.Module(): {
			{abi.FnStorePut, acting(h.storePut), []api.ValueType{i32, i32, i32, i32}, []api.ValueType{i64}},
			{abi.FnStoreGet, acting(h.storeGet), []api.ValueType{i32, i32, i32, i32}, []api.ValueType{i64}},
			{abi.FnStoreList, acting(h.storeList), []api.ValueType{i32, i32, i32, i32}, []api.ValueType{i64}},
			{abi.FnStoreDelete, acting(h.storeDelete), []api.ValueType{i32, i32}, []api.ValueType{i64}},
		},
	}
	for module, fns := range modules {
		b := h.rt.NewHostModuleBuilder(module)
		for _, f := range fns {
			b.NewFunctionBuilder().WithGoModuleFunction(f.f, f.params, f.results).Export(f.name)
		}
		if _, err := b.Instantiate(ctx); err != nil {
			return fmt.Errorf("instantiate host module %s: %w", module, err)
		}
	}
	return nil
}

// status stores msg for last_error and returns s as the i64 result.
func (inst *instance) status(s abi.Status, format string, args ...any) uint64 {
	inst.lastErr = fmt.Sprintf(format, args...)
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

// acting makes a host function that acts in the session (sandbox, browser) out of fn:
// outside a tool call it answers StatusPermission; inside one, fn runs with the call's
// instance while the plugin's time budget is paused.
func acting(fn func(ctx context.Context, inst *instance, stack []uint64)) api.GoModuleFunc {
	return func(ctx context.Context, _ api.Module, stack []uint64) {
		inst := enter(ctx)
		if inst == nil {
			noCall(stack)
			return
		}
		defer inst.leave()
		fn(ctx, inst, stack)
	}
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

func (h *Host) take(ctx context.Context, _ api.Module, stack []uint64) {
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

func (h *Host) lastError(ctx context.Context, _ api.Module, stack []uint64) {
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

func (h *Host) logWrite(ctx context.Context, m api.Module, stack []uint64) {
	level, ptr, n := int32(uint32(stack[0])), uint32(stack[1]), uint32(stack[2])
	buf, ok := m.Memory().Read(ptr, min(n, maxLogBytes))
	if !ok {
		return
	}
	name := "(describing)"
	if inst := instanceFrom(ctx); inst != nil {
		name = inst.p.name
	}
	h.log.Log(ctx, slog.Level(level), strings.ToValidUTF8(string(buf), "\uFFFD"), "plugin", name)
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
func (inst *instance) jsonArg(stack []uint64, what string, limit int, v any) bool {
	raw, s, msg := inst.guestBytes(uint32(stack[0]), uint32(stack[1]), limit)
	if s != 0 {
		stack[0] = inst.status(s, "%s: %s", what, msg)
		return false
	}
	if err := json.Unmarshal(raw, v); err != nil {
		stack[0] = inst.status(abi.StatusInvalid, "%s: request is not valid JSON: %v", what, err)
		return false
	}
	return true
}

func (h *Host) exec(ctx context.Context, inst *instance, stack []uint64) {
	var req abi.ExecRequest
	if inst.jsonArg(stack, "exec", maxInputBytes, &req) {
		stack[0] = h.doExec(ctx, inst, req, uint32(stack[2]), uint32(stack[3]))
	}
}

func (h *Host) doExec(ctx context.Context, inst *instance, req abi.ExecRequest, outPtr, outCap uint32) uint64 {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return inst.status(abi.StatusInvalid, "exec: argv is empty")
	}
	cwd := ""
	if req.Cwd != "" {
		abs, err := sandbox.Resolve(req.Cwd)
		if err != nil {
			return inst.fileStatus("exec: cwd", err)
		}
		cwd = abs
	}
	sreq := sandbox.ExecRequest{Argv: req.Argv, Cwd: cwd, Env: req.Env, MaxOutputBytes: h.cfg.MaxExecOutputBytes}
	if req.Background {
		proc, err := inst.sb.Start(ctx, sreq)
		if err != nil {
			return inst.execStatus(err)
		}
		out, _ := json.Marshal(abi.ExecResult{ID: proc.ID, PID: proc.PID, LogPath: proc.LogPath})
		return inst.reply(outPtr, outCap, append(out, '\n'))
	}
	sreq.Timeout = h.cfg.DefaultExecTimeout
	if req.TimeoutMS > 0 {
		sreq.Timeout = min(time.Duration(req.TimeoutMS)*time.Millisecond, h.cfg.MaxExecTimeout)
	}
	res, err := inst.sb.Exec(ctx, sreq)
	if err != nil {
		return inst.execStatus(err)
	}
	header, err := json.Marshal(abi.ExecResult{
		ExitCode:   res.ExitCode,
		StdoutLen:  len(res.Stdout),
		StderrLen:  len(res.Stderr),
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
	out := make([]byte, 0, len(header)+1+len(res.Stdout)+len(res.Stderr))
	out = append(append(append(append(out, header...), '\n'), res.Stdout...), res.Stderr...)
	return inst.reply(outPtr, outCap, out)
}

// execStatus maps a failure to start a command. A program that does not exist is a
// normal reply (exit 127, as a shell would say), everything else a status.
func (inst *instance) execStatus(err error) uint64 {
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return inst.status(abi.StatusTimeout, "exec: %v", err)
	case errors.Is(err, sandbox.ErrClosed):
		return inst.status(abi.StatusIO, "exec: %v", err)
	}
	return inst.status(abi.StatusIO, "exec: %v", err)
}

// fileStatus maps a sandbox error to a status and a message naming what failed. The
// message is for the model: what failed and why, in words (`read notes.txt: no such file
// or directory`), never the provider's internals (protocol codes, host paths, syscalls).
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
		why = err.Error() // an unexpected failure: say it as it is
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
}

// pathArg reads and resolves a path argument; ok is false when stack[0] holds a status.
func (inst *instance) pathArg(ptr, n uint32) (abs string, st uint64, ok bool) {
	raw, s, msg := inst.guestBytes(ptr, n, 4096)
	if s != 0 {
		return "", inst.status(s, "path: %s", msg), false
	}
	abs, err := sandbox.Resolve(string(raw))
	if err != nil {
		return "", inst.resolveStatus(err), false
	}
	return abs, 0, true
}

func (h *Host) readFile(ctx context.Context, inst *instance, stack []uint64) {
	outPtr, outCap := uint32(stack[2]), uint32(stack[3])
	abs, st, ok := inst.pathArg(uint32(stack[0]), uint32(stack[1]))
	if !ok {
		stack[0] = st
		return
	}
	data, err := inst.sb.ReadFile(ctx, abs, h.cfg.MaxReadBytes)
	if err != nil {
		stack[0] = inst.fileStatus("read "+sandbox.Rel(abs), err)
		return
	}
	stack[0] = inst.reply(outPtr, outCap, data)
}

func (h *Host) writeFile(ctx context.Context, inst *instance, stack []uint64) {
	abs, st, ok := inst.pathArg(uint32(stack[0]), uint32(stack[1]))
	if !ok {
		stack[0] = st
		return
	}
	data, s, msg := inst.guestBytes(uint32(stack[2]), uint32(stack[3]), int(h.cfg.MaxReadBytes))
	if s != 0 {
		stack[0] = inst.status(s, "write %s: %s", sandbox.Rel(abs), msg)
		return
	}
	if err := inst.sb.WriteFile(ctx, abs, data); err != nil {
		stack[0] = inst.fileStatus("write "+sandbox.Rel(abs), err)
		return
	}
	stack[0] = uint64(len(data))
}

func (h *Host) stat(ctx context.Context, inst *instance, stack []uint64) {
	outPtr, outCap := uint32(stack[2]), uint32(stack[3])
	raw, s, msg := inst.guestBytes(uint32(stack[0]), uint32(stack[1]), 4096)
	if s != 0 {
		stack[0] = inst.status(s, "stat: %s", msg)
		return
	}
	abs, err := sandbox.Resolve(string(raw))
	if err != nil {
		stack[0] = inst.resolveStatus(err)
		return
	}
	fi, err := inst.sb.Stat(ctx, abs)
	if err != nil {
		stack[0] = inst.fileStatus("stat "+sandbox.Rel(abs), err)
		return
	}
	fi.Path = string(raw)
	out, _ := json.Marshal(wireInfo(fi))
	stack[0] = inst.reply(outPtr, outCap, out)
}

func (h *Host) list(ctx context.Context, inst *instance, stack []uint64) {
	outPtr, outCap := uint32(stack[2]), uint32(stack[3])
	var req abi.ListRequest
	if !inst.jsonArg(stack, "list", maxInputBytes, &req) {
		return
	}
	if req.Path == "" {
		req.Path = "."
	}
	abs, err := sandbox.Resolve(req.Path)
	if err != nil {
		stack[0] = inst.resolveStatus(err)
		return
	}
	res, err := inst.sb.List(ctx, sandbox.ListRequest{Path: abs, Recursive: req.Recursive, Skip: req.Skip, Limit: req.Limit})
	if err != nil {
		stack[0] = inst.fileStatus("list "+sandbox.Rel(abs), err)
		return
	}
	wire := abi.ListResult{Entries: make([]abi.FileInfo, len(res.Entries)), Truncated: res.Truncated}
	for i, fi := range res.Entries {
		wire.Entries[i] = wireInfo(fi)
	}
	out, _ := json.Marshal(wire)
	stack[0] = inst.reply(outPtr, outCap, out)
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
