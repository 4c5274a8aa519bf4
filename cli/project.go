package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/toolhost/toolhost"
)

// newToolhost loads the configured plugins and opens the store: what the commands that
// run tools need. The sandbox provider and the browser start when first used.
func (c *cli) newToolhost(ctx context.Context) (*toolhost.Toolhost, error) {
	return toolhost.New(ctx, c.cfg.Config, c.options()...)
}

// newStorage opens the configured store with the snapshots and screenshots on it: what
// the snapshot and screenshot commands need (no plugins, no sandbox).
func (c *cli) newStorage(ctx context.Context, progress func(toolhost.SnapshotProgress)) (*toolhost.Storage, error) {
	opts := c.options()
	if progress != nil {
		opts = append(opts, toolhost.WithSnapshotProgress(progress))
	}
	return toolhost.OpenStorage(ctx, c.cfg.Config, opts...)
}

func (c *cli) options() []toolhost.Option {
	return []toolhost.Option{toolhost.WithLogger(c.log), toolhost.WithSnapshotLogger(c.snapshotLog()),
		toolhost.WithConfigFile(c.cfg.File)}
}

// snapshotLog is the snapshot manager's logger: its warnings (a retried attempt, an
// entry left out, a snapshot refused for an older one), not its errors, which are the
// errors it returns and the commands print themselves; everything at debug level.
func (c *cli) snapshotLog() *slog.Logger {
	if c.cfg.Level() <= slog.LevelDebug {
		return c.log
	}
	return slog.New(levelRange{c.log.Handler(), slog.LevelWarn, slog.LevelError})
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
	return slog.New(levelRange{c.log.Handler(), slog.LevelWarn, slog.Level(math.MaxInt)})
}

// levelRange passes the records from min up to, not including, below.
type levelRange struct {
	slog.Handler
	min, below slog.Level
}

func (h levelRange) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && l < h.below && h.Handler.Enabled(ctx, l)
}

func (h levelRange) WithAttrs(as []slog.Attr) slog.Handler {
	return levelRange{h.Handler.WithAttrs(as), h.min, h.below}
}

func (h levelRange) WithGroup(name string) slog.Handler {
	return levelRange{h.Handler.WithGroup(name), h.min, h.below}
}

// progress draws a snapshot transfer's live line on stderr, rewritten with \r while it
// runs, when stderr is a terminal; the summary of what moved is the command's (the
// operation's snapshot.Info.Transfer, see printTransfer).
type progress struct {
	w   io.Writer
	tty bool

	mu    sync.Mutex
	phase string
	start time.Time
	last  time.Time
	drawn bool
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
func (p *progress) update(pr toolhost.SnapshotProgress) {
	if !p.tty {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if pr.Phase != p.phase {
		p.phase, p.start = pr.Phase, now
	}
	// Draw at most 10 times a second, and only for transfers that last.
	if now.Sub(p.last) < 100*time.Millisecond || now.Sub(p.start) < 200*time.Millisecond {
		return
	}
	p.last, p.drawn = now, true
	line := fmt.Sprintf("%-8s %s", p.phase, humanBytes(pr.Done))
	if pr.Total > 0 {
		line += fmt.Sprintf(" / %s (%d%%)", humanBytes(pr.Total), pr.Done*100/pr.Total)
	}
	line += "  " + rate(pr.Done, now.Sub(p.start))
	fmt.Fprintf(p.w, "\r%-72s", line)
}

// finish clears the live line.
func (p *progress) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprintf(p.w, "\r%-72s\r", "")
		p.drawn = false
	}
}

func rate(n int64, d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return humanBytes(int64(float64(n)/d.Seconds())) + "/s"
}

// printTransfer prints what a save or restore really moved, one line on stderr, when a
// phase moved anything or failed.
func printTransfer(w io.Writer, info toolhost.SnapshotInfo) {
	if slices.ContainsFunc(info.Transfer, func(p toolhost.TransferPhase) bool { return p.Bytes > 0 || p.Failed }) {
		fmt.Fprintf(w, "transfer: %s\n", info.TransferSummary)
	}
}

// errNoSnapshot says, for people, that a project has nothing to restore.
func errNoSnapshot(project string, err error) error {
	if errors.Is(err, toolhost.ErrNoSnapshot) {
		return fmt.Errorf("project %s has no snapshot (save one with: toolhost snapshot save --project %s --workspace DIR)", project, project)
	}
	return err
}
