package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/core/snapshot"
)

// newToolhost loads the configured plugins and opens the store: what the commands that
// run tools need. The sandbox provider and the browser start when first used.
func (c *cli) newToolhost(ctx context.Context) (*toolhost.Toolhost, error) {
	return toolhost.New(ctx, c.cfg.Config, c.options()...)
}

// newStorage opens the configured store with the snapshots and screenshots on it: what
// the snapshot and screenshot commands need (no plugins, no sandbox).
func (c *cli) newStorage(ctx context.Context, progress func(snapshot.Progress)) (*toolhost.Storage, error) {
	opts := c.options()
	if progress != nil {
		opts = append(opts, toolhost.WithSnapshotProgress(progress))
	}
	return toolhost.OpenStorage(ctx, c.cfg.Config, opts...)
}

func (c *cli) options() []toolhost.Option {
	return []toolhost.Option{toolhost.WithLogger(c.log), toolhost.WithSnapshotLogger(c.quietLog()),
		toolhost.WithConfigFile(c.cfg.File)}
}

// closeToolhost closes th (its sessions first) and logs a failure.
func (c *cli) closeToolhost(ctx context.Context, th *toolhost.Toolhost) {
	cctx, cancel := cleanupContext(ctx)
	defer cancel()
	if err := th.Close(cctx); err != nil {
		c.log.Warn("closing the host", "err", err)
	}
}

// closeSession closes sess and logs a failure.
func (c *cli) closeSession(ctx context.Context, sess *toolhost.Session) {
	cctx, cancel := cleanupContext(ctx)
	defer cancel()
	if err := sess.Close(cctx); err != nil {
		c.log.Warn("closing the session", "project", sess.Project(), "err", err)
	}
}

// cleanupContext outlives an interrupted ctx long enough to close things properly.
func cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
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
