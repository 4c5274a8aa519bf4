package toolhost

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/core/screenshot"
	"github.com/toolhost/toolhost/core/session"
	"github.com/toolhost/toolhost/core/snapshot"
	"github.com/toolhost/toolhost/host"
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
}

// Session is a project's live workspace with the tools bound to it. Tools dispatched
// through it act in a sandbox that the session keeps alive, replaces before it expires
// (the work moves with it) and saves on Commit. It is safe for concurrent use.
type Session struct {
	th      *Toolhost
	project string
	live    *session.Session
	tools   *host.Session
	wake    *wakeRecorder
}

// Open opens a session: a new sandbox from the provider, into which the project's newest
// snapshot that verifies is restored (unless opts.Workspace names a host directory).
func (t *Toolhost) Open(ctx context.Context, opts SessionOptions) (*Session, error) {
	cfg := &t.cfg
	project := opts.Project
	if project == "" {
		project = cfg.Project
	}
	if err := snapshot.ValidProjectID(project); err != nil {
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
	log := opts.Logger
	if log == nil {
		log = t.opts.log
	}
	wake := &wakeRecorder{snaps: t.storage.snaps, hostDir: ws != ""}
	live, err := session.Open(ctx, session.Config{
		Provider:        prov,
		Sandbox:         sandbox.CreateOptions{Workspace: ws, Network: cfg.Sandbox.Network},
		ProjectID:       project,
		Snapshots:       wake,
		Excludes:        cfg.Snapshot.Excludes,
		TTL:             ttl,
		KeepaliveMargin: cfg.Session.KeepaliveMargin,
		LastCallMargin:  cfg.Session.LastCallMargin,
		MaxLifetime:     maxLife,
		Screenshots:     t.rec,
		Logger:          log,
	})
	if err != nil {
		return nil, fmt.Errorf("opening a session for project %s: %w%s", project, err, bwrapHint())
	}
	tools := t.host.OpenSession(live, host.WithProject(project), host.WithDefaultPort(cfg.Screenshot.Port))
	return &Session{th: t, project: project, live: live, tools: tools, wake: wake}, nil
}

// Project is the session's project.
func (s *Session) Project() string { return s.project }

// Tools returns the tool definitions to send to the model (those of the Toolhost).
func (s *Session) Tools() []abi.Tool { return s.th.Tools() }

// Dispatch runs one tool call: a tool_use block's name and input in, a tool_result's
// content and is_error out. A tool's own failure is a Result with IsError set and a nil
// error; an error means the host could not run the tool, and the Result still holds an
// is_error text to send back.
func (s *Session) Dispatch(ctx context.Context, tool string, input json.RawMessage) (abi.Result, error) {
	return s.tools.Dispatch(ctx, tool, input)
}

// Commit saves a snapshot of the workspace (a phase commit) and, when a dev server runs,
// has its page captured on its own afterwards (under auto/).
func (s *Session) Commit(ctx context.Context, label string) (snapshot.Info, error) {
	return s.live.Commit(ctx, label)
}

// Screenshots lists the project's stored screenshots of one kind (screenshot.KindAgent:
// those take_screenshot took; screenshot.KindAuto: those the session took on its own; ""
// for both), newest first.
func (s *Session) Screenshots(ctx context.Context, kind string) ([]screenshot.Stored, error) {
	return s.th.storage.Screenshots(ctx, s.project, kind)
}

// Woke reports the snapshot the session's first sandbox was restored from; false when it
// started empty (a new project, or a host directory as the workspace).
func (s *Session) Woke() (snapshot.Info, bool) { return s.wake.first() }

// Sandbox is the session's sandbox: a core/session.Session, which outlives the sandboxes
// it rotates through (its Rotations, SandboxID, Archive, ReadFile...).
func (s *Session) Sandbox() *session.Session { return s.live }

// Close ends the session and its sandbox without saving (Commit first to keep the work),
// waiting for the sandbox to stop at most until ctx ends.
func (s *Session) Close(ctx context.Context) error {
	return s.live.Close(ctx)
}

// wakeRecorder is the session's snapshot manager: it remembers the snapshot a wake
// restored, and restores nothing into a host directory (the directory is the state;
// saves go to the project as usual).
type wakeRecorder struct {
	snaps   *snapshot.Manager
	hostDir bool

	mu    sync.Mutex
	woke  snapshot.Info
	wokeN int
}

func (w *wakeRecorder) Save(ctx context.Context, project string, pack func(io.Writer) error) (snapshot.Info, error) {
	return w.snaps.Save(ctx, project, pack)
}

func (w *wakeRecorder) Restore(ctx context.Context, project string, extract func(io.Reader) error) (snapshot.Info, error) {
	if w.hostDir {
		return snapshot.Info{}, fmt.Errorf("the workspace is a host directory: %w", snapshot.ErrNoSnapshot)
	}
	in, err := w.snaps.Restore(ctx, project, extract)
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
