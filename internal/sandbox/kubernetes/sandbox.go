package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"syscall"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/envd"
	"github.com/toolhost/toolhost/internal/envd/client"
	"github.com/toolhost/toolhost/internal/preview"
	"github.com/toolhost/toolhost/internal/tree"
)

// Sandbox is one agent-sandbox Sandbox, reached through its agent at the pod's IP.
type Sandbox struct {
	id       string
	p        *Provider
	log      *slog.Logger
	podIP    string
	claimed  bool // a SandboxClaim's (a warm pool's): close and extend go to the claim
	client   *client.Client
	previews preview.Forwarders
	egress   *egressLink // network egress: its door of the gateway (egress.go)

	// life ends when the sandbox does: calls under way are cut then (bind).
	life    context.Context
	endLife context.CancelFunc

	mu        sync.Mutex
	startedAt time.Time
	endsAt    time.Time
	timer     *time.Timer
	reason    string // why it ended; "" while it runs

	closeOnce sync.Once
	closeDone chan struct{}
	closeErr  error
}

var (
	_ sandbox.Sandbox         = (*Sandbox)(nil)
	_ sandbox.ProcessLister   = (*Sandbox)(nil)
	_ sandbox.GuardedFiles    = (*Sandbox)(nil)
	_ sandbox.ArchiveReporter = (*Sandbox)(nil)
	_ sandbox.PortLister      = (*Sandbox)(nil)
	_ sandbox.Remover         = (*Sandbox)(nil)
	_ sandbox.ProcessSignaler = (*Sandbox)(nil)
	_ sandbox.Terminals       = (*Sandbox)(nil)
	_ tree.Source             = (*Sandbox)(nil)
)

func newSandbox(p *Provider, name, ip string, c *client.Client) *Sandbox {
	life, endLife := context.WithCancel(context.Background())
	return &Sandbox{id: name, p: p, log: p.log.With("sandbox", name), podIP: ip, client: c,
		life: life, endLife: endLife, closeDone: make(chan struct{})}
}

// start sets the lifetime and arms the end-time timer.
func (s *Sandbox) start(startedAt, endsAt time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.startedAt, s.endsAt = startedAt, endsAt
	s.timer = time.AfterFunc(time.Until(endsAt), s.expire)
}

// ID is the Sandbox's name in its namespace.
func (s *Sandbox) ID() string { return s.id }

// StartedAt is the Sandbox's creation time, as the API server recorded it.
func (s *Sandbox) StartedAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.startedAt
}

// EndsAt is its spec.shutdownTime.
func (s *Sandbox) EndsAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.endsAt
}

func (s *Sandbox) closedErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reason == "" {
		return nil
	}
	return fmt.Errorf("sandbox %s %s: %w", s.id, s.reason, sandbox.ErrClosed)
}

// refused is closedErr for a call that has done nothing yet: it wraps ErrNotRun too.
func (s *Sandbox) refused() error {
	if err := s.closedErr(); err != nil {
		return fmt.Errorf("%w (%w)", err, sandbox.ErrNotRun)
	}
	return nil
}

// bind derives a context that ends when the sandbox does, so a call under way at the end
// returns then rather than when the pod's connection breaks.
func (s *Sandbox) bind(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.life, cancel)
	return ctx, func() { stop(); cancel() }
}

// wrap turns a failure of a sandbox that ended meanwhile into ErrClosed, and ends a sandbox
// whose agent stopped answering or is gone.
func (s *Sandbox) wrap(err error) error {
	if err == nil || errors.Is(err, sandbox.ErrClosed) {
		return err
	}
	select {
	case <-s.life.Done():
		if cerr := s.closedErr(); cerr != nil {
			return fmt.Errorf("%w: %w", cerr, err)
		}
	default:
	}
	if errors.Is(err, sandbox.ErrUnresponsive) {
		s.log.Warn("sandbox agent stopped answering; ending the sandbox", "err", err)
		s.shutdown("stopped answering")
		return fmt.Errorf("sandbox %s stopped answering and was ended: %w", s.id, errors.Join(sandbox.ErrClosed, err))
	}
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, io.ErrUnexpectedEOF) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if s.client.Health(ctx) != nil {
			s.shutdown("lost its agent")
			return fmt.Errorf("sandbox %s lost its agent: %w: %w", s.id, sandbox.ErrClosed, err)
		}
	}
	return err
}

// SetTimeout moves the end time (the Sandbox's spec.shutdownTime) to now+d, within the
// provider's maximum lifetime.
func (s *Sandbox) SetTimeout(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("set timeout of sandbox %s: %s is not positive", s.id, d)
	}
	if err := s.closedErr(); err != nil {
		return fmt.Errorf("set timeout: %w", err)
	}
	end := endAfter(d)
	limit := s.StartedAt().Add(s.p.cfg.MaxLifetime)
	if end.After(limit) {
		return fmt.Errorf("set timeout of sandbox %s to %s: it would end at %s, past its maximum lifetime of %s (it must end by %s)",
			s.id, d, end.Format(time.RFC3339), s.p.cfg.MaxLifetime, limit.Format(time.RFC3339))
	}
	if err := s.p.patchShutdown(ctx, s.id, s.claimed, end); err != nil {
		return s.wrap(fmt.Errorf("set timeout of sandbox %s: %w", s.id, err))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reason != "" {
		return fmt.Errorf("set timeout of sandbox %s (%s): %w", s.id, s.reason, sandbox.ErrClosed)
	}
	s.endsAt = end
	s.timer.Reset(time.Until(end))
	return nil
}

// expire runs on the end-time timer: the controller deletes the pod at shutdownTime as
// well, and the host does not wait for it.
func (s *Sandbox) expire() {
	s.mu.Lock()
	early := time.Now().Before(s.endsAt)
	at := s.endsAt
	s.mu.Unlock()
	if early {
		return
	}
	s.log.Info("sandbox reached its end time; deleting it", "ends_at", at)
	s.shutdown("reached its end time at " + at.Format(time.RFC3339))
}

// Close deletes the Sandbox (its pod and everything in it). It is idempotent.
func (s *Sandbox) Close(ctx context.Context) error {
	go s.shutdown("was closed")
	select {
	case <-s.closeDone:
		return s.closeErr
	case <-ctx.Done():
		return fmt.Errorf("close sandbox %s: %w", s.id, ctx.Err())
	}
}

// detach ends this handle without deleting the Sandbox (a test's stand-in for a process
// that died holding it).
func (s *Sandbox) detach() {
	s.closeOnce.Do(func() {
		defer close(s.closeDone)
		s.end("was detached")
	})
}

// end marks the handle ended and releases what it holds on this host.
func (s *Sandbox) end(reason string) {
	s.mu.Lock()
	s.reason = reason
	if s.timer != nil {
		s.timer.Stop()
	}
	s.mu.Unlock()
	s.endLife()
	s.previews.Close()
	s.client.Close()
	s.egress.close()
}

// shutdown ends the sandbox once and deletes its Sandbox; later callers wait for the first.
func (s *Sandbox) shutdown(reason string) {
	s.closeOnce.Do(func() {
		defer close(s.closeDone)
		s.end(reason)
		ctx, cancel := context.WithTimeout(context.Background(), 2*s.p.cfg.RequestTimeout)
		defer cancel()
		if err := s.p.delete(ctx, s.id, s.claimed); err != nil {
			s.closeErr = fmt.Errorf("close sandbox %s: %w", s.id, err)
			s.log.Warn("delete the sandbox", "err", err)
		}
		if reason != "was closed" {
			s.log.Warn("sandbox ended", "reason", reason)
		}
	})
	<-s.closeDone
}

// Exec runs a foreground command.
func (s *Sandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	if err := s.refused(); err != nil {
		return sandbox.ExecResult{}, err
	}
	ctx, cancel := s.bind(ctx)
	defer cancel()
	res, err := s.client.Exec(ctx, req)
	return res, s.wrap(err)
}

// Start runs a background command.
func (s *Sandbox) Start(ctx context.Context, req sandbox.ExecRequest) (sandbox.Process, error) {
	if err := s.refused(); err != nil {
		return sandbox.Process{}, err
	}
	ctx, cancel := s.bind(ctx)
	defer cancel()
	pr, err := s.client.Start(ctx, req)
	return pr, s.wrap(err)
}

// ReadFile reads a workspace file.
func (s *Sandbox) ReadFile(ctx context.Context, path string, maxBytes int64) ([]byte, error) {
	if err := s.refused(); err != nil {
		return nil, err
	}
	ctx, cancel := s.bind(ctx)
	defer cancel()
	b, err := s.client.ReadFile(ctx, path, maxBytes)
	return b, s.wrap(err)
}

// WriteFile writes a workspace file.
func (s *Sandbox) WriteFile(ctx context.Context, path string, data []byte) error {
	if err := s.refused(); err != nil {
		return err
	}
	ctx, cancel := s.bind(ctx)
	defer cancel()
	return s.wrap(s.client.WriteFile(ctx, path, data))
}

// Stat describes a workspace path.
func (s *Sandbox) Stat(ctx context.Context, path string) (sandbox.FileInfo, error) {
	if err := s.refused(); err != nil {
		return sandbox.FileInfo{}, err
	}
	ctx, cancel := s.bind(ctx)
	defer cancel()
	fi, err := s.client.Stat(ctx, path)
	return fi, s.wrap(err)
}

// List lists a workspace directory.
func (s *Sandbox) List(ctx context.Context, req sandbox.ListRequest) (sandbox.ListResult, error) {
	if err := s.refused(); err != nil {
		return sandbox.ListResult{}, err
	}
	ctx, cancel := s.bind(ctx)
	defer cancel()
	res, err := s.client.List(ctx, req)
	return res, s.wrap(err)
}

// ReadFileGuarded, WriteFileGuarded, StatGuarded, ListGuarded and RemoveFileGuarded are
// the file calls with the guard checked by the agent as it opens the path
// (sandbox.GuardedFiles).
func (s *Sandbox) ReadFileGuarded(ctx context.Context, path string, maxBytes int64, g sandbox.FileGuard) ([]byte, error) {
	if err := s.refused(); err != nil {
		return nil, err
	}
	ctx, cancel := s.bind(ctx)
	defer cancel()
	b, err := s.client.ReadFileGuarded(ctx, path, maxBytes, g)
	return b, s.wrap(err)
}

func (s *Sandbox) WriteFileGuarded(ctx context.Context, path string, data []byte, g sandbox.FileGuard) error {
	if err := s.refused(); err != nil {
		return err
	}
	ctx, cancel := s.bind(ctx)
	defer cancel()
	return s.wrap(s.client.WriteFileGuarded(ctx, path, data, g))
}

func (s *Sandbox) StatGuarded(ctx context.Context, path string, g sandbox.FileGuard) (sandbox.FileInfo, error) {
	if err := s.refused(); err != nil {
		return sandbox.FileInfo{}, err
	}
	ctx, cancel := s.bind(ctx)
	defer cancel()
	fi, err := s.client.StatGuarded(ctx, path, g)
	return fi, s.wrap(err)
}

func (s *Sandbox) ListGuarded(ctx context.Context, req sandbox.ListRequest, g sandbox.FileGuard) (sandbox.ListResult, error) {
	if err := s.refused(); err != nil {
		return sandbox.ListResult{}, err
	}
	ctx, cancel := s.bind(ctx)
	defer cancel()
	res, err := s.client.ListGuarded(ctx, req, g)
	return res, s.wrap(err)
}

func (s *Sandbox) RemoveFileGuarded(ctx context.Context, path string, g sandbox.FileGuard) error {
	if err := s.refused(); err != nil {
		return err
	}
	ctx, cancel := s.bind(ctx)
	defer cancel()
	return s.wrap(s.client.RemoveFileGuarded(ctx, path, g))
}

// Remove removes a workspace entry (a directory with what is in it).
func (s *Sandbox) Remove(ctx context.Context, path string) error {
	if err := s.refused(); err != nil {
		return err
	}
	ctx, cancel := s.bind(ctx)
	defer cancel()
	return s.wrap(s.client.Remove(ctx, path))
}

// Signal signals the process group of the background process id.
func (s *Sandbox) Signal(ctx context.Context, id string, sig sandbox.Signal) error {
	if err := s.refused(); err != nil {
		return err
	}
	ctx, cancel := s.bind(ctx)
	defer cancel()
	return s.wrap(s.client.SignalTag(ctx, id, sig))
}

// StartTerminal starts a program on a terminal in the sandbox.
func (s *Sandbox) StartTerminal(ctx context.Context, req sandbox.TerminalRequest, w sandbox.TerminalWait) (sandbox.TerminalOutput, error) {
	if err := s.refused(); err != nil {
		return sandbox.TerminalOutput{}, err
	}
	ctx, cancel := s.bind(ctx)
	defer cancel()
	out, err := s.client.StartTerminal(ctx, req, w)
	return out, s.wrap(err)
}

// TerminalIO talks to a terminal of the sandbox.
func (s *Sandbox) TerminalIO(ctx context.Context, id string, input []byte, sig sandbox.Signal, w sandbox.TerminalWait) (sandbox.TerminalOutput, error) {
	if err := s.refused(); err != nil {
		return sandbox.TerminalOutput{}, err
	}
	ctx, cancel := s.bind(ctx)
	defer cancel()
	out, err := s.client.TerminalIO(ctx, id, input, sig, w)
	return out, s.wrap(err)
}

// Archive has the agent pack the workspace inside the pod and streams it to w: packed
// from the sandbox's own view, bounded (envd.MaxArchiveBytes) and checked again when it is
// restored.
func (s *Sandbox) Archive(ctx context.Context, w io.Writer, excludes []string) error {
	_, err := s.ArchiveReport(ctx, w, excludes)
	return err
}

// ArchiveReport is Archive with the agent's report of what it packed and left out.
func (s *Sandbox) ArchiveReport(ctx context.Context, w io.Writer, excludes []string) (sandbox.ArchiveReport, error) {
	if err := s.refused(); err != nil {
		return sandbox.ArchiveReport{}, err
	}
	ctx, cancel := s.bind(ctx)
	defer cancel()
	res, err := s.client.Archive(ctx, w, excludes)
	if err != nil {
		return res.Report(), s.wrap(fmt.Errorf("archive sandbox %s: %w", s.id, err))
	}
	return res.Report(), nil
}

// Extract has the agent unpack a tar.gz into the (empty) workspace, inside the pod.
func (s *Sandbox) Extract(ctx context.Context, r io.Reader) error {
	if err := s.refused(); err != nil {
		return err
	}
	ctx, cancel := s.bind(ctx)
	defer cancel()
	if _, err := s.client.Extract(ctx, r); err != nil {
		return s.wrap(fmt.Errorf("extract into sandbox %s: %w", s.id, err))
	}
	return nil
}

// Processes lists the background processes that still run (sandbox.ProcessLister).
func (s *Sandbox) Processes(ctx context.Context) ([]sandbox.ProcessInfo, error) {
	if err := s.refused(); err != nil {
		return nil, err
	}
	ctx, cancel := s.bind(ctx)
	defer cancel()
	procs, err := s.client.BackgroundProcesses(ctx)
	if err != nil {
		return nil, s.wrap(fmt.Errorf("list processes of sandbox %s: %w", s.id, err))
	}
	return procs, nil
}

// TreeList has the agent list the workspace from the sandbox's own view (tree.Source).
func (s *Sandbox) TreeList(ctx context.Context, excludes []string) ([]tree.Entry, tree.WalkStats, error) {
	if err := s.refused(); err != nil {
		return nil, tree.WalkStats{}, err
	}
	ctx, cancel := s.bind(ctx)
	defer cancel()
	es, st, err := s.client.TreeList(ctx, excludes)
	if err != nil {
		return nil, st, s.wrap(fmt.Errorf("list sandbox %s: %w", s.id, err))
	}
	return es, st, nil
}

// TreeRead has the agent read files of the workspace (tree.Source).
func (s *Sandbox) TreeRead(ctx context.Context, paths []string, fn func(tree.Entry, io.Reader) error) error {
	if err := s.refused(); err != nil {
		return err
	}
	ctx, cancel := s.bind(ctx)
	defer cancel()
	if err := s.client.TreeRead(ctx, paths, fn); err != nil {
		return s.wrap(fmt.Errorf("read sandbox %s: %w", s.id, err))
	}
	return nil
}

// Ports lists the TCP ports that processes of the sandbox listen on.
func (s *Sandbox) Ports(ctx context.Context) ([]envd.ListeningPort, error) {
	if err := s.refused(); err != nil {
		return nil, err
	}
	ctx, cancel := s.bind(ctx)
	defer cancel()
	ps, err := s.client.Ports(ctx)
	if err != nil {
		return nil, s.wrap(fmt.Errorf("sandbox %s: %w", s.id, err))
	}
	return ps, nil
}
