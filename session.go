package toolhost

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/capture"
	"github.com/toolhost/toolhost/internal/host"
	"github.com/toolhost/toolhost/internal/lease"
	"github.com/toolhost/toolhost/internal/session"
	"github.com/toolhost/toolhost/internal/sessionstate"
	"github.com/toolhost/toolhost/internal/snapshot"
	"github.com/toolhost/toolhost/internal/storekeys"
	"github.com/toolhost/toolhost/internal/tracing"
	"github.com/toolhost/toolhost/internal/tree"
)

// SessionOptions choose what a session works on.
type SessionOptions struct {
	// Project is the project whose snapshots and screenshots the session uses; empty means
	// the configured project.
	Project string
	// Workspace is a host directory that every sandbox of the session mounts as its
	// workspace, used as it is: nothing is restored into it (the directory is the state),
	// while commits still save it as the project's snapshots. CheckWorkspace must accept
	// it. Empty: the project's private workspace, which the session wakes from the
	// project's newest snapshot and which lives only as long as its snapshots.
	Workspace string
	// Provider replaces the configured sandbox provider for this session (a wrapper of
	// it, say); nil means Toolhost.Provider.
	Provider sandbox.Provider
	// Logger receives the session's records (wake, extensions, rotations, commits);
	// nil means the Toolhost's logger.
	Logger *slog.Logger
	// Egress narrows what the session's sandboxes may reach (sandbox.network egress): a
	// destination must be allowed by sandbox.egress.* and by this; it can only take away.
	// nil: the host's policy as it is.
	Egress *EgressPolicy
}

// Session is a project's live workspace with the tools bound to it. Tools dispatched
// through it act in a sandbox that the session keeps alive, replaces before it expires
// (the work moves with it) and saves on Commit. It is safe for concurrent use.
type Session struct {
	th      *Toolhost
	project string
	id      string // names the session in its record and its sandboxes' labels
	live    *session.Workspace
	tools   *host.Dispatcher
	wake    *wakeRecorder
	lease   *projectLease // nil when leases are off
	rec     *recorder     // keeps the session's record in the store
	// takeoverable: the provider's sandboxes outlive this process (sandbox.Reconnector),
	// so the record is written before each call's result is answered.
	takeoverable bool
	log          *slog.Logger
	// store is where the session writes: the store, fenced by the lease (lease.Fence)
	// when leases are on; snaps is the snapshot manager on it.
	store store.Store
	snaps *snapshot.Manager

	recordOnce sync.Once // stops the recorder and deletes the record once
	closeOnce  sync.Once // gives the lease up once
}

// Open opens a session: a new sandbox from the provider, into which the project's newest
// snapshot that verifies is restored (unless opts.Workspace names a host directory).
func (t *Toolhost) Open(ctx context.Context, opts SessionOptions) (*Session, error) {
	cfg := &t.cfg
	project := opts.Project
	if project == "" {
		project = cfg.Project
	}
	if err := storekeys.ValidProject(project); err != nil {
		return nil, fmt.Errorf("opening a session: %w", err)
	}
	ws := opts.Workspace
	if ws != "" {
		abs, err := filepath.Abs(ws)
		if err != nil {
			return nil, fmt.Errorf("workspace %s: %w", ws, err)
		}
		if st, err := os.Stat(abs); err != nil {
			return nil, fmt.Errorf("workspace: %w", err)
		} else if !st.IsDir() {
			return nil, fmt.Errorf("workspace %s is not a directory", abs)
		}
		if err := t.CheckWorkspace(abs); err != nil {
			return nil, err
		}
		ws = abs
	}
	log := opts.Logger
	if log == nil {
		log = t.opts.log
	}
	// The project's lease comes before its sandbox, even before the provider: another
	// host holding it means this one must not restore, run or save the project.
	ls, err := t.takeLease(ctx, project, log)
	if err != nil {
		return nil, err
	}
	opened := false
	defer func() {
		if !opened {
			t.dropLease(context.WithoutCancel(ctx), ls)
		}
	}()
	prov := opts.Provider
	if prov == nil {
		p, err := t.sessionProvider(ctx, project)
		if err != nil {
			return nil, err
		}
		prov = p
	} else if _, err := t.Provider(ctx); err != nil { // for its lifetime bound
		return nil, err
	}
	// A sandbox of a provider with a lifetime bound (an E2B plan's) cannot be asked to
	// live longer: the session's ttl and max_lifetime stay within it (Validate made sure
	// the keepalive margin leaves room).
	ttl, maxLife := cfg.Session.TTL, cfg.Session.MaxLifetime
	if c := t.lifeCap; c > 0 && (ttl > c || maxLife > c) {
		ttl, maxLife = min(ttl, c), min(maxLife, c)
		t.opts.log.Debug("session lifetime within the provider's bound", "bound", c, "ttl", ttl, "max_lifetime", maxLife)
	}
	eg, err := t.sessionEgress(project, opts.Egress)
	if err != nil {
		return nil, fmt.Errorf("opening a session for project %s: %w", project, err)
	}
	// Every store write of the session goes through one fenced store: its snapshots
	// (archives, packs, indexes, manifests, retention's deletes, rewinds), its
	// screenshots, its plugins' store calls. Once the lease is lost they are refused, and
	// a write under way ends with the lease.
	st, snaps := t.storage.store, t.storage.snaps
	var fence func() error
	if ls != nil {
		st = lease.Fence(st, ls.l)
		snaps = snaps.WithStore(st)
		fence = ls.check
	}
	wake := &wakeRecorder{snaps: snaps, hostDir: ws != "", lease: ls}
	hostOpts := []host.SessionOption{host.WithProject(project), host.WithDefaultPort(cfg.Screenshot.Port), host.WithStore(st)}
	var auto session.AutoCapturer // nil unless screenshots are on: never a typed nil
	if t.rec != nil {
		rec := *t.rec
		rec.Store = st
		auto = capture.Of(&rec)
		hostOpts = append(hostOpts, host.WithCapturer(capture.Of(&rec)))
	}
	// The session's record, and its sandboxes' labels: what the next holder of the
	// project takes over from if this process dies (sessionrecord.go). A workspace on a
	// host directory is its own state: nothing to take over.
	epoch := epochOf(ls)
	s := &Session{th: t, project: project, id: newSessionID(), wake: wake, lease: ls, log: log, store: st, snaps: snaps}
	s.rec = newRecorder(s)
	var tk takeover
	if ws == "" {
		var release func()
		tk, release = t.takeoverFrom(ctx, project, epoch, log)
		defer func() {
			if !opened {
				release() // for another session to take
			}
		}()
	}
	labels := map[string]string{
		session.LabelProject: project, session.LabelEpoch: strconv.FormatUint(epoch, 10),
		session.LabelInstance: t.instance, session.LabelSession: s.id,
	}
	if f := t.fleetMember(); f != nil && f.ID != "" {
		labels[session.LabelFleet] = f.ID
	}
	live, err := session.Open(ctx, session.Config{
		Provider:        prov,
		Sandbox:         sandbox.CreateOptions{Workspace: ws, Network: cfg.Sandbox.Network, Egress: eg, Labels: labels},
		ProjectID:       project,
		Snapshots:       wake,
		Excludes:        cfg.Snapshot.Excludes,
		TTL:             ttl,
		KeepaliveMargin: cfg.Session.KeepaliveMargin,
		LastCallMargin:  cfg.Session.LastCallMargin,
		MaxLifetime:     maxLife,
		Screenshots:     auto,
		Takeover:        tk.to,
		Orphans:         orphansOf(project, epoch, tk.pending),
		OnChange:        s.rec.changed,
		Autosave:        cfg.Session.Autosave,
		Logger:          log,
		Fence:           fence,
	})
	if err != nil {
		return nil, fmt.Errorf("opening a session for project %s: %w", project, err)
	}
	s.live = live
	_, s.takeoverable = sandbox.ProviderAs[sandbox.Reconnector](prov)
	s.tools = t.host.OpenSession(live, hostOpts...)
	if tk.to != nil {
		s.adoptCarried(tk.rec)
	}
	// The record names the new holder before any tool runs; then the one taken over goes.
	s.rec.flush(ctx)
	s.rec.start()
	if tk.to != nil && s.leaseErr() == nil {
		if err := sessionstate.Delete(ctx, st, project, tk.rec.Session); err != nil {
			log.Warn("the record this session took over from could not be deleted", "project", project, "session", tk.rec.Session, "err", err)
		}
	}
	opened = true
	return s, nil
}

// takeLease takes project's lease for a session (nil when leases are off), or shares the
// one this Toolhost holds. The first call checks that the store keeps leases: one that
// ignores conditional writes turns them off, logged once.
func (t *Toolhost) takeLease(ctx context.Context, project string, log *slog.Logger) (*projectLease, error) {
	if !t.cfg.Lease.Enabled {
		return nil, nil
	}
	t.leaseMu.Lock()
	if !t.leaseOK && !t.leaseOff {
		// Unique to host, process and call: two processes in two pid namespaces of one
		// host name can share a pid, so a nonce too (as the doctor's probes).
		probe := fmt.Sprintf("lease-probe/%s-%d-%d-%s", hostName(), os.Getpid(), time.Now().UnixNano(), storekeys.NewNonce())
		err := lease.Check(ctx, t.storage.store, probe)
		switch {
		case errors.Is(err, lease.ErrUnsupported):
			t.leaseOff = true
			t.opts.log.Warn("project leases are off: nothing keeps two hosts sharing this store from opening one project at once",
				"store", t.storage.where, "why", err)
		case err != nil:
			t.leaseMu.Unlock()
			return nil, fmt.Errorf("opening a session for project %s: checking the store for project leases: %w", project, err)
		default:
			t.leaseOK = true
		}
	}
	if t.leaseOff {
		t.leaseMu.Unlock()
		return nil, nil
	}
	e := t.leases[project]
	if e != nil && e.l != nil && e.l.Err() != nil {
		e = nil // lost: its sessions keep it to fail with; new ones take the lease anew
	}
	if e != nil {
		e.users++
		t.leaseMu.Unlock()
		select {
		case <-e.ready:
		case <-ctx.Done():
			t.dropLease(context.WithoutCancel(ctx), e)
			return nil, ctx.Err()
		}
		if e.err != nil {
			return nil, e.err
		}
		return e, nil
	}
	e = &projectLease{project: project, ready: make(chan struct{}), users: 1}
	if t.leases == nil {
		t.leases = map[string]*projectLease{}
	}
	t.leases[project] = e
	fleet := t.fleet
	t.leaseMu.Unlock()

	lc := lease.Config{Store: t.storage.store, TTL: t.cfg.Lease.TTL, Renew: t.cfg.Lease.Renew, Host: hostName(), Logger: log}
	if fleet != nil {
		lc.Instance, lc.Addr, lc.Probe = fleet.Instance, fleet.Addr, fleet.Probe
	}
	l, err := lease.Acquire(ctx, lc, project)
	t.leaseMu.Lock()
	if err != nil {
		e.err = fmt.Errorf("opening a session: %w", err)
		if t.leases[project] == e {
			delete(t.leases, project)
		}
	} else {
		e.l = l
	}
	t.leaseMu.Unlock()
	close(e.ready)
	if e.err != nil {
		return nil, e.err
	}
	return e, nil
}

// dropLease ends a session's use of its project's lease; the last one releases it.
func (t *Toolhost) dropLease(ctx context.Context, e *projectLease) error {
	if e == nil {
		return nil
	}
	t.leaseMu.Lock()
	e.users--
	last := e.users == 0
	if last && t.leases[e.project] == e {
		delete(t.leases, e.project)
	}
	t.leaseMu.Unlock()
	if !last {
		return nil
	}
	<-e.ready
	if e.l == nil {
		return nil
	}
	return e.l.Release(ctx)
}

// leaseErr is why the session may no longer act on its project (its lease was lost), or nil.
func (s *Session) leaseErr() error { return s.lease.check() }

// Project is the session's project.
func (s *Session) Project() string { return s.project }

// Tools returns the tool definitions to send to the model (those of the Toolhost).
func (s *Session) Tools() []abi.Tool { return s.th.Tools() }

// Dispatch runs one tool call: a tool_use block's name and input in, a tool_result's
// content and is_error out. A tool's own failure is a Result with IsError set and a nil
// error; an error means the host could not run the tool, and the Result still holds an
// is_error text to send back.
//
// Each call is a span ("execute_tool TOOL") of the global OpenTelemetry tracer provider
// (otel.GetTracerProvider), under ctx's span: an embedder that sets a provider sees its
// tool calls, the plugins' runs and their host calls (docs/MCP.md, "Traces").
func (s *Session) Dispatch(ctx context.Context, tool string, input json.RawMessage) (abi.Result, error) {
	ctx, span := tracer.Start(ctx, tracing.SpanTool, trace.SpanKindInternal)
	defer span.End()
	if err := s.leaseErr(); err != nil {
		endToolSpan(span, s, tool, abi.Result{IsError: true}, err)
		return abi.Result{IsError: true, Content: []abi.Content{{Type: abi.ContentText,
			Text: fmt.Sprintf("The tool did not run: project %s may be open on another host now (this session could not keep it). Start a new session.", s.project)}}}, err
	}
	res, err := s.tools.Dispatch(ctx, tool, input)
	// The shell's directory, a process started or stopped, a file read: the record
	// follows. Where another process could take the sandbox over (sandbox.Reconnector),
	// before the result is answered: a kill right after must not lose what the call did
	// to the session (edit_file would refuse a file the model just wrote).
	if s.takeoverable {
		s.rec.flush(context.WithoutCancel(ctx))
		if lerr := s.leaseErr(); lerr != nil {
			// The lease was lost while the call ran (this process stalled past its ttl):
			// another replica may have taken the project over from a record that does not
			// know what the call did. Its result is not the model's to build on: it is
			// told to make the call again, where the project is now.
			res, err = lostMidCall(s.project, tool), errors.Join(err, lerr)
		}
	} else {
		s.rec.changed()
	}
	endToolSpan(span, s, tool, res, err)
	return res, err
}

// lostMidCall is the result of a call that ended after its session lost the project's
// lease.
func lostMidCall(project, tool string) abi.Result {
	return abi.Result{IsError: true, Content: []abi.Content{{Type: abi.ContentText, Text: fmt.Sprintf(
		"The %s call ran, but this session lost project %s while it ran (another session may hold it now), so what the call did may be unknown to the session that goes on. Make the call again; for an edit, read the file first: the edit may be in place.", tool, project)}}}
}

// tracer starts the spans of the root package's calls, with the global provider.
var tracer = tracing.NewTracer(otel.GetTracerProvider)

// endToolSpan names and describes a tool call's span when it records: the tool (its name
// only when a plugin gives it: a model may call anything), the project, how it ended.
func endToolSpan(span trace.Span, s *Session, tool string, res abi.Result, err error) {
	if !span.IsRecording() {
		return
	}
	if s.tools.HasTool(tool) {
		span.SetName(tracing.SpanTool + " " + tool)
		span.SetAttributes(tracing.ToolName.String(tool))
	}
	span.SetAttributes(tracing.Operation.String(tracing.ExecuteToolOp), tracing.Project.String(s.project),
		tracing.ResultIsError.Bool(res.IsError))
	switch {
	case err != nil:
		span.SetAttributes(tracing.ErrorType.String(tracing.ErrHostFailure))
		span.SetStatus(codes.Error, "the host could not run the tool")
	case res.IsError:
		span.SetAttributes(tracing.ErrorType.String(tracing.ErrToolResult))
	}
}

// Commit saves a snapshot of the workspace (a phase commit) and, when a dev server runs,
// has its page captured on its own afterwards (under auto/).
func (s *Session) Commit(ctx context.Context, label string) (SnapshotInfo, error) {
	if err := s.leaseErr(); err != nil {
		return SnapshotInfo{}, fmt.Errorf("committing: %w", err)
	}
	info, err := s.live.Commit(ctx, label)
	return snapshotInfo(info), err
}

// Screenshots lists the project's stored screenshots of one kind (ScreenshotsAgent: those
// take_screenshot took; ScreenshotsAuto: those the session took on its own; "" for both),
// newest first.
func (s *Session) Screenshots(ctx context.Context, kind string) ([]Screenshot, error) {
	return s.th.storage.Screenshots(ctx, s.project, kind)
}

// Woke reports the snapshot the session's first sandbox was restored from; false when it
// started empty (a new project, or a host directory as the workspace).
func (s *Session) Woke() (SnapshotInfo, bool) {
	info, ok := s.wake.first()
	return snapshotInfo(info), ok
}

// Checkpoints lists the project's snapshots, newest first, with their times and labels:
// the points a Rewind can go back to.
func (s *Session) Checkpoints(ctx context.Context) ([]Checkpoint, error) {
	cps, err := s.th.storage.snaps.Checkpoints(ctx, s.project)
	out := make([]Checkpoint, len(cps))
	for i, c := range cps {
		out[i] = Checkpoint{Key: c.Key, Time: c.Time, Label: c.Label, Format: c.Format, Files: c.Files, Bytes: c.Bytes, Origin: c.Origin}
	}
	return out, err
}

// Checkpoint is a snapshot as a rewind sees it.
type Checkpoint struct {
	// Key names the snapshot; its last part (after the last "/") names it as well.
	Key  string
	Time time.Time
	// Label is the commit's ("rotation", a phase's name, "before rewind to ...").
	Label string
	// Format is "chunked" or "tar.gz" (only chunked snapshots keep labels).
	Format string
	Files  int
	Bytes  int64
	// Origin is, for a fork or a rewind, the snapshot it copies.
	Origin string
}

// Rewound is what a Rewind did.
type Rewound struct {
	// Saved is the snapshot of the present taken first (Unchanged when the newest
	// snapshot already held it).
	Saved SnapshotInfo
	// Checkpoint is the snapshot rewound to.
	Checkpoint string
	// Now is the new newest snapshot: the checkpoint's content.
	Now SnapshotInfo
	// Undo is the checkpoint a Rewind goes to to undo this one: the present.
	Undo string
}

// Rewind moves the workspace back to the checkpoint key (a key from Checkpoints, or its
// last part) without losing the present: the present is saved first, the checkpoint's
// content becomes the project's newest snapshot, and the session continues in a sandbox
// restored from it (background processes restarted). Rewinding to Rewound.Undo undoes
// it. A session on a host directory cannot rewind (the directory is the state).
func (s *Session) Rewind(ctx context.Context, key string) (Rewound, error) {
	if err := s.leaseErr(); err != nil {
		return Rewound{}, fmt.Errorf("rewinding: %w", err)
	}
	if s.wake.hostDir {
		return Rewound{}, errors.New("rewinding: the workspace is a host directory, which is its own state; restore a snapshot into it with toolhost snapshot restore")
	}
	snaps := s.snaps
	target, err := snaps.Resolve(ctx, s.project, key)
	if err != nil {
		return Rewound{}, fmt.Errorf("rewinding: %w", err)
	}
	saved, err := s.Commit(ctx, "before rewind to "+path.Base(target))
	if err != nil {
		return Rewound{}, fmt.Errorf("rewinding: saving the present first: %w", err)
	}
	now, undo, err := snaps.Rewind(ctx, s.project, target)
	if err != nil {
		return Rewound{Saved: saved, Checkpoint: target}, fmt.Errorf("rewinding: %w", err)
	}
	res := Rewound{Saved: saved, Checkpoint: target, Now: snapshotInfo(now), Undo: undo}
	if err := s.live.Reload(ctx, "a rewind to "+path.Base(target)); err != nil {
		return res, fmt.Errorf("rewinding: the project's newest snapshot is the checkpoint now, but the workspace could not be restored from it: %w", err)
	}
	return res, nil
}

// Close ends the session and its sandbox without saving (Commit first to keep the work),
// waiting for the sandbox to stop at most until ctx ends, then gives up the project's
// lease.
func (s *Session) Close(ctx context.Context) error {
	s.recordOnce.Do(func() {
		// A session that closes leaves nothing to take over: its record goes first, so a
		// death during the close leaves at worst an orphan sandbox (which the next holder
		// kills), never a record of processes that were meant to end. A session that lost
		// the lease leaves the record alone: it is the new holder's.
		s.rec.close()
		if s.leaseErr() == nil {
			if err := sessionstate.Delete(ctx, s.store, s.project, s.id); err != nil {
				s.log.Warn("the closed session's record could not be deleted; the next session will find it and take over from it", "project", s.project, "err", err)
			}
		}
	})
	err := s.live.Close(ctx)
	s.closeOnce.Do(func() { err = errors.Join(err, s.th.dropLease(ctx, s.lease)) })
	return err
}

// handoff ends the session here and leaves its work for the process that opens the
// project next (a fleet's drain, serve.drain handoff): the workspace is committed (the
// fallback, should the sandbox be gone by then), a sandbox that lives apart from this
// process is left running for that process to reconnect to, and the lease is released.
// It reports whether the sandbox was left running; one that cannot be is closed.
func (s *Session) handoff(ctx context.Context) (bool, error) {
	var cerr error
	if s.leaseErr() == nil { // else the project is another's: nothing of it to save
		if _, err := s.Commit(ctx, "handoff"); err != nil {
			cerr = fmt.Errorf("committing before the handoff: %w", err)
		}
	}
	kept, derr := s.live.Detach(ctx)
	s.recordOnce.Do(func() {
		s.rec.close()
		if kept {
			// The record is what the next holder takes over from: it stays, written last
			// now that the session has stopped changing (a write the store refuses, the
			// lease lost, leaves the last one written), and a later session of this
			// process may take it over too.
			s.rec.flush(ctx)
			s.th.leave(s.project, s.id)
		} else if s.leaseErr() == nil {
			// Nothing runs on to take over: the next holder wakes from the commit above.
			if err := sessionstate.Delete(ctx, s.store, s.project, s.id); err != nil {
				s.log.Warn("the handed-over session's record could not be deleted", "project", s.project, "err", err)
			}
		}
	})
	var lerr error
	s.closeOnce.Do(func() { lerr = s.th.dropLease(ctx, s.lease) })
	return kept, errors.Join(cerr, derr, lerr)
}

// wakeRecorder is the session's snapshot manager: it remembers the snapshot a wake
// restored, and restores nothing into a host directory (the directory is the state;
// saves go to the project as usual).
type wakeRecorder struct {
	snaps   *snapshot.Manager
	hostDir bool
	lease   *projectLease // the session's, or nil: no save once it is lost

	mu    sync.Mutex
	woke  snapshot.Info
	wokeN int
}

func (w *wakeRecorder) SaveLabeled(ctx context.Context, project, label string, pack func(io.Writer) error) (snapshot.Info, error) {
	// Every save (a commit, a rotation's) is the project's newest snapshot, which the
	// host that took the lease over would wake from: none once the lease is lost.
	if err := w.lease.check(); err != nil {
		return snapshot.Info{}, fmt.Errorf("saving a snapshot: %w", err)
	}
	return w.snaps.SaveLabeled(ctx, project, label, pack)
}

func (w *wakeRecorder) SaveTree(ctx context.Context, project, label string, src tree.Source, excludes []string) (snapshot.Info, error) {
	if err := w.lease.check(); err != nil {
		return snapshot.Info{}, fmt.Errorf("saving a snapshot: %w", err)
	}
	return w.snaps.SaveTree(ctx, project, label, src, excludes)
}

func (w *wakeRecorder) RestoreTo(ctx context.Context, project string, t snapshot.Target) (snapshot.Info, error) {
	if w.hostDir {
		return snapshot.Info{}, fmt.Errorf("the workspace is a host directory: %w", snapshot.ErrNoSnapshot)
	}
	if allow := t.Convert; allow != nil {
		// Converting a tar.gz snapshot writes the project's newest snapshot, as a save
		// does: none once the lease is lost.
		t.Convert = func() error {
			if err := w.lease.check(); err != nil {
				return fmt.Errorf("converting a snapshot: %w", err)
			}
			return allow()
		}
	}
	in, err := w.snaps.RestoreTo(ctx, project, t)
	if err == nil {
		w.mu.Lock()
		if w.wokeN == 0 {
			w.woke = in
		}
		w.wokeN++
		w.mu.Unlock()
	}
	return in, err
}

func (w *wakeRecorder) first() (snapshot.Info, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.woke, w.wokeN > 0
}

// The bash plugin keeps the shell's working directory in its session state under this key
// (plugins/bash/shell.go): the record carries it, so the next session's shell starts there.
const (
	bashPlugin = "bash"
	bashCwdKey = "shell/cwd"
)

// recordRetry is the wait before writing a record again after a failed write.
const recordRetry = 10 * time.Second

// adoptCarried gives back to the plugins what the session took over: each its background
// processes and terminals (when the sandbox was reconnected: they still run there), and
// the shell its working directory.
func (s *Session) adoptCarried(rec sessionstate.Record) {
	if s.live.TookOver() {
		for _, p := range rec.Processes {
			if p.Plugin != "" {
				s.tools.AdoptProcess(p.Plugin, p.ID, p.Log)
			}
		}
		for _, tm := range rec.Terminals {
			if tm.Plugin != "" {
				s.tools.AdoptTerminal(tm.Plugin, tm.ID)
			}
		}
	}
	for plugin, vals := range rec.State {
		for k, v := range vals {
			s.tools.SetPluginState(plugin, k, v)
		}
	}
	if rec.Cwd != "" {
		s.tools.SetPluginState(bashPlugin, bashCwdKey, []byte(rec.Cwd))
	}
}

// carriedState is the plugins' session values a record carries: whole plugins, the
// smallest first, while they fit in sessionstate.MaxStateBytes (a plugin's values are
// carried all or none: a part of them could say something none of them says).
func carriedState(all map[string]map[string][]byte) map[string]map[string][]byte {
	type sized struct {
		plugin string
		n      int
	}
	var ps []sized
	for plugin, vals := range all {
		n := 0
		for k, v := range vals {
			n += len(k) + len(v)
		}
		if len(vals) > 0 {
			ps = append(ps, sized{plugin, n})
		}
	}
	slices.SortFunc(ps, func(a, b sized) int { return cmp.Or(cmp.Compare(a.n, b.n), strings.Compare(a.plugin, b.plugin)) })
	var out map[string]map[string][]byte
	total := 0
	for _, p := range ps {
		if total+p.n > sessionstate.MaxStateBytes {
			break
		}
		total += p.n
		if out == nil {
			out = map[string]map[string][]byte{}
		}
		out[p.plugin] = all[p.plugin]
	}
	return out
}

// record is what the session's record says now.
func (s *Session) record() sessionstate.Record {
	st := s.live.State()
	rec := sessionstate.Record{
		V: sessionstate.Version, Project: s.project, Session: s.id, Provider: s.th.cfg.Sandbox.Provider,
		SandboxID: st.SandboxID, Epoch: epochOf(s.lease), Instance: s.th.instance,
	}
	if cwd, ok := s.tools.PluginState(bashPlugin, bashCwdKey); ok && sessionstate.CheckPath(string(cwd), false) == nil {
		rec.Cwd = string(cwd)
	}
	rec.State = carriedState(s.tools.PluginStates())
	owner := map[string]string{}
	for _, o := range s.tools.OwnedProcesses() {
		owner[o.ID] = o.Plugin
	}
	for _, o := range s.tools.OwnedTerminals() {
		owner[o.ID] = o.Plugin
	}
	// What a reader would refuse is left out (a command past the record's bounds), so
	// the rest is recorded.
	for _, p := range st.Processes {
		rp := sessionstate.Process{ID: p.ID, Plugin: owner[p.ID], Argv: p.Argv, Cwd: p.Cwd, PID: p.PID, Log: p.LogPath}
		if rp.Check() == nil && len(rec.Processes) < sessionstate.MaxProcesses {
			rec.Processes = append(rec.Processes, rp)
		}
	}
	for _, tm := range st.Terminals {
		rt := sessionstate.Terminal{ID: tm.ID, Plugin: owner[tm.ID], Argv: tm.Argv, Cwd: tm.Cwd, Cols: tm.Cols, Rows: tm.Rows}
		if rt.Check() == nil && len(rec.Terminals) < sessionstate.MaxTerminals {
			rec.Terminals = append(rec.Terminals, rt)
		}
	}
	return rec
}

// recorder keeps a session's record: it writes it when it changed, from its own goroutine
// (a change may be noticed under the session's locks), until stopped.
type recorder struct {
	s    *Session
	kick chan struct{}
	stop context.CancelFunc
	done chan struct{}

	wmu     sync.Mutex // held by a flush from reading the session to writing its record
	mu      sync.Mutex
	last    sessionstate.Record
	written bool
	retry   *time.Timer
	said    bool // a record that could not be written was logged
}

func newRecorder(s *Session) *recorder {
	return &recorder{s: s, kick: make(chan struct{}, 1), done: make(chan struct{})}
}

// changed asks for the record to be written if it changed. It never blocks.
func (r *recorder) changed() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// start runs the writer until stop.
func (r *recorder) start() {
	ctx, cancel := context.WithCancel(context.Background())
	r.stop = cancel
	go func() {
		defer close(r.done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-r.kick:
			}
			r.flush(ctx)
		}
	}()
}

// close stops the writer and waits for it.
func (r *recorder) close() {
	if r.stop == nil {
		return
	}
	r.stop()
	<-r.done
	r.mu.Lock()
	if r.retry != nil {
		r.retry.Stop()
	}
	r.mu.Unlock()
}

// flush writes the record if it changed since it was last written. A failed write is
// tried again after recordRetry.
func (r *recorder) flush(ctx context.Context) {
	r.wmu.Lock() // two flushes at once could write an older record over a newer one
	defer r.wmu.Unlock()
	s := r.s
	if s.leaseErr() != nil {
		return // the project is another's now: its record is too
	}
	rec := s.record()
	r.mu.Lock()
	same := r.written && sessionstate.Same(rec, r.last)
	r.mu.Unlock()
	if same {
		return
	}
	rec.WrittenAt = time.Now().UTC()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err := sessionstate.Write(wctx, s.store, rec)
	cancel()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		if !r.said || !errors.Is(err, sessionstate.ErrInvalid) {
			s.log.Warn("the session's record could not be written; a takeover after a crash would start from a stale one", "project", s.project, "err", err)
			r.said = true
		}
		if r.retry != nil {
			r.retry.Stop()
		}
		r.retry = time.AfterFunc(recordRetry, r.changed)
		return
	}
	r.last, r.written = rec, true
}
