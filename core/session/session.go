// Package session keeps a workspace alive across sandboxes. A Session is a sandbox plus a
// project id plus a lifetime policy: it knows when its sandbox ends without asking the
// provider on every call, extends it while the provider allows, and shortly before an end
// it cannot extend it saves a snapshot, creates a new sandbox, restores the snapshot into it
// and carries on. Calls that arrive during a rotation wait and then succeed.
//
// A Session implements sandbox.Sandbox, so the host dispatches tools into it exactly as into
// a plain sandbox.
package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/core/screenshot"
	"github.com/toolhost/toolhost/core/snapshot"
)

// Snapshots is what a session needs of core/snapshot.
type Snapshots interface {
	Save(ctx context.Context, projectID string, pack func(io.Writer) error) (snapshot.Info, error)
	Restore(ctx context.Context, projectID string, extract func(io.Reader) error) (snapshot.Info, error)
}

// Config configures a Session.
type Config struct {
	Provider sandbox.Provider
	// Sandbox is the template for every sandbox the session creates. Leave Workspace empty
	// so that each sandbox gets a fresh one and rotation really moves the work.
	Sandbox   sandbox.CreateOptions
	ProjectID string
	Snapshots Snapshots
	// Excludes are base names left out of snapshots; nil means the archive defaults.
	Excludes []string
	// TTL is the lifetime asked for at creation and at each extension. Default 1h.
	TTL time.Duration
	// KeepaliveMargin: when less than this remains, extend or rotate. Default 5m.
	KeepaliveMargin time.Duration
	// MaxLifetime is the provider's limit on one sandbox's life from its start. Default 24h.
	MaxLifetime time.Duration
	// RefreshInterval bounds how stale the cached end time may get. Default 1m.
	RefreshInterval time.Duration
	// RetryInterval is the wait before trying again after a rotation failed. Default 10s.
	RetryInterval time.Duration
	// RestoreOnRotate makes every rotation restore the snapshot into a fresh sandbox even
	// when the provider could hand the workspace over (sandbox.Handoff): the path a
	// remote provider always takes.
	RestoreOnRotate bool
	// AfterCommit runs after each successful commit.
	AfterCommit func(ctx context.Context, label string, info snapshot.Info)
	// Screenshots, when set, captures the dev server's page on its own (under auto/)
	// when a background process starts listening and after each commit.
	Screenshots *screenshot.Recorder
	Logger      *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.TTL <= 0 {
		c.TTL = time.Hour
	}
	if c.KeepaliveMargin <= 0 {
		c.KeepaliveMargin = 5 * time.Minute
	}
	if c.MaxLifetime <= 0 {
		c.MaxLifetime = 24 * time.Hour
	}
	if c.RefreshInterval <= 0 {
		c.RefreshInterval = time.Minute
	}
	if c.RetryInterval <= 0 {
		c.RetryInterval = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Sandbox.Timeout = c.TTL
	return c
}

// Session is a live workspace. It is safe for concurrent use.
type Session struct {
	cfg Config
	log *slog.Logger

	// mu is held for reading by every call in flight, and for writing while the sandbox is
	// extended or swapped, so a call never runs on a sandbox being torn down.
	mu          sync.RWMutex
	sb          sandbox.Sandbox
	endsAt      time.Time // cached; refreshed at most every RefreshInterval
	refreshedAt time.Time
	retryAt     time.Time // after a failed rotation, when to try again
	rotations   int
	closed      bool
	devPort     int // the dev server last seen listening

	loopCtx context.Context // lives until Close: background work of the session
	stop    context.CancelFunc
	wg      sync.WaitGroup // the keepalive loop and closes of rotated-out sandboxes
}

// Errors callers may branch on.
var ErrClosed = errors.New("session is closed")

// Open creates a sandbox for the project and, when the project has a snapshot, restores
// the newest good one into it ("wake"). It starts the keepalive loop.
func Open(ctx context.Context, cfg Config) (*Session, error) {
	cfg = cfg.withDefaults()
	if cfg.Provider == nil || cfg.Snapshots == nil || cfg.ProjectID == "" {
		return nil, errors.New("session: Provider, Snapshots and ProjectID are required")
	}
	s := &Session{cfg: cfg, log: cfg.Logger.With("project", cfg.ProjectID)}
	sb, err := s.createRestored(ctx, "wake")
	if err != nil {
		return nil, err
	}
	s.sb = sb
	s.noteEnd(sb.EndsAt())
	s.loopCtx, s.stop = context.WithCancel(context.WithoutCancel(ctx))
	s.wg.Go(func() { s.keepalive(s.loopCtx) })
	return s, nil
}

// createRestored creates a sandbox and restores the project's newest good snapshot into
// it; a project without snapshots starts empty.
func (s *Session) createRestored(ctx context.Context, why string) (sandbox.Sandbox, error) {
	start := time.Now()
	sb, err := s.cfg.Provider.Create(ctx, s.cfg.Sandbox)
	if err != nil {
		return nil, fmt.Errorf("create sandbox: %w", err)
	}
	created := time.Since(start)
	info, err := s.cfg.Snapshots.Restore(ctx, s.cfg.ProjectID, func(r io.Reader) error {
		return sb.Extract(ctx, r)
	})
	switch {
	case errors.Is(err, snapshot.ErrNoSnapshot):
		s.log.Info("session: no snapshot to restore; starting empty", "why", why, "sandbox", sb.ID(), "create", created)
	case err != nil:
		sb.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("restore project %s: %w", s.cfg.ProjectID, err)
	default:
		s.log.Info("session: restored", "why", why, "sandbox", sb.ID(), "snapshot", info.Key,
			"create", created, "total", time.Since(start))
	}
	return sb, nil
}

func (s *Session) noteEnd(t time.Time) {
	s.endsAt, s.refreshedAt = t, time.Now()
}

// keepalive wakes before the margin of the cached end time (and at least every refresh
// interval) to extend or rotate even when no call comes in.
func (s *Session) keepalive(ctx context.Context) {
	for {
		s.mu.RLock()
		wait := min(time.Until(s.endsAt)-s.cfg.KeepaliveMargin, s.cfg.RefreshInterval)
		if r := time.Until(s.retryAt); wait < r && !s.retryAt.IsZero() && r > 0 {
			wait = r
		}
		s.mu.RUnlock()
		t := time.NewTimer(max(wait, 10*time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		s.maintain(ctx, false)
	}
}

// current returns the sandbox for a call, holding the read lock until release is called.
// It extends or rotates first when the end is near.
func (s *Session) current(ctx context.Context) (sandbox.Sandbox, func(), error) {
	for range 3 {
		s.mu.RLock()
		if s.closed {
			s.mu.RUnlock()
			return nil, nil, ErrClosed
		}
		if !s.needsCare(time.Now()) {
			return s.sb, s.mu.RUnlock, nil
		}
		s.mu.RUnlock()
		s.maintain(ctx, false)
	}
	// Maintenance could not make room (say, a failed save); run on what we have.
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return nil, nil, ErrClosed
	}
	return s.sb, s.mu.RUnlock, nil
}

func (s *Session) needsCare(now time.Time) bool {
	if now.Before(s.retryAt) {
		return false
	}
	return s.endsAt.Sub(now) < s.cfg.KeepaliveMargin || now.Sub(s.refreshedAt) > s.cfg.RefreshInterval
}

// maintain refreshes the cached end time, then extends the sandbox or rotates it. trouble
// means a call just failed as if the sandbox were gone.
func (s *Session) maintain(ctx context.Context, trouble bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	now := time.Now()
	if !trouble && !s.needsCare(now) {
		return // another caller did it while we waited for the lock
	}
	s.noteEnd(s.sb.EndsAt())
	dead := !now.Before(s.endsAt)
	if trouble && !dead {
		// A call failed as if the sandbox were gone before its end: ask it.
		_, err := s.sb.Stat(ctx, sandbox.WorkspaceRoot)
		dead = errors.Is(err, sandbox.ErrClosed)
	}
	if !dead && s.endsAt.Sub(now) >= s.cfg.KeepaliveMargin {
		return
	}
	if dead {
		s.recoverDead(ctx)
		return
	}
	maxEnd := s.sb.StartedAt().Add(s.cfg.MaxLifetime)
	want := now.Add(s.cfg.TTL)
	if want.After(maxEnd) {
		want = maxEnd
	}
	if want.Sub(now) > s.cfg.KeepaliveMargin {
		if err := s.sb.SetTimeout(ctx, want.Sub(now)); err == nil {
			s.log.Info("session: extended sandbox", "sandbox", s.sb.ID(), "ends", want.UTC().Format(time.RFC3339))
			s.noteEnd(s.sb.EndsAt())
			return
		} else {
			s.log.Warn("session: extend failed; rotating", "sandbox", s.sb.ID(), "err", err)
		}
	}
	s.rotate(ctx)
}

// rotate saves, creates, restores and swaps. Called with mu held for writing. If the save
// fails it keeps the old sandbox, which still holds the only copy, and tries again later.
func (s *Session) rotate(ctx context.Context) {
	start := time.Now()
	old := s.sb
	info, err := s.save(ctx, "rotation")
	if err != nil {
		s.retryAt = time.Now().Add(s.cfg.RetryInterval)
		s.log.Error("session: rotation postponed: snapshot failed, keeping the sandbox that holds the only copy",
			"sandbox", old.ID(), "err", err)
		return
	}
	saved := time.Since(start)
	next, how, err := s.replace(ctx, old)
	if err != nil {
		s.retryAt = time.Now().Add(s.cfg.RetryInterval)
		s.log.Error("session: rotation postponed: new sandbox not ready", "err", err)
		return
	}
	s.sb = next
	s.noteEnd(next.EndsAt())
	s.retryAt = time.Time{}
	s.rotations++
	s.log.Info("session: rotated", "from", old.ID(), "to", next.ID(), "how", how, "snapshot", info.Key,
		"save", saved, "pause", time.Since(start), "rotations", s.rotations)
}

// replace makes the sandbox that follows old, once old's snapshot is saved: by handing
// old's workspace over when the provider can (no copy), else by restoring the snapshot
// into a fresh sandbox. A failed handoff falls back to the restore.
func (s *Session) replace(ctx context.Context, old sandbox.Sandbox) (sandbox.Sandbox, string, error) {
	if h, ok := s.cfg.Provider.(sandbox.Handoff); ok && !s.cfg.RestoreOnRotate {
		next, err := h.Handoff(ctx, old, s.cfg.Sandbox)
		if err == nil {
			return next, "handoff", nil
		}
		s.log.Warn("session: handoff failed; restoring the snapshot instead", "sandbox", old.ID(), "err", err)
	}
	next, err := s.createRestored(ctx, "rotation")
	if err != nil {
		return nil, "", err
	}
	s.wg.Go(func() { old.Close(context.WithoutCancel(ctx)) })
	return next, "restore", nil
}

// Rotate moves the workspace to a fresh sandbox now: save, create, restore, swap. Calls
// made meanwhile wait and then run on the new sandbox. If the save fails, the old sandbox
// stays and the error says why.
func (s *Session) Rotate(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	before := s.rotations
	s.rotate(ctx)
	if s.rotations == before {
		return errors.New("session: rotation failed; the current sandbox stays (see the log)")
	}
	return nil
}

// recoverDead replaces a sandbox that died (or stopped answering) before it could be
// saved. A provider whose workspaces outlive their sandboxes hands the workspace over and
// nothing is lost; otherwise the newest snapshot is restored, work since it is lost, and
// the log says so.
func (s *Session) recoverDead(ctx context.Context) {
	old := s.sb
	if h, ok := s.cfg.Provider.(sandbox.Handoff); ok && !s.cfg.RestoreOnRotate {
		next, err := h.Handoff(ctx, old, s.cfg.Sandbox)
		if err == nil {
			s.log.Warn("session: sandbox ended on its own; its workspace was handed to a new one, nothing lost",
				"from", old.ID(), "to", next.ID())
			s.sb = next
			s.noteEnd(next.EndsAt())
			s.retryAt = time.Time{}
			return
		}
		s.log.Warn("session: handoff of an ended sandbox failed; restoring the newest snapshot", "sandbox", old.ID(), "err", err)
	}
	next, err := s.createRestored(ctx, "recover")
	if err != nil {
		s.retryAt = time.Now().Add(s.cfg.RetryInterval)
		s.log.Error("session: sandbox is gone and a new one could not be made", "sandbox", old.ID(), "err", err)
		return
	}
	s.log.Error("session: sandbox ended before it was saved; restored the newest snapshot",
		"from", old.ID(), "to", next.ID())
	s.sb = next
	s.noteEnd(next.EndsAt())
	s.wg.Go(func() { old.Close(context.WithoutCancel(ctx)) })
}

func (s *Session) save(ctx context.Context, label string) (snapshot.Info, error) {
	sb := s.sb
	start := time.Now()
	info, err := s.cfg.Snapshots.Save(ctx, s.cfg.ProjectID, func(w io.Writer) error {
		return sb.Archive(ctx, w, s.cfg.Excludes)
	})
	if err != nil {
		s.log.Error("session: snapshot failed", "label", label, "sandbox", sb.ID(), "took", time.Since(start), "err", err)
		return info, err
	}
	s.log.Info("session: snapshot saved", "label", label, "sandbox", sb.ID(), "key", info.Key, "took", time.Since(start))
	return info, nil
}

// Commit saves a snapshot of the workspace (a phase commit). A failed save returns an
// error and leaves the session working; the next commit tries again.
func (s *Session) Commit(ctx context.Context, label string) (snapshot.Info, error) {
	_, release, err := s.current(ctx)
	if err != nil {
		return snapshot.Info{}, err
	}
	info, err := s.save(ctx, label)
	if port := s.devPort; err == nil && port != 0 && s.cfg.Screenshots != nil && !s.closed {
		// The agent does not wait for a browser it did not ask for. Launched under the
		// read lock, so Close cannot be waiting yet.
		s.wg.Go(func() { s.autoCapture(s.loopCtx, port, "commit "+label) })
	}
	release()
	if err != nil {
		return info, err
	}
	if s.cfg.AfterCommit != nil {
		s.cfg.AfterCommit(ctx, label, info)
	}
	return info, nil
}

// Rotations reports how many times the session moved to a new sandbox.
func (s *Session) Rotations() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.rotations
}

// Close stops the keepalive loop and closes the current sandbox. It does not save: call
// Commit first to keep the work.
func (s *Session) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	sb := s.sb
	s.mu.Unlock()
	s.stop()
	err := sb.Close(ctx)
	s.wg.Wait()
	return err
}
