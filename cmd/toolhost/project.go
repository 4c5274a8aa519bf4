package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/core/screenshot"
	"github.com/toolhost/toolhost/core/session"
	"github.com/toolhost/toolhost/core/snapshot"
	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/core/store/dir"
	"github.com/toolhost/toolhost/core/store/s3"
)

// projectEnv is what the commands that work on a project share: the object store, the
// snapshot manager and, when screenshots are on, the recorder. close releases them all
// (the browser included).
type projectEnv struct {
	store  store.Store
	where  string // the store, for people: a directory or s3://bucket
	snaps  *snapshot.Manager
	rec    *screenshot.Recorder // nil when screenshot.enabled is false
	closer []func(ctx context.Context)
}

func (e *projectEnv) close(ctx context.Context) {
	cctx, cancel := cleanupContext(ctx)
	defer cancel()
	for i := len(e.closer) - 1; i >= 0; i-- {
		e.closer[i](cctx)
	}
}

// envOptions say which parts a command needs.
type envOptions struct {
	progress func(snapshot.Progress) // snapshot progress callback
	browser  bool                    // a Capturer (when screenshots are enabled)
}

// newProjectEnv opens the configured store and builds what sits on it.
func (c *cli) newProjectEnv(ctx context.Context, opts envOptions) (*projectEnv, error) {
	cfg := &c.cfg.Config
	e := &projectEnv{}
	switch cfg.Store.Kind {
	case "s3":
		st, err := s3.New(ctx, s3.Config{
			Bucket:               cfg.Store.S3.Bucket,
			Region:               cfg.Store.S3.Region,
			Endpoint:             cfg.Store.S3.Endpoint,
			PathStyle:            cfg.Store.S3.PathStyle,
			ChecksumWhenRequired: cfg.Store.S3.Checksums == "when_required",
			Logger:               c.log,
		})
		if err != nil {
			return nil, fmt.Errorf("store s3://%s: %w", cfg.Store.S3.Bucket, err)
		}
		e.store, e.where = st, "s3://"+cfg.Store.S3.Bucket
	default:
		path := cfg.Store.Dir
		if path == "" {
			path = filepath.Join(dataDir(cfg), "store")
		}
		abs, err := filepath.Abs(path)
		if err != nil {
			return nil, fmt.Errorf("store.dir: %w", err)
		}
		st, err := dir.New(abs)
		if err != nil {
			return nil, fmt.Errorf("opening the directory store %s: %w", abs, err)
		}
		e.store, e.where = st, abs
		e.closer = append(e.closer, func(context.Context) { st.Close() })
	}

	keep, retries := cfg.Snapshot.Keep, cfg.Snapshot.Retries
	if retries == 0 {
		retries = -1 // the manager reads 0 as "the default"; the config means none
	}
	m, err := snapshot.New(snapshot.Config{
		Store:    e.store,
		Keep:     keep,
		Excludes: cfg.Snapshot.Excludes,
		Retries:  retries,
		Logger:   c.quietLog(),
		Progress: opts.progress,
	})
	if err != nil {
		e.close(ctx)
		return nil, fmt.Errorf("snapshots: %w", err)
	}
	e.snaps = m

	if cfg.Screenshot.Enabled {
		e.rec = &screenshot.Recorder{Store: e.store, PublicBase: cfg.Store.PublicBase, Logger: c.log}
		if opts.browser {
			capt := screenshot.New(screenshot.Config{
				ExecutablePath: cfg.Screenshot.Chromium,
				IdleBound:      cfg.Screenshot.IdleWait,
				Logger:         c.log,
			})
			if err := capt.Check(); err != nil {
				// Not fatal: take_screenshot answers with this, as an is_error result.
				c.log.Debug("screenshots will fail", "err", err)
			}
			e.rec.Capturer = capt
			e.closer = append(e.closer, func(ctx context.Context) {
				if err := capt.Close(ctx); err != nil {
					c.log.Warn("closing the browser", "err", err)
				}
			})
		}
	}
	return e, nil
}

// quietLog is the logger for library records that repeat what a command prints itself:
// at the configured level when that is debug, else warnings and errors only.
func (c *cli) quietLog() *slog.Logger {
	if c.cfg.Level() <= slog.LevelDebug {
		return c.log
	}
	return slog.New(minLevel{c.log.Handler(), slog.LevelWarn})
}

// minLevel drops records below min.
type minLevel struct {
	slog.Handler
	min slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h minLevel) WithAttrs(as []slog.Attr) slog.Handler {
	return minLevel{h.Handler.WithAttrs(as), h.min}
}

func (h minLevel) WithGroup(name string) slog.Handler {
	return minLevel{h.Handler.WithGroup(name), h.min}
}

// sessionOptions open a session for the configured project.
type sessionOptions struct {
	provider  sandbox.Provider
	workspace string            // a host directory used as every sandbox's workspace, or ""
	snaps     session.Snapshots // default: the env's manager
	log       *slog.Logger
}

func (c *cli) openSession(ctx context.Context, e *projectEnv, o sessionOptions) (*session.Session, error) {
	cfg := &c.cfg.Config
	snaps := o.snaps
	if snaps == nil {
		snaps = e.snaps
	}
	log := o.log
	if log == nil {
		log = c.log
	}
	sess, err := session.Open(ctx, session.Config{
		Provider: o.provider,
		Sandbox: sandbox.CreateOptions{
			Workspace: o.workspace,
			Network:   cfg.Sandbox.Network,
		},
		ProjectID:       cfg.Project,
		Snapshots:       snaps,
		Excludes:        cfg.Snapshot.Excludes,
		TTL:             cfg.Session.TTL,
		KeepaliveMargin: cfg.Session.KeepaliveMargin,
		MaxLifetime:     cfg.Session.MaxLifetime,
		Screenshots:     e.rec,
		Logger:          log,
	})
	if err != nil {
		return nil, fmt.Errorf("opening a session for project %s: %w%s", cfg.Project, err, bwrapHint())
	}
	return sess, nil
}

// closeSession closes sess and logs a failure.
func (c *cli) closeSession(ctx context.Context, sess *session.Session) {
	cctx, cancel := cleanupContext(ctx)
	defer cancel()
	if err := sess.Close(cctx); err != nil {
		c.log.Warn("closing the session", "id", sess.ID(), "err", err)
	}
}

// noWake is the snapshots of a session whose workspace is a host directory the caller
// chose (toolhost call --workspace DIR): the directory is the state, so the session does
// not restore the project's snapshot into it. Saves go to the project as usual.
type noWake struct{ *snapshot.Manager }

func (noWake) Restore(context.Context, string, func(io.Reader) error) (snapshot.Info, error) {
	return snapshot.Info{}, fmt.Errorf("the workspace is a host directory: %w", snapshot.ErrNoSnapshot)
}

// progress shows a snapshot transfer on stderr: a line rewritten with \r while it runs
// when stderr is a terminal, and one summary line at the end either way.
type progress struct {
	w   io.Writer
	tty bool

	mu      sync.Mutex
	phase   string
	start   time.Time
	last    time.Time
	done    int64
	total   int64
	drawn   bool
	summary []string
	seen    map[string]bool // phases that reported
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

// update is the snapshot.Config.Progress callback.
func (p *progress) update(pr snapshot.Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if p.seen == nil {
		p.seen = map[string]bool{}
	}
	p.seen[pr.Phase] = true
	if pr.Phase != p.phase {
		p.endPhase(now)
		p.phase, p.start, p.done, p.total = pr.Phase, now, 0, pr.Total
	}
	p.done, p.total = pr.Done, pr.Total
	// Draw at most 10 times a second, and only for transfers that last.
	if p.tty && now.Sub(p.last) >= 100*time.Millisecond && now.Sub(p.start) >= 200*time.Millisecond {
		p.last, p.drawn = now, true
		line := fmt.Sprintf("%-8s %s", p.phase, humanBytes(p.done))
		if p.total > 0 {
			line += fmt.Sprintf(" / %s (%d%%)", humanBytes(p.total), p.done*100/p.total)
		}
		line += "  " + rate(p.done, now.Sub(p.start))
		fmt.Fprintf(p.w, "\r%-72s", line)
	}
}

func (p *progress) endPhase(now time.Time) {
	if p.phase == "" {
		return
	}
	d := now.Sub(p.start)
	p.summary = append(p.summary, fmt.Sprintf("%s %s in %s (%s)", p.phase, humanBytes(p.done), ms(d), rate(p.done, d)))
	p.phase = ""
}

// saw reports whether a phase reported progress.
func (p *progress) saw(phase string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seen[phase]
}

// finish prints the summary line (replacing the progress line on a terminal).
func (p *progress) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.endPhase(time.Now())
	if p.drawn {
		fmt.Fprintf(p.w, "\r%-72s\r", "")
	}
	if len(p.summary) > 0 {
		fmt.Fprintf(p.w, "transfer: %s\n", strings.Join(p.summary, ", "))
	}
}

func rate(n int64, d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return humanBytes(int64(float64(n)/d.Seconds())) + "/s"
}

// errNoSnapshot says, for people, that a project has nothing to restore.
func errNoSnapshot(project string, err error) error {
	if errors.Is(err, snapshot.ErrNoSnapshot) {
		return fmt.Errorf("project %s has no snapshot (save one with: toolhost snapshot save --project %s --workspace DIR)", project, project)
	}
	return err
}
