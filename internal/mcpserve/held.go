package mcpserve

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/lease"
	"github.com/toolhost/toolhost/internal/sessionapi"
	"github.com/toolhost/toolhost/internal/storekeys"
)

// Sessions the shell holds: `toolhost session start` opens one through the session API
// (sessionapi) on the daemon's socket, `toolhost call --session ID` calls it, `session
// stop` ends it. Each is a binding like an MCP session's, opened at once rather than on a
// first call, counted against MaxSessions and committed and closed at Shutdown the same
// way; what differs is who ends it: a stop, its idle timeout, or the server's end.

// heldSessions is the server's held sessions by id, and the recently ended ones (so a call
// to one says what became of it).
type heldSessions struct {
	mu         sync.Mutex
	byID       map[string]*held
	ended      map[string]string           // id -> what ended it, for the next call's error
	endedOwner map[string]string           // id -> its owner, so only they learn it
	order      []string                    // ended ids, oldest first, to bound the map
	defaults   map[defaultKey]*defaultSlot // the stateless revision's default sessions
	adopting   map[string]*defaultSlot     // handles being adopted from the fleet (handles.go)

	inflight atomic.Int64 // API requests being answered
	oneShots atomic.Int64 // one-shot calls run (POST /v1/calls)
	last     atomic.Int64 // unix nanoseconds of the last API request's end
}

func (h *heldSessions) init() {
	h.byID = map[string]*held{}
	h.ended = map[string]string{}
	h.endedOwner = map[string]string{}
	h.defaults = map[defaultKey]*defaultSlot{}
	h.adopting = map[string]*defaultSlot{}
	h.last.Store(time.Now().UnixNano())
}

// held is one session the shell holds.
type held struct {
	id       string
	b        *binding
	started  time.Time
	ready    time.Duration
	idle     time.Duration
	wokeFrom string
	recorded bool // its record is in the fleet's store (handles.go)
	calls    atomic.Int64
	inflight atomic.Int64
	last     atomic.Int64 // unix nanoseconds of the last call's start or end
	touched  atomic.Int64 // unix nanoseconds of its record's last writing (handlereap.go)
}

func (h *held) info() sessionapi.Held {
	return sessionapi.Held{ID: h.id, Project: h.b.project, Workspace: h.b.workspace, WokeFrom: h.wokeFrom,
		Started: h.started.UTC(), LastCall: time.Unix(0, h.last.Load()).UTC(), Calls: h.calls.Load(),
		IdleTimeoutMS: h.idle.Milliseconds(), ReadyMS: h.ready.Milliseconds()}
}

// apiError is an error with the status the session API answers it with.
type apiError struct {
	status int
	err    error
}

func (e *apiError) Error() string { return e.err.Error() }
func (e *apiError) Unwrap() error { return e.err }

func apiErrorf(status int, format string, args ...any) error {
	return &apiError{status, fmt.Errorf(format, args...)}
}

// StartHeld opens a session of project on workspace (a host directory, or "" for the
// project's private workspace) and holds it until StopHeld, idle past idle (0: the
// server's HeldIdleTimeout), or Shutdown.
func (s *Server) StartHeld(ctx context.Context, project, workspace string, idle time.Duration) (sessionapi.Held, error) {
	return s.startHeld(ctx, shellOwner, project, workspace, idle)
}

// shellOwner owns the sessions of the session API: its callers are this user's processes.
const shellOwner = "shell"

func (s *Server) startHeld(ctx context.Context, owner, project, workspace string, idle time.Duration) (sessionapi.Held, error) {
	return s.openHeld(ctx, owner, project, workspace, idle, "", true)
}

// openHeld opens a held session as startHeld does, under the handle id when it is not ""
// (a fleet's session adopted from its record: handles.go), else under a new one, which
// is recorded in a fleet when recorded is set (a default session is found by its token
// and project, not by its handle: it has no record).
func (s *Server) openHeld(ctx context.Context, owner, project, workspace string, idle time.Duration, id string, recorded bool) (sessionapi.Held, error) {
	if err := storekeys.ValidProject(project); err != nil {
		return sessionapi.Held{}, apiErrorf(http.StatusBadRequest, "%v", err)
	}
	if workspace == "" {
		workspace = s.opts.Workspaces[project]
	}
	if err := s.checkWorkspace(workspace); err != nil {
		return sessionapi.Held{}, err
	}
	if idle <= 0 {
		idle = s.opts.HeldIdleTimeout
	}
	b := newBinding(s, project, owner, workspace)
	start := time.Now()
	sess, err := b.session(ctx)
	if err != nil {
		status := http.StatusInternalServerError
		if _, ok := errors.AsType[*lease.HeldError](err); ok {
			status = http.StatusConflict
		} else if s.isClosing() {
			status = http.StatusServiceUnavailable
		}
		return sessionapi.Held{}, &apiError{status, err}
	}
	h := &held{id: id, b: b, started: start, ready: time.Since(start), idle: idle,
		recorded: recorded && s.recordsHandles(owner)}
	h.last.Store(time.Now().UnixNano())
	if woke, ok := sess.Woke(); ok {
		h.wokeFrom = woke.Key
	}
	if err := s.nameHeld(ctx, h, project); err != nil {
		b.finish(context.WithoutCancel(ctx), "its handle could not be recorded")
		return sessionapi.Held{}, &apiError{http.StatusServiceUnavailable, err}
	}

	s.mu.Lock()
	if s.closing { // Shutdown has taken its list, or is about to finish this binding
		s.mu.Unlock()
		s.forget(h, "the server shut down")
		return sessionapi.Held{}, apiErrorf(http.StatusServiceUnavailable, "the session daemon is shutting down; start the session again")
	}
	s.watchers.Add(1) // under s.mu, so never after Shutdown's Wait began
	s.mu.Unlock()
	go s.watchHeld(h) // owned by s.watchers: ends when the session does
	s.log.Info("mcp: held session started", "id", h.id, "project", project, "workspace", workspace, "ready", h.ready.Round(time.Millisecond))
	return h.info(), nil
}

// checkWorkspace checks a workspace a client of the session API asks for (a host
// directory; "" is the project's private workspace) as the server's own: absolute, a
// directory, and one CheckWorkspace accepts. The client's word is not trusted.
func (s *Server) checkWorkspace(workspace string) error {
	if workspace == "" {
		return nil
	}
	if !filepath.IsAbs(workspace) {
		return apiErrorf(http.StatusBadRequest, "the workspace %s is not an absolute path", workspace)
	}
	if st, err := os.Stat(workspace); err != nil || !st.IsDir() {
		return apiErrorf(http.StatusBadRequest, "the workspace %s is not a directory", workspace)
	}
	if err := s.th.CheckWorkspace(workspace); err != nil {
		return &apiError{http.StatusBadRequest, err}
	}
	return nil
}

// APIError is err with the status the session API answers it with: 400 for the caller's
// mistake (an unknown tool), which the CLI reports as a usage mistake.
func APIError(status int, err error) error { return &apiError{status, err} }

// oneShot runs a one-shot call of the session API (sessionapi.OneShotRequest) through
// Options.OneShot, after checking what the caller asks for as startHeld does.
func (s *Server) oneShot(ctx context.Context, r *http.Request) (abi.Result, error) {
	if d := r.Header.Get(sessionapi.ConfigDigestHeader); d != "" && s.opts.ConfigDigest != "" && d != s.opts.ConfigDigest {
		// Nothing ran: the caller runs the call itself.
		return abi.Result{}, apiErrorf(http.StatusPreconditionFailed, "the session daemon runs with another configuration than this command's")
	}
	if s.isClosing() {
		return abi.Result{}, apiErrorf(http.StatusServiceUnavailable, "the session daemon is shutting down")
	}
	if !s.takesOneShots() {
		return abi.Result{}, apiErrorf(http.StatusServiceUnavailable, "the session daemon is still compiling its plugins")
	}
	var req sessionapi.OneShotRequest
	if err := readAPI(r, &req); err != nil {
		return abi.Result{}, err
	}
	if err := storekeys.ValidProject(req.Project); err != nil {
		return abi.Result{}, apiErrorf(http.StatusBadRequest, "%v", err)
	}
	if err := s.checkWorkspace(req.Workspace); err != nil {
		return abi.Result{}, err
	}
	if len(req.Input) == 0 || string(req.Input) == "null" {
		req.Input = json.RawMessage(`{}`)
	}
	s.held.oneShots.Add(1)
	res, err := s.opts.OneShot(ctx, req)
	if err != nil {
		if _, ok := errors.AsType[*lease.HeldError](err); ok {
			err = &apiError{http.StatusConflict, err}
		}
		return abi.Result{}, err
	}
	if res.Content == nil {
		res.Content = []abi.Content{}
	}
	return res, nil
}

// takesOneShots reports whether one-shot calls may run (Options.OneShot, OneShotReady).
func (s *Server) takesOneShots() bool {
	if s.opts.OneShot == nil {
		return false
	}
	if s.opts.OneShotReady == nil {
		return true
	}
	select {
	case <-s.opts.OneShotReady:
		return true
	default:
		return false
	}
}

// nameHeld gives h a handle not in use here (and, in a fleet, recorded in the store as
// no other replica's: handles.go), unless it has one, and lists it.
func (s *Server) nameHeld(ctx context.Context, h *held, project string) error {
	if h.id != "" {
		s.held.mu.Lock()
		defer s.held.mu.Unlock()
		if s.held.byID[h.id] != nil {
			return fmt.Errorf("session %s is open here already", h.id)
		}
		delete(s.held.ended, h.id)
		s.held.byID[h.id] = h
		return nil
	}
	for range 16 {
		s.held.mu.Lock()
		id := ""
		for id == "" || s.held.byID[id] != nil || s.held.ended[id] != "" {
			id = project + "-" + randomHex(3)
		}
		if !h.recorded {
			h.id = id
			s.held.byID[id] = h
			s.held.mu.Unlock()
			return nil
		}
		h.id = id
		s.held.byID[id] = h // taken here while its record is written
		s.held.mu.Unlock()
		ok, err := s.recordHandle(ctx, id, project, h.b.owner, h.idle)
		if ok {
			h.touched.Store(time.Now().UnixNano())
			return nil
		}
		s.held.mu.Lock()
		delete(s.held.byID, id)
		h.id = ""
		s.held.mu.Unlock()
		if err != nil {
			return fmt.Errorf("the session could not be recorded in the store, so another server of the fleet could not go on with it; start it again: %w", err)
		}
	}
	return errors.New("no free handle was found for the session; start it again")
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func (s *Server) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

// watchHeld ends h when it has been idle (no call running, none started) for its idle
// timeout, and forgets it when it ended any way.
func (s *Server) watchHeld(h *held) {
	defer s.watchers.Done()
	t := time.NewTimer(h.idle)
	defer t.Stop()
	for {
		select {
		case <-h.b.gone:
			s.forget(h, "it was stopped")
			return
		case <-t.C:
			left := h.idle - time.Since(time.Unix(0, h.last.Load()))
			if left > 0 || h.inflight.Load() > 0 {
				t.Reset(max(left, time.Second))
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), shutdownBound)
			h.b.finish(ctx, "idle")
			cancel()
			s.forget(h, fmt.Sprintf("it was idle for %s", h.idle))
			return
		}
	}
}

// forget removes h from the held sessions and remembers why it ended.
func (s *Server) forget(h *held, why string) {
	msg := fmt.Sprintf("session %s has ended (%s)", h.id, why)
	h.b.mu.Lock()
	if info := h.b.endInfo; info.Key != "" {
		msg += fmt.Sprintf("; its work is snapshot %s of project %s", info.Key, h.b.project)
	}
	handedOver := h.b.handedOver
	// A session that lost its project's lease (this replica stalled past it, or its store
	// did not answer) is another replica's now, which may have adopted the handle: this
	// one must not delete the record it goes on with.
	lost := h.b.lostLease
	h.b.mu.Unlock()
	if h.recorded && !handedOver && !lost {
		// Before the end is answered: a call of the handle that reaches another replica
		// after it must not find the record and open the session again.
		s.dropHandle(h.id)
	}
	s.held.mu.Lock()
	defer s.held.mu.Unlock()
	if s.held.byID[h.id] != h {
		return
	}
	delete(s.held.byID, h.id)
	if handedOver {
		return // it goes on on another replica of the fleet, which adopts it (handles.go)
	}
	s.held.ended[h.id] = msg
	s.held.endedOwner[h.id] = h.b.owner
	s.held.order = append(s.held.order, h.id)
	if len(s.held.order) > 256 {
		delete(s.held.ended, s.held.order[0])
		delete(s.held.endedOwner, s.held.order[0])
		s.held.order = s.held.order[1:]
	}
}

// Held lists the sessions held through the session API, oldest first.
func (s *Server) Held() []sessionapi.Held {
	s.held.mu.Lock()
	hs := make([]*held, 0, len(s.held.byID))
	for _, h := range s.held.byID {
		if h.b.owner == shellOwner {
			hs = append(hs, h)
		}
	}
	s.held.mu.Unlock()
	slices.SortFunc(hs, func(a, b *held) int { return a.started.Compare(b.started) })
	out := make([]sessionapi.Held, 0, len(hs))
	for _, h := range hs {
		out = append(out, h.info())
	}
	return out
}

// errNoSuchSession: no session of that handle runs here, nor ended here recently.
var errNoSuchSession = errors.New("no session")

// lookup finds owner's held session id, or says why there is none (404). Another
// owner's session is "no session", whatever it is.
func (s *Server) lookup(owner, id string) (*held, error) {
	s.held.mu.Lock()
	defer s.held.mu.Unlock()
	if h := s.held.byID[id]; h != nil && h.b.owner == owner {
		return h, nil
	}
	if msg := s.held.ended[id]; msg != "" && s.held.endedOwner[id] == owner {
		return nil, apiErrorf(http.StatusNotFound, "%s; start a new one", msg)
	}
	ids := make([]string, 0, len(s.held.byID))
	for id, h := range s.held.byID {
		if h.b.owner == owner {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	if len(ids) == 0 {
		hint := "toolhost session start opens one"
		if owner != shellOwner {
			hint = SessionStartTool + " opens one"
		}
		return nil, &apiError{http.StatusNotFound, fmt.Errorf("%w %s: none runs (%s)", errNoSuchSession, id, hint)}
	}
	return nil, &apiError{http.StatusNotFound, fmt.Errorf("%w %s (running: %s)", errNoSuchSession, id, strings.Join(ids, ", "))}
}

// CallHeld runs one tool call in held session id.
func (s *Server) CallHeld(ctx context.Context, id, tool string, input json.RawMessage) (abi.Result, error) {
	return s.callHeld(ctx, shellOwner, id, tool, input)
}

func (s *Server) callHeld(ctx context.Context, owner, id, tool string, input json.RawMessage) (abi.Result, error) {
	h, err := s.lookup(owner, id)
	if err != nil {
		return abi.Result{}, err
	}
	if !s.hasTool(tool) {
		names := make([]string, 0, len(s.tools))
		for _, t := range s.tools {
			names = append(names, t.Name)
		}
		return abi.Result{}, apiErrorf(http.StatusBadRequest, "unknown tool %q (tools: %s)", tool, strings.Join(names, ", "))
	}
	h.inflight.Add(1)
	h.last.Store(time.Now().UnixNano())
	defer func() {
		h.last.Store(time.Now().UnixNano())
		h.inflight.Add(-1)
		// A call that ran for long: the session's idle time counts from its end.
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		s.touchHandle(tctx, h)
		cancel()
	}()
	h.calls.Add(1)
	s.touchHandle(ctx, h)
	sess, done, err := h.b.begin(ctx)
	if err != nil {
		return abi.Result{}, apiErrorf(http.StatusNotFound, "session %s: %v", id, err)
	}
	defer done()
	if len(input) == 0 || string(input) == "null" {
		input = json.RawMessage(`{}`)
	}
	start := time.Now()
	var res abi.Result
	if tool == CommitTool && !s.pluginCommit {
		res = s.commitResult(ctx, h.b, sess, input)
	} else if (tool == CheckpointsTool || tool == RewindTool) && !s.pluginTool(tool) {
		msg, isErr := h.b.checkpointText(ctx, sess, tool, input)
		res = abi.Result{IsError: isErr, Content: []abi.Content{{Type: abi.ContentText, Text: msg}}}
	} else {
		res, err = sess.Dispatch(ctx, tool, input)
		if err != nil {
			s.log.Warn("mcp: a tool call failed in the host", "tool", tool, "session", id, "err", err)
			if ctx.Err() != nil {
				return abi.Result{}, ctx.Err()
			}
			if len(res.Content) == 0 {
				return abi.Result{}, fmt.Errorf("%s could not run: %w", tool, err)
			}
		}
	}
	s.metrics.observe(tool, res.IsError, time.Since(start))
	return res, nil
}

// commitResult is the commit tool's result for the session API.
func (s *Server) commitResult(ctx context.Context, b *binding, sess *toolhost.Session, input json.RawMessage) abi.Result {
	msg, isErr := b.commitText(ctx, sess, input)
	return abi.Result{IsError: isErr, Content: []abi.Content{{Type: abi.ContentText, Text: msg}}}
}

// CommitHeld saves a snapshot of held session id's workspace.
func (s *Server) CommitHeld(ctx context.Context, id, label string) (toolhost.SnapshotInfo, error) {
	h, err := s.lookup(shellOwner, id)
	if err != nil {
		return toolhost.SnapshotInfo{}, err
	}
	h.last.Store(time.Now().UnixNano())
	sess, err := h.b.session(ctx)
	if err != nil {
		return toolhost.SnapshotInfo{}, apiErrorf(http.StatusNotFound, "session %s: %v", id, err)
	}
	return sess.Commit(ctx, label)
}

// StopHeld ends held session id: its workspace committed, its sandbox closed.
func (s *Server) StopHeld(ctx context.Context, id string) (toolhost.SnapshotInfo, error) {
	return s.stopHeld(ctx, shellOwner, id)
}

func (s *Server) stopHeld(ctx context.Context, owner, id string) (toolhost.SnapshotInfo, error) {
	h, err := s.lookup(owner, id)
	if err != nil {
		return toolhost.SnapshotInfo{}, err
	}
	err = h.b.finish(ctx, "stopped")
	s.forget(h, "it was stopped")
	h.b.mu.Lock()
	info := h.b.endInfo
	h.b.mu.Unlock()
	if err != nil && info.Key != "" {
		// The work is saved; what failed is closing the sandbox, which is the host's
		// business (the log has it), not the caller's.
		s.log.Warn("mcp: a held session's sandbox did not close cleanly after its commit", "id", id, "err", err)
		err = nil
	}
	return info, err
}

// CloseIfIdle starts the server's shutdown when nothing is held, connected or being
// answered and the last request ended at least d ago; it reports whether it did. A
// request that comes after finds the server closing (503), and its client starts a new
// daemon.
func (s *Server) CloseIfIdle(d time.Duration) bool {
	if s.held.inflight.Load() > 0 || time.Since(time.Unix(0, s.held.last.Load())) < d {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing || len(s.open) > 0 || len(s.connected) > 0 || s.held.inflight.Load() > 0 {
		return false
	}
	s.closing = true
	return true
}
