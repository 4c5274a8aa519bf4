// Package session keeps a workspace alive across sandboxes. A Session is a sandbox plus a
// project id plus a lifetime policy: it knows when its sandbox ends without asking the
// provider on every call, extends it while the provider allows, and shortly before an end
// it cannot extend it rotates: saves a snapshot, moves the work to a new sandbox (handing
// the workspace over where the provider can, else restoring the snapshot), restarts the
// background processes that were running and carries on. Calls that arrive during a
// rotation wait and then succeed; the next tool result says which processes were
// restarted (Notice). No call meets a sandbox that has ended under it: docs/SNAPSHOTS.md
// ("Calls during a rotation") goes through every window and what closes it.
//
// A session cannot run out of time with unsaved work. While a rotation's save fails the
// session keeps the sandbox (it holds the only copy) and tries again; when its end is
// LastCallMargin away it rotates all the same with the best snapshot it can make: the
// workspace itself where it can be handed over, else an archive packed to a local file
// that the store would not take, which is restored into the new sandbox and kept until a
// save to the store succeeds. It says so loudly (error-level logs).
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
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/archive"
	"github.com/toolhost/toolhost/internal/snapshot"
	"github.com/toolhost/toolhost/internal/tree"
)

// Snapshots is what a session needs of internal/snapshot. A save is labelled (a commit's
// label, "rotation"); a restore may call its target's Extract more than once (a snapshot
// refused half way is skipped for an older one), each call getting a fresh sandbox, and
// checks the restored workspace with its List.
type Snapshots interface {
	SaveLabeled(ctx context.Context, projectID, label string, pack func(io.Writer) error) (snapshot.Info, error)
	// SaveTree saves a workspace its sandbox's agent lists and reads (a save that reads
	// only what changed).
	SaveTree(ctx context.Context, projectID, label string, src tree.Source, excludes []string) (snapshot.Info, error)
	RestoreTo(ctx context.Context, projectID string, t snapshot.Target) (snapshot.Info, error)
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
	// LastCallMargin: when this little remains before an end the session cannot extend
	// and its saves still fail, it rotates anyway with the best snapshot it can make (see
	// the package doc). Default KeepaliveMargin/2; at most KeepaliveMargin.
	LastCallMargin time.Duration
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
	// when a background process starts listening, after each commit and after a
	// rotation restarted it.
	Screenshots AutoCapturer
	// Clock is the session's time; nil means SystemClock(). Tests inject a fake.
	Clock Clock
	// TempDir holds the local copy of a snapshot a rotation makes when it has to restore
	// (so the work survives a store that is down); empty means os.TempDir().
	TempDir string
	// Takeover, when set, is what an earlier session of the project left when its process
	// stopped without closing it: Open reconnects to its sandbox when it can, and else
	// wakes from the last snapshot and tells the agent what was lost (takeover.go).
	Takeover *Takeover
	// Orphans, when set, names the sandboxes of the project an earlier holder left
	// running, for the session to kill once it runs.
	Orphans *Orphans
	// OnChange is called whenever State may say something new (a sandbox created,
	// replaced or reconnected; a background process or terminal started or ended). It
	// may be called with the session's locks held: it must only signal, never block or
	// call the session.
	OnChange func()
	// Autosave, when positive, commits the workspace that often (label AutosaveLabel):
	// the most a death of this process can lose. Zero: only the caller's commits.
	Autosave time.Duration
	Logger   *slog.Logger
	// Fence, when set, says why the session may no longer act on its project, or nil: the
	// project's lease was lost, and another host may hold the project now. Once it
	// answers an error, every sandbox operation of the session fails with it (Unwrap
	// hands out no sandbox either), and the session neither extends, saves, rotates,
	// recovers nor restores: nothing it does can touch what another holder may use.
	// Close still closes its sandbox, and keeps a snapshot only this host holds on disk.
	Fence func() error
}

func (c Config) withDefaults() Config {
	if c.TTL <= 0 {
		c.TTL = time.Hour
	}
	if c.KeepaliveMargin <= 0 {
		c.KeepaliveMargin = 5 * time.Minute
	}
	if c.LastCallMargin <= 0 || c.LastCallMargin > c.KeepaliveMargin {
		c.LastCallMargin = c.KeepaliveMargin / 2
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
	if c.Clock == nil {
		c.Clock = SystemClock()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Sandbox.Timeout = c.TTL
	return c
}

// Workspace is a live workspace: a project's sandbox, its lifetime and its snapshots
// (the root package's Session wraps one). It is safe for concurrent use.
type Workspace struct {
	cfg   Config
	log   *slog.Logger
	clock Clock

	// mu is held for reading by every call in flight, and for writing while the sandbox is
	// extended or swapped, so a call never runs on a sandbox being torn down.
	mu          sync.RWMutex
	sb          sandbox.Sandbox
	endsAt      time.Time // cached; refreshed at most every RefreshInterval
	refreshedAt time.Time
	retryAt     time.Time // after a failed rotation, when to try again
	rotations   int
	closed      bool
	// rotating: a rotation is saving ahead of its handoff (saveAhead) with mu released;
	// the calls that will be done before its last call go on meanwhile instead of waiting
	// for the save. Any other call waits for moved, closed once the rotation holds mu again
	// to swap the sandbox (current).
	rotating bool
	moved    chan struct{}
	// rotMu is held for a whole rotation, the save ahead included, so that two never
	// overlap (Rotate takes it before mu; maintain, holding mu, only tries it).
	rotMu   sync.Mutex
	devPort int // the dev server last seen listening
	// life is what the sandbox had left when the session took it: what a new sandbox
	// would have, the provider's own limits included (outlasts).
	life time.Duration

	bg bgState // background processes to carry over (processes.go)

	tookOver bool // Open reconnected to the sandbox of Config.Takeover

	// local is the newest snapshot, when only this host has it: a last-call rotation
	// packed it but the store would not take it. Guarded by localMu.
	localMu sync.Mutex
	local   *localArchive

	loopCtx context.Context // lives until Close: background work of the session
	stop    context.CancelFunc
	wg      sync.WaitGroup // owned by Close: the keepalive loop, watchers, closes of old sandboxes
}

// Errors callers may branch on.
var ErrClosed = errors.New("session is closed")

// fenced is Config.Fence's answer: why the session may no longer act, or nil.
func (s *Workspace) fenced() error {
	if s.cfg.Fence == nil {
		return nil
	}
	return s.cfg.Fence()
}

// Open creates a sandbox for the project and, when the project has a snapshot, restores
// the newest good one into it ("wake"). It starts the keepalive loop.
func Open(ctx context.Context, cfg Config) (*Workspace, error) {
	cfg = cfg.withDefaults()
	if cfg.Provider == nil || cfg.Snapshots == nil || cfg.ProjectID == "" {
		return nil, errors.New("session: Provider, Snapshots and ProjectID are required")
	}
	s := &Workspace{cfg: cfg, log: cfg.Logger.With("project", cfg.ProjectID), clock: cfg.Clock}
	var (
		sb    sandbox.Sandbox
		why   string
		spare bool
	)
	if t := cfg.Takeover; t != nil {
		var err error
		if sb, why, spare, err = s.takeOver(ctx, t); err != nil {
			return nil, fmt.Errorf("take over project %s: %w", cfg.ProjectID, err)
		}
		if sb != nil {
			s.tookOver = true
			s.log.Warn("session: took over the sandbox of an earlier session that stopped without closing",
				"sandbox", sb.ID(), "recorded_by", t.Who, "recorded", t.When.UTC().Format(time.RFC3339))
			s.adoptRecorded(ctx, sb, t)
		}
	}
	if sb == nil {
		var info snapshot.Info
		var err error
		if sb, info, err = s.createRestored(ctx, "wake"); err != nil {
			return nil, err
		}
		if t := cfg.Takeover; t != nil {
			s.log.Error("session: an earlier session of the project stopped without closing and its sandbox could not be taken over; woke from the last snapshot: work since it is lost",
				"why", why, "recorded_sandbox", t.SandboxID, "recorded_by", t.Who, "recorded", t.When.UTC().Format(time.RFC3339),
				"snapshot", info.Key, "lost_processes", len(t.Processes)+len(t.Terminals))
			s.noticeLost(t, why, info, info.Key != "")
		}
	}
	s.use(sb)
	s.loopCtx, s.stop = context.WithCancel(context.WithoutCancel(ctx))
	s.wg.Go(func() { s.keepalive(s.loopCtx) })
	if cfg.Autosave > 0 {
		s.wg.Go(func() { s.autosave(s.loopCtx) })
	}
	if o := cfg.Orphans; o != nil && o.Orphan != nil && !spare {
		s.wg.Go(func() { s.sweep(s.loopCtx, o) })
	}
	s.changed()
	return s, nil
}

// createRestored creates a sandbox and restores the project's newest snapshot that
// restores into it (a tar.gz snapshot of an older version is converted to chunked on the
// way, while the session may write: snapshot.Target.Convert); a project without snapshots
// starts empty. A snapshot refused half way
// leaves a sandbox that is thrown away: the next one is extracted into a fresh sandbox.
func (s *Workspace) createRestored(ctx context.Context, why string) (sandbox.Sandbox, snapshot.Info, error) {
	if err := s.fenced(); err != nil {
		return nil, snapshot.Info{}, err
	}
	start := time.Now()
	sb, err := s.cfg.Provider.Create(ctx, s.cfg.Sandbox)
	if err != nil {
		return nil, snapshot.Info{}, fmt.Errorf("create sandbox: %w", err)
	}
	created := time.Since(start)
	tries := 0
	info, err := s.cfg.Snapshots.RestoreTo(ctx, s.cfg.ProjectID, snapshot.Target{Extract: func(r io.Reader) error {
		if tries++; tries > 1 {
			s.closeLater(ctx, sb)
			fresh, err := s.cfg.Provider.Create(ctx, s.cfg.Sandbox)
			if err != nil {
				return fmt.Errorf("create sandbox: %w", err)
			}
			sb = fresh
		}
		return sb.Extract(ctx, r)
	}, List: func(ctx context.Context) ([]snapshot.WorkspaceEntry, error) {
		return s.listWorkspace(ctx, sb)
	}, Convert: s.fenced}) // a tar.gz snapshot of an older version becomes chunked, while the session may write
	switch {
	case errors.Is(err, snapshot.ErrNoSnapshot):
		s.log.Info("session: no snapshot to restore; starting empty", "why", why, "sandbox", sb.ID(), "create", created)
		info = snapshot.Info{}
	case err != nil:
		sb.Close(context.WithoutCancel(ctx))
		return nil, snapshot.Info{}, fmt.Errorf("restore project %s: %w", s.cfg.ProjectID, err)
	default:
		if len(info.Refused) > 0 {
			s.log.Error("session: restored an older snapshot: the newer ones were refused", "why", why,
				"snapshot", info.Key, "refused", len(info.Refused), "first_refused", info.Refused[0].Key, "reason", info.Refused[0].Reason,
				"set_aside", info.Refused[0].Quarantine)
		}
		s.log.Info("session: restored", "why", why, "sandbox", sb.ID(), "snapshot", info.Key,
			"converted", info.Converted, "create", created, "total", time.Since(start))
	}
	return sb, info, nil
}

// closeLater closes a sandbox the session no longer uses, off the caller's path.
func (s *Workspace) closeLater(ctx context.Context, sb sandbox.Sandbox) {
	s.wg.Go(func() { sb.Close(context.WithoutCancel(ctx)) })
}

// use makes sb the session's sandbox (with mu held for writing, or before Open returns).
func (s *Workspace) use(sb sandbox.Sandbox) {
	s.sb = sb
	s.noteEnd(sb.EndsAt())
	s.life = s.endsAt.Sub(s.clock.Now())
}

func (s *Workspace) noteEnd(t time.Time) {
	s.endsAt, s.refreshedAt = t, s.clock.Now()
}

// keepalive wakes before the margin of the cached end time (and at least every refresh
// interval, and at the last call) to extend or rotate even when no call comes in; and it
// offers the store a snapshot only this host holds until the store takes it.
func (s *Workspace) keepalive(ctx context.Context) {
	wake := make(chan struct{}, 1)
	for {
		s.mu.RLock()
		now := s.clock.Now()
		wait := min(s.endsAt.Sub(now)-s.cfg.KeepaliveMargin, s.cfg.RefreshInterval)
		if r := s.retryAt.Sub(now); r > 0 && wait < r {
			wait = r
		}
		s.mu.RUnlock()
		t := s.clock.AfterFunc(max(wait, 10*time.Millisecond), func() {
			select {
			case wake <- struct{}{}:
			default:
			}
		})
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-wake:
		}
		if err := s.fenced(); err != nil {
			// For good (a lost lease stays lost): no more maintenance.
			s.log.Warn("session: fenced off: no more maintenance; its sandbox is left alone until the session closes", "err", err)
			<-ctx.Done()
			return
		}
		s.maintain(ctx, false, 0)
		s.flushLocal(ctx)
	}
}

// current returns the sandbox for a call, holding the read lock until release is called.
// need is how long the call may run (a command's bound; 0 for a call that does not wait
// on anything the sandbox runs). It extends or rotates first when the end is near, or when
// the call would still run at the sandbox's last call and a new sandbox would hold it.
//
// While a rotation saves ahead of its handoff (saveAhead), the old sandbox is given only
// to a call that will be done before the rotation's last call, by which the rotation
// takes the sandbox from the calls: the handoff then waits for no call, and no call runs
// into the end of a sandbox that is being left. Any other call waits for the swap and
// runs on the new sandbox.
func (s *Workspace) current(ctx context.Context, need time.Duration) (sandbox.Sandbox, func(), error) {
	for tries := 0; ; {
		s.mu.RLock()
		if s.closed {
			s.mu.RUnlock()
			return nil, nil, ErrClosed
		}
		if err := s.fenced(); err != nil {
			s.mu.RUnlock()
			return nil, nil, err
		}
		now := s.clock.Now()
		if s.rotating {
			if now.Add(need).Before(s.lastCall()) {
				return s.sb, s.mu.RUnlock, nil
			}
			moved := s.moved
			s.mu.RUnlock()
			if err := await(ctx, moved); err != nil {
				return nil, nil, err
			}
			continue
		}
		// After three tries maintenance could not make room (say, a failed save): run on
		// what we have.
		if tries == 3 || !s.needsCare(now, need) {
			return s.sb, s.mu.RUnlock, nil
		}
		s.mu.RUnlock()
		s.maintain(ctx, false, need)
		tries++
	}
}

// await waits until ch is closed or ctx ends.
func await(ctx context.Context, ch <-chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// needsCare: the cached end is stale, or the sandbox must be extended or replaced before
// the call (need, as for current) runs. Not called during a save ahead (current, maintain).
func (s *Workspace) needsCare(now time.Time, need time.Duration) bool {
	if now.Sub(s.refreshedAt) > s.cfg.RefreshInterval {
		return true
	}
	if now.Before(s.retryAt) {
		return false
	}
	return s.endsAt.Sub(now) < s.cfg.KeepaliveMargin || s.outlasts(now, need)
}

// outlasts: a call that may run need from now would still run at the sandbox's last call,
// past which the session can no longer wait for it, and a new sandbox would hold it (one
// that no sandbox holds runs where it is: moving would gain nothing).
func (s *Workspace) outlasts(now time.Time, need time.Duration) bool {
	return need > 0 && need < s.life-s.cfg.KeepaliveMargin && now.Add(need).After(s.lastCall())
}

// maintain refreshes the cached end time, then extends the sandbox or rotates it. trouble
// means a call just failed as if the sandbox were gone; need is the coming call's (current).
func (s *Workspace) maintain(ctx context.Context, trouble bool, need time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.rotating || s.fenced() != nil {
		return
	}
	now := s.clock.Now()
	if !trouble && !s.needsCare(now, need) {
		return // another caller did it while we waited for the lock
	}
	s.noteEnd(s.sb.EndsAt())
	dead := !now.Before(s.endsAt)
	if trouble && !dead {
		// A call failed as if the sandbox were gone before its end: ask it.
		_, err := s.sb.Stat(ctx, sandbox.WorkspaceRoot)
		dead = errors.Is(err, sandbox.ErrClosed)
	}
	left := s.endsAt.Sub(now)
	if !dead && left >= s.cfg.KeepaliveMargin && !s.outlasts(now, need) {
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
	// An extension that would still leave the call running at the last call is no use.
	if want.Sub(now) > s.cfg.KeepaliveMargin && !now.Add(need).After(want.Add(-s.cfg.LastCallMargin)) {
		if err := s.sb.SetTimeout(ctx, want.Sub(now)); err == nil {
			s.log.Info("session: extended sandbox", "sandbox", s.sb.ID(), "ends", want.UTC().Format(time.RFC3339))
			s.noteEnd(s.sb.EndsAt())
			return
		} else {
			s.log.Warn("session: extend failed; rotating", "sandbox", s.sb.ID(), "err", err)
		}
	}
	force := left <= s.cfg.LastCallMargin
	if now.Before(s.retryAt) && !force {
		return
	}
	if !s.rotMu.TryLock() {
		return // a Rotate is under way
	}
	defer s.rotMu.Unlock()
	s.rotate(ctx, force, s.saveAhead(ctx, force))
}

// warmer is a provider that keeps sandboxes started ahead of need per configuration (the
// local provider's pool): Unwarm ends those of a configuration no one will ask for again.
type warmer interface {
	Unwarm(sandbox.CreateOptions)
}

// ahead is a snapshot saved ahead of a handoff, while calls went on.
type ahead struct {
	sb    sandbox.Sandbox // the sandbox it was taken of
	info  snapshot.Info
	err   error
	ports []int // the ports its servers listened on, for the restarted ones to be awaited
}

// saveAhead saves the workspace for a rotation that will hand the workspace itself over,
// with mu released for the save: the snapshot is then a checkpoint, not what carries the
// work (the workspace moves as it is, with whatever the calls made meanwhile), so the calls
// need not wait for it; the pause they see is the handoff (with a provider's spare, the
// attach of the workspace) and the restart of background processes. Called with mu held
// for writing, which it holds again when it returns; nil when the rotation will not hand
// over (it restores, so it must save what the calls left last) or it is the last call.
func (s *Workspace) saveAhead(ctx context.Context, force bool) *ahead {
	old := s.sb
	if force || !s.canHandoff(old) {
		return nil
	}
	s.rotating = true
	moved := make(chan struct{})
	s.moved = moved
	s.mu.Unlock()
	a := &ahead{sb: old}
	func() {
		s.mu.RLock()
		defer s.mu.RUnlock()
		// The save gets the time until the last call; what is left over is the move's.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(s.lastCall().Sub(s.clock.Now()), time.Second))
		defer cancel()
		a.info, _, a.err = s.save(sctx, "rotation", false)
		a.ports, _ = s.listeningOn(ctx, old)
	}()
	s.mu.Lock()
	s.rotating = false
	close(moved) // the calls waiting for the swap now wait for mu, which the swap holds
	return a
}

// lastCall is when the session rotates whatever its saves do.
func (s *Workspace) lastCall() time.Time { return s.endsAt.Add(-s.cfg.LastCallMargin) }

// canHandoff: the provider can start the next sandbox over sb's workspace. The provider
// that made sb decides (sandbox.CanHandoff): in a chain ("e2b,local") a local sandbox can
// be handed over, an E2B one cannot, and its rotation restores a snapshot.
func (s *Workspace) canHandoff(sb sandbox.Sandbox) bool {
	return !s.cfg.RestoreOnRotate && sandbox.CanHandoff(s.cfg.Provider, sb)
}

// rotate saves, replaces the sandbox and restarts its background processes. Called with mu
// held for writing. If the save fails it keeps the old sandbox, which holds the only copy,
// and tries again later; at the last call (force) it rotates all the same with the best
// snapshot it has: the workspace itself by handoff, or the archive the store would not
// take, restored from a local file.
func (s *Workspace) rotate(ctx context.Context, force bool, pre *ahead) {
	s.rotateFor(ctx, force, pre, false)
}

// rotateFor is rotate; stuck says the old sandbox could no longer start commands
// (replaceIfStuck): what it ran then is not started again on the new one, since a
// background process is the likeliest thing to have used its processes up, and the
// agent is told which were left behind.
func (s *Workspace) rotateFor(ctx context.Context, force bool, pre *ahead, stuck bool) {
	if s.closed { // closed while a save ahead ran
		return
	}
	if err := s.fenced(); err != nil {
		s.log.Warn("session: rotation dropped: the session may no longer act on the project", "sandbox", s.sb.ID(), "err", err)
		return
	}
	start := time.Now()
	old := s.sb
	// The rotation belongs to the session, not to the call that ran into it.
	ctx = context.WithoutCancel(ctx)
	running := s.runningProcs(ctx, old)
	terms := s.runningTerms(ctx, old)
	var left []string
	if stuck {
		for _, p := range running {
			left = append(left, fmt.Sprintf("- %s: %s", p.tag, display(p.argv)))
		}
		for _, t := range terms {
			left = append(left, fmt.Sprintf("- %s (interactive): %s", t.req.Tag, display(t.req.Argv)))
		}
		s.bg.mu.Lock()
		s.bg.procs, s.bg.terms = nil, nil
		s.bg.mu.Unlock()
		running, terms = nil, nil
	}
	handoff := s.canHandoff(old)
	fresh := pre != nil && pre.sb == old && handoff // saved ahead, of this very sandbox
	var ports []int
	if fresh {
		ports = pre.ports
	} else {
		ports, _ = s.listeningOn(ctx, old)
	}

	// Leave the save time to finish before the last call, or (at the last call) half of
	// what remains, so the move itself still fits before the end.
	budget := s.lastCall().Sub(s.clock.Now())
	if force {
		budget = max(s.endsAt.Sub(s.clock.Now())/2, time.Second)
	}
	var (
		info  snapshot.Info
		local *localArchive
		err   error
		saved time.Duration
	)
	if fresh {
		info, err = pre.info, pre.err // saved while the calls went on
	} else {
		sctx, cancel := context.WithTimeout(ctx, max(budget, time.Second))
		info, local, err = s.save(sctx, "rotation", !handoff)
		cancel()
		saved = time.Since(start)
	}
	if err != nil {
		if !force {
			s.retryAt = minTime(s.clock.Now().Add(s.cfg.RetryInterval), s.lastCall())
			s.log.Error("session: rotation postponed: snapshot failed, keeping the sandbox that holds the only copy",
				"sandbox", old.ID(), "ends", s.endsAt.UTC().Format(time.RFC3339), "last_call", s.lastCall().UTC().Format(time.RFC3339), "err", err)
			local.remove()
			return
		}
		switch {
		case handoff:
			s.log.Error("session: LAST CALL: the sandbox ends soon and its snapshot could not be stored; handing its workspace to a new sandbox without a new snapshot (nothing is lost while this host lives)",
				"sandbox", old.ID(), "ends", s.endsAt.UTC().Format(time.RFC3339), "err", err)
		case local != nil:
			s.log.Error("session: LAST CALL: the sandbox ends soon and the store would not take its snapshot; moving the work with the archive kept on this host, until the store takes it",
				"sandbox", old.ID(), "ends", s.endsAt.UTC().Format(time.RFC3339), "archive_bytes", local.size, "err", err)
		default:
			s.log.Error("session: LAST CALL: the sandbox ends soon and could not even be packed; moving to a new sandbox from the newest stored snapshot: work since it is lost",
				"sandbox", old.ID(), "ends", s.endsAt.UTC().Format(time.RFC3339), "err", err)
		}
	}
	saveErr := err
	if err := s.fenced(); err != nil {
		// Lost while saving (a save fenced off fails, and a last call would go on to
		// make a sandbox): nothing more.
		s.log.Warn("session: rotation dropped: the session may no longer act on the project", "sandbox", old.ID(), "err", err)
		local.remove()
		return
	}
	// A snapshot saved ahead is a checkpoint: calls went on after it, so restoring it
	// where the handoff fails would drop their work (and say nothing was lost). Only a
	// save made with the calls held back carries the work.
	next, how, err := s.replace(ctx, old, local, saveErr == nil && !fresh)
	if err != nil {
		s.retryAt = s.clock.Now().Add(s.cfg.RetryInterval)
		if !force {
			s.retryAt = minTime(s.retryAt, s.lastCall())
		}
		s.log.Error("session: rotation postponed: new sandbox not ready", "err", err)
		local.remove()
		return
	}
	if how == "restore (local copy)" && saveErr != nil {
		s.keepLocal(local) // the newest snapshot, until the store takes it
	} else {
		local.remove()
	}
	s.use(next)
	s.retryAt = time.Time{}
	s.rotations++
	defer s.changed()
	files := filesKept
	if saveErr != nil && how == "restore" {
		files = filesLost
	}
	why := "a scheduled rotation"
	if stuck {
		why = "its commands could no longer start: it had run out of processes, open files or memory"
	}
	restarted := s.restartProcs(ctx, next, running, terms, ports, why, files)
	if stuck {
		notice := fmt.Sprintf("[Note: the sandbox was replaced (%s); %s.", why, files)
		if len(left) > 0 {
			notice += " These background processes of the old sandbox were NOT restarted (one of them likely used its processes up); start again only what you need:\n" + strings.Join(left, "\n")
		}
		s.bg.mu.Lock()
		s.bg.notice = notice + "]"
		s.bg.mu.Unlock()
	}
	s.log.Info("session: rotated", "from", old.ID(), "to", next.ID(), "how", how, "snapshot", info.Key,
		"save", saved, "pause", time.Since(start), "restarted", restarted, "rotations", s.rotations)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// replace makes the sandbox that follows old: by handing old's workspace over when the
// provider can (no copy), else from the local archive of this rotation, else by restoring
// the newest stored snapshot into a fresh sandbox. A failed handoff falls back to the
// next; the stored snapshot only when it is this rotation's (saved), since restoring an
// older one would drop the work in old.
func (s *Workspace) replace(ctx context.Context, old sandbox.Sandbox, local *localArchive, saved bool) (sandbox.Sandbox, string, error) {
	handoff := s.canHandoff(old)
	if handoff {
		next, err := s.cfg.Provider.(sandbox.Handoff).Handoff(ctx, old, s.cfg.Sandbox)
		if err == nil {
			return next, "handoff", nil
		}
		if !errors.Is(err, sandbox.ErrForeign) { // not a failure: the restore path is the way
			s.log.Warn("session: handoff failed", "sandbox", old.ID(), "err", err)
		}
	}
	if local != nil {
		next, err := s.createFrom(ctx, local)
		if err == nil {
			s.closeLater(ctx, old)
			return next, "restore (local copy)", nil
		}
		s.log.Error("session: restoring the local snapshot failed", "err", err)
	}
	if !saved && local == nil && handoff {
		return nil, "", errors.New("the workspace was not saved and could not be handed over")
	}
	next, _, err := s.createRestored(ctx, "rotation")
	if err != nil {
		return nil, "", err
	}
	s.closeLater(ctx, old)
	return next, "restore", nil
}

// Rotate moves the workspace to a fresh sandbox now: save, replace, restart. Calls made
// meanwhile wait and then run on the new sandbox; when the workspace is handed over, they
// go on during the save and wait only for the move. If the save fails, the old sandbox
// stays and the error says why.
func (s *Workspace) Rotate(ctx context.Context) error {
	s.rotMu.Lock()
	defer s.rotMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if err := s.fenced(); err != nil {
		return err
	}
	before := s.rotations
	pre := s.saveAhead(ctx, false)
	if s.closed { // closed while the save ran
		return ErrClosed
	}
	s.rotate(ctx, false, pre)
	if s.rotations == before {
		return errors.New("session: rotation failed; the current sandbox stays (see the log)")
	}
	return nil
}

// recoverDead replaces a sandbox that died (or stopped answering) before it could be
// saved. A provider whose workspaces outlive their sandboxes hands the workspace over and
// nothing is lost; otherwise the newest snapshot (a local one first) is restored, work
// since it is lost, and the log says so.
func (s *Workspace) recoverDead(ctx context.Context) {
	old := s.sb
	ctx = context.WithoutCancel(ctx)
	running := s.rememberedProcs()
	s.bg.mu.Lock()
	terms := slices.Clone(s.bg.terms)
	s.bg.mu.Unlock()
	if s.canHandoff(old) {
		next, err := s.cfg.Provider.(sandbox.Handoff).Handoff(ctx, old, s.cfg.Sandbox)
		if err == nil {
			s.log.Warn("session: sandbox ended on its own; its workspace was handed to a new one, nothing lost",
				"from", old.ID(), "to", next.ID())
			s.adopt(ctx, next, running, terms, filesKept)
			return
		}
		if !errors.Is(err, sandbox.ErrForeign) {
			s.log.Warn("session: handoff of an ended sandbox failed; restoring the newest snapshot", "sandbox", old.ID(), "err", err)
		}
	}
	var next sandbox.Sandbox
	var err error
	from := "the newest stored snapshot"
	if local := s.takeLocal(); local != nil {
		next, err = s.createFrom(ctx, local)
		if err == nil {
			from = "the snapshot kept on this host"
			local.remove()
		} else {
			s.keepLocal(local)
		}
	}
	if next == nil {
		next, _, err = s.createRestored(ctx, "recover")
	}
	if err != nil {
		s.retryAt = s.clock.Now().Add(s.cfg.RetryInterval)
		s.log.Error("session: sandbox is gone and a new one could not be made", "sandbox", old.ID(), "err", err)
		return
	}
	s.log.Error("session: sandbox ended before it was saved; restored "+from+": work since it is lost",
		"from", old.ID(), "to", next.ID())
	s.closeLater(ctx, old)
	s.adopt(ctx, next, running, terms, filesLost)
}

// What the notice of a replacement says of the files: nothing lost, or work since the
// last snapshot lost.
const (
	filesKept = "your files are as you left them"
	filesLost = "your files are as of the last snapshot: changes made since it are lost"
)

// adopt makes next the session's sandbox after a death and restarts the processes.
func (s *Workspace) adopt(ctx context.Context, next sandbox.Sandbox, running []*bgProc, terms []*termProc, files string) {
	defer s.changed()
	s.use(next)
	s.retryAt = time.Time{}
	var ports []int
	if s.devPort != 0 {
		ports = []int{s.devPort}
	}
	s.restartProcs(ctx, next, running, terms, ports, "the old one stopped", files)
}

// save stores a snapshot of the current sandbox. With keep, the archive is also written
// to a local file, returned whenever the pack completed, even when the store failed (the
// caller removes it).
func (s *Workspace) save(ctx context.Context, label string, keep bool) (snapshot.Info, *localArchive, error) {
	if err := s.fenced(); err != nil {
		return snapshot.Info{}, nil, err
	}
	sb := s.sb
	start := time.Now()
	failed := func(err error) {
		s.log.Error("session: snapshot failed", "label", label, "sandbox", sb.ID(), "took", time.Since(start), "err", err)
	}
	saved := func(info snapshot.Info) {
		s.log.Info("session: snapshot saved", "label", label, "sandbox", sb.ID(), "key", info.Key, "took", time.Since(start))
		snapshot.LogSkips(s.log, s.cfg.ProjectID, info.Skipped, info.Skips)
		s.storedNewer()
	}
	if ts, ok := sandbox.As[tree.Source](sb); ok && !keep {
		info, err := s.cfg.Snapshots.SaveTree(ctx, s.cfg.ProjectID, label, ts, s.cfg.Excludes)
		if err != nil {
			failed(err)
			return info, nil, err
		}
		saved(info)
		return info, nil, nil
	}
	var local *localArchive
	var rep sandbox.ArchiveReport
	if keep {
		// The local copy is whole before the store is asked anything: a store that is
		// down fails the save at once, and this copy is then the only one.
		var err error
		if local, rep, err = s.packLocal(ctx, sb); err != nil {
			failed(err)
			return snapshot.Info{ProjectID: s.cfg.ProjectID}, nil, fmt.Errorf("%w: project %s: %w", snapshot.ErrSaveFailed, s.cfg.ProjectID, err)
		}
	}
	info, err := s.cfg.Snapshots.SaveLabeled(ctx, s.cfg.ProjectID, label, func(w io.Writer) error {
		if local != nil {
			f, err := os.Open(local.path)
			if err != nil {
				return fmt.Errorf("local copy: %w", err)
			}
			defer f.Close()
			_, err = io.Copy(w, f)
			return err
		}
		var err error
		rep, err = sandbox.ArchiveWithReport(ctx, sb, w, s.cfg.Excludes)
		return err
	})
	info.Skipped = rep.Skipped
	for _, sk := range rep.Skips {
		info.Skips = append(info.Skips, archive.Skip{Path: sk.Path, Reason: sk.Reason})
	}
	if err != nil {
		failed(err)
		return info, local, err
	}
	saved(info)
	return info, local, nil
}

// packLocal writes sb's archive to a file on this host (the copy a rotation keeps when
// the store will not take it).
func (s *Workspace) packLocal(ctx context.Context, sb sandbox.Sandbox) (*localArchive, sandbox.ArchiveReport, error) {
	f, err := os.CreateTemp(s.cfg.TempDir, "toolhost-session-*.tar.gz")
	if err != nil {
		return nil, sandbox.ArchiveReport{}, fmt.Errorf("local copy: %w", err)
	}
	rep, err := sandbox.ArchiveWithReport(ctx, sb, f, s.cfg.Excludes)
	size, _ := f.Seek(0, io.SeekCurrent)
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("local copy: %w", cerr)
	}
	if err != nil {
		os.Remove(f.Name())
		return nil, rep, fmt.Errorf("pack: %w", err)
	}
	return &localArchive{path: f.Name(), size: size}, rep, nil
}

// Commit saves a snapshot of the workspace (a phase commit). A failed save returns an
// error and leaves the session working; the next commit tries again. Info.Skipped and
// Info.Skips say what the snapshot left out because it cannot hold it.
func (s *Workspace) Commit(ctx context.Context, label string) (snapshot.Info, error) {
	_, release, err := s.current(ctx, 0)
	if err != nil {
		return snapshot.Info{}, err
	}
	info, _, err := s.save(ctx, label, false)
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
func (s *Workspace) Rotations() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.rotations
}

// Close stops the keepalive loop and closes the current sandbox. It does not save: call
// Commit first to keep the work.
func (s *Workspace) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	sb := s.sb
	s.mu.Unlock()
	s.stop()
	var err error
	if d, ok := sandbox.As[sandbox.Detacher](sb); ok && s.fenced() != nil {
		// The lease is lost: another holder may have reconnected to this sandbox, which
		// lives apart from this process. It is let go of, never killed.
		s.log.Warn("session: closing after the project's lease was lost: the sandbox is left running for its new holder")
		err = d.Detach(ctx)
	} else {
		err = sb.Close(ctx)
	}
	// A provider that keeps sandboxes started ahead (the local pool) keeps them per
	// configuration; one with the session's own egress serves no other session.
	if w, ok := sandbox.ProviderAs[warmer](s.cfg.Provider); ok && s.cfg.Sandbox.Egress != nil {
		w.Unwarm(s.cfg.Sandbox)
	}
	s.wg.Wait()
	s.uploadLocalAtEnd(ctx)
	return err
}

// uploadLocalAtEnd tries once more to store a snapshot kept on this host (the store did
// not take it), at the session's end; else the file stays.
func (s *Workspace) uploadLocalAtEnd(ctx context.Context) {
	if local := s.takeLocal(); local != nil {
		// The newest snapshot exists only here: one more try, and else keep the file.
		if ferr := s.fenced(); ferr != nil {
			s.log.Error("session: closing with a snapshot the store never took, and no right to store it now; its archive stays on this host",
				"path", local.path, "bytes", local.size, "err", ferr)
		} else if uerr := s.uploadLocal(ctx, local); uerr != nil {
			s.log.Error("session: closing with a snapshot the store never took; its archive stays on this host",
				"path", local.path, "bytes", local.size, "err", uerr)
		} else {
			s.log.Warn("session: the snapshot kept on this host is now in the store")
			local.remove()
		}
	}
}

// listWorkspace lists a restored workspace for the check against its snapshot (every
// entry, paths relative to the root, excluded names left out as the snapshot left them).
func (s *Workspace) listWorkspace(ctx context.Context, sb sandbox.Sandbox) ([]snapshot.WorkspaceEntry, error) {
	excludes := s.cfg.Excludes
	if excludes == nil {
		excludes = archive.DefaultExcludes
	}
	res, err := sb.List(ctx, sandbox.ListRequest{Path: sandbox.WorkspaceRoot, Recursive: true, Skip: excludes})
	if err != nil {
		return nil, err
	}
	if res.Truncated {
		return nil, errors.New("the listing was cut short")
	}
	out := make([]snapshot.WorkspaceEntry, 0, len(res.Entries))
next:
	for _, e := range res.Entries {
		p := strings.TrimPrefix(strings.TrimPrefix(e.Path, sandbox.WorkspaceRoot), "/")
		for c := range strings.SplitSeq(p, "/") {
			if slices.Contains(excludes, c) {
				continue next
			}
		}
		out = append(out, snapshot.WorkspaceEntry{Path: p, Mode: e.Mode, Size: e.Size})
	}
	return out, nil
}

// Reload replaces the sandbox with a new one restored from the project's newest snapshot
// (a rewind made an earlier one the newest), and restarts the background processes that
// were running. Calls made meanwhile wait and then run in the new sandbox. The present is
// not saved: the caller saves it first (a rewind does).
func (s *Workspace) Reload(ctx context.Context, why string) error {
	s.rotMu.Lock() // not beside a rotation, whose save ahead would then be of a sandbox gone
	defer s.rotMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if err := s.fenced(); err != nil {
		return err
	}
	old := s.sb
	ctx = context.WithoutCancel(ctx)
	running := s.runningProcs(ctx, old)
	terms := s.runningTerms(ctx, old)
	ports, _ := s.listeningOn(ctx, old)
	next, _, err := s.createRestored(ctx, why)
	if err != nil {
		return err
	}
	s.closeLater(ctx, old)
	s.use(next)
	s.retryAt = time.Time{}
	s.restartProcs(ctx, next, running, terms, ports, why, "your files are as of the checkpoint you went back to")
	s.changed()
	return nil
}
