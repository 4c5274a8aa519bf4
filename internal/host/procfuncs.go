package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sync"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
)

// What a plugin may do to processes that are already running: ask after a background
// command it started and stop it (process), remove a file (remove), talk to a program on
// a terminal it started (terminal.go). A plugin reaches only what it started itself in
// this session: the session remembers which ids each plugin was given, and an id it was
// not given is "not found", whoever started it.

// maxOwned bounds the background ids a session remembers per plugin (the oldest go).
const maxOwned = 256

// owned is what the plugins of a session started, by plugin: background process ids
// (with their logs) and terminal ids.
type owned struct {
	mu    sync.Mutex
	procs map[string][]ownedProc
	terms map[string][]string
}

type ownedProc struct{ id, logPath string }

func (o *owned) addProc(plugin, id, logPath string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.procs == nil {
		o.procs = map[string][]ownedProc{}
	}
	l := slices.DeleteFunc(o.procs[plugin], func(p ownedProc) bool { return p.id == id })
	if len(l) >= maxOwned {
		l = slices.Delete(l, 0, len(l)-maxOwned+1)
	}
	o.procs[plugin] = append(l, ownedProc{id, logPath})
}

func (o *owned) proc(plugin, id string) (ownedProc, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	i := slices.IndexFunc(o.procs[plugin], func(p ownedProc) bool { return p.id == id })
	if i < 0 {
		return ownedProc{}, false
	}
	return o.procs[plugin][i], true
}

// ---- remove

// decodePath decodes (path_ptr, path_len).
func (h *Host) decodePath(_ context.Context, inst *instance, stack []uint64, c *hostCall) bool {
	return inst.pathArg(stack, c)
}

// remove removes one file or symbolic link; a directory is refused, so that no single
// call takes a tree with it (a plugin that means it removes the files one by one).
func (h *Host) remove(ctx context.Context, inst *instance, c *hostCall) uint64 {
	what := "remove " + c.req.Path
	if c.abs == sandbox.WorkspaceRoot {
		return inst.status(abi.StatusInvalid, "%s: the workspace root cannot be removed", what)
	}
	// A sandbox that can check and remove in one step does (sandbox.GuardedFiles): a
	// directory or link swapped in after a look can then not be removed in its place.
	if gf, ok := sandbox.As[sandbox.GuardedFiles](inst.sb); ok {
		err := gf.RemoveFileGuarded(ctx, c.abs, sandbox.FileGuard{NoLinks: c.noLinks})
		switch {
		case err == nil:
			return 0
		case errors.Is(err, sandbox.ErrIsDir):
			return inst.status(abi.StatusIsDir, "%s: is a directory; remove removes files only", what)
		case !errors.Is(err, sandbox.ErrUnsupported):
			return inst.fileStatus(what, err)
		}
	}
	fi, err := inst.sb.Stat(ctx, c.abs)
	if err != nil {
		return inst.fileStatus(what, err)
	}
	if fi.IsDir() {
		return inst.status(abi.StatusIsDir, "%s: is a directory; remove removes files only", what)
	}
	if err := sandbox.Remove(ctx, inst.sb, c.abs); err != nil {
		if errors.Is(err, sandbox.ErrUnsupported) {
			return inst.status(abi.StatusIO, "%s: this sandbox cannot remove files", what)
		}
		return inst.fileStatus(what, err)
	}
	return 0
}

// ---- process

func (h *Host) decodeProcess(_ context.Context, inst *instance, stack []uint64, c *hostCall) bool {
	c.outPtr, c.outCap = uint32(stack[2]), uint32(stack[3])
	var req abi.ProcessRequest
	if !inst.jsonArg(stack, c, "process", maxInputBytes, &req) {
		return false
	}
	switch req.Signal {
	case "", string(sandbox.SignalTerm), string(sandbox.SignalKill):
	default:
		stack[0] = inst.status(abi.StatusInvalid, "process %s: signal %q is not TERM or KILL", req.ID, req.Signal)
		return false
	}
	if inst.session == nil {
		stack[0] = inst.status(abi.StatusPermission, "process %s: there is no session", req.ID)
		return false
	}
	c.process = req
	c.req.Key = req.ID // the audit names the process
	return true
}

func (h *Host) process(ctx context.Context, inst *instance, c *hostCall) uint64 {
	req := c.process
	own, ok := inst.session.owned.proc(inst.p.name, req.ID)
	if !ok {
		return inst.status(abi.StatusNotFound, "process %s: no background command of this id was started by this plugin in this session", req.ID)
	}
	pl, ok := sandbox.As[sandbox.ProcessLister](inst.sb)
	if !ok {
		return inst.status(abi.StatusIO, "process %s: this sandbox cannot tell whether its background commands run", req.ID)
	}
	if req.Signal != "" {
		ps, ok := sandbox.As[sandbox.ProcessSignaler](inst.sb)
		if !ok {
			return inst.status(abi.StatusIO, "process %s: this sandbox cannot signal its background commands", req.ID)
		}
		err := ps.Signal(ctx, req.ID, sandbox.Signal(req.Signal))
		if err != nil && !errors.Is(err, sandbox.ErrNotFound) && !errors.Is(err, fs.ErrNotExist) {
			return inst.execStatus(fmt.Errorf("signal: %w", err))
		}
	}
	running, err := pl.Processes(ctx)
	if errors.Is(err, sandbox.ErrUnsupported) { // a session over a sandbox that cannot tell
		return inst.status(abi.StatusIO, "process %s: this sandbox cannot tell whether its background commands run", req.ID)
	}
	if err != nil {
		return inst.execStatus(err)
	}
	reply := abi.ProcessReply{ID: req.ID, LogPath: own.logPath}
	if i := slices.IndexFunc(running, func(p sandbox.ProcessInfo) bool { return p.ID == req.ID }); i >= 0 {
		reply.Running, reply.PID = true, running[i].PID
	}
	out, _ := json.Marshal(reply)
	return inst.reply(c.outPtr, c.outCap, out)
}
