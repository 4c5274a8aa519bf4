package e2b

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/envd"
	"github.com/toolhost/toolhost/internal/envd/client"
)

// Sandbox is one E2B sandbox. All methods are safe for concurrent use.
type Sandbox struct {
	p            *Provider
	id           string
	project      string
	domain       string // where its hosts live: {port}-{id}.{domain}
	template     string
	envdVersion  string
	trafficToken string // for ports other than envd's, when the sandbox has one
	cpus         int
	memoryMB     int
	log          *slog.Logger
	client       *client.Client
	startedAt    time.Time
	previews     previews
	// touched: a command ran or a file was written through the Sandbox interface, so
	// the workspace holds work and Extract must not merge into it.
	touched atomic.Bool

	mu     sync.Mutex
	endsAt time.Time
	reason string // why it is closed; "" while open

	closeOnce sync.Once
	closeErr  error
}

var _ sandbox.Sandbox = (*Sandbox)(nil)

// ID is E2B's sandbox ID.
func (s *Sandbox) ID() string { return s.id }

// Processes lists the background processes that still run (sandbox.ProcessLister).
func (s *Sandbox) Processes(ctx context.Context) ([]sandbox.ProcessInfo, error) {
	return s.client.BackgroundProcesses(ctx)
}

var (
	_ sandbox.ProcessLister = (*Sandbox)(nil)
	_ sandbox.PortLister    = (*Sandbox)(nil)
)

// Template is the template the sandbox runs; CPUs and MemoryMB its size.
func (s *Sandbox) Template() string { return s.template }

// CPUs is the sandbox's CPU count; MemoryMB its memory.
func (s *Sandbox) CPUs() int     { return s.cpus }
func (s *Sandbox) MemoryMB() int { return s.memoryMB }

// Describe says, for whoever reads it (the agent included), what the workspace is and how
// long its files last.
func (s *Sandbox) Describe() string {
	return fmt.Sprintf("E2B sandbox %s (template %s, %d CPUs, %d MB), workspace %s, ends %s. Its files are %s.",
		s.id, s.template, s.cpus, s.memoryMB, sandbox.WorkspaceRoot, s.EndsAt().UTC().Format(time.RFC3339), durability)
}

// StartedAt is when E2B started the sandbox.
func (s *Sandbox) StartedAt() time.Time { return s.startedAt }

// EndsAt is when E2B will kill the sandbox: endAt as last read or set.
func (s *Sandbox) EndsAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.endsAt
}

// Refresh reads endAt from E2B again (GET /sandboxes/{id}).
func (s *Sandbox) Refresh(ctx context.Context) error {
	d, err := s.p.api.get(ctx, s.id)
	if err != nil {
		return s.wrap(fmt.Errorf("refresh E2B sandbox %s: %w", s.id, err))
	}
	s.mu.Lock()
	s.endsAt = d.EndAt
	s.mu.Unlock()
	return nil
}

// closedErr reports a sandbox that was closed, found gone, or is past its end time (E2B
// has killed it, or is about to). Every call checks it before it sends anything, so it
// wraps ErrNotRun too.
func (s *Sandbox) closedErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reason == "" && !time.Now().Before(s.endsAt) {
		s.reason = "reached its end time at " + s.endsAt.UTC().Format(time.RFC3339)
	}
	if s.reason == "" {
		return nil
	}
	return fmt.Errorf("E2B sandbox %s %s: %w (%w)", s.id, s.reason, sandbox.ErrClosed, sandbox.ErrNotRun)
}

func (s *Sandbox) markGone(reason string) {
	s.mu.Lock()
	if s.reason == "" {
		s.reason = reason
	}
	s.mu.Unlock()
}

// wrap classifies a data-plane failure. A sandbox E2B's proxy no longer knows (HTTP 502
// "The sandbox was not found") is closed. One whose envd stopped answering is killed, as
// the local provider ends a sandbox whose agent stopped answering, and reported closed. A
// failure of the transport (a cut stream, a reset) is checked against the control plane:
// a sandbox that it no longer knows vanished, and is closed too.
func (s *Sandbox) wrap(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, sandbox.ErrClosed) {
		if s.closedErr() == nil {
			s.markGone("is gone (E2B no longer knows it)")
			s.log.Warn("E2B sandbox vanished before its end time", "err", err)
		}
		return err
	}
	if errors.Is(err, sandbox.ErrUnresponsive) {
		s.log.Warn("E2B sandbox's envd stopped answering; killing the sandbox", "err", err)
		ctx, cancel := context.WithTimeout(context.Background(), s.p.cfg.RequestTimeout)
		_ = s.shutdown(ctx, "stopped answering")
		cancel()
		return fmt.Errorf("E2B sandbox %s stopped answering and was ended: %w", s.id, errors.Join(sandbox.ErrClosed, err))
	}
	if !transportFailure(err) {
		return err
	}
	// A transport failure: is the sandbox still there?
	ctx, cancel := context.WithTimeout(context.Background(), min(s.p.cfg.RequestTimeout, 10*time.Second))
	defer cancel()
	if _, gerr := s.p.api.get(ctx, s.id); errors.Is(gerr, sandbox.ErrClosed) {
		s.markGone("vanished (E2B no longer knows it)")
		s.log.Warn("E2B sandbox vanished during a call", "err", err)
		return fmt.Errorf("E2B sandbox %s vanished: %w: %w", s.id, sandbox.ErrClosed, err)
	}
	return err
}

// transportFailure: the exchange with envd broke (a reset, a stream cut short), as opposed
// to an answer envd gave or a call the caller gave up on.
func transportFailure(err error) bool {
	var ee *envd.Error
	if errors.As(err, &ee) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var ue *url.Error
	var ne net.Error
	var cut *client.StreamCutError
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.As(err, &ue) || errors.As(err, &ne) ||
		errors.As(err, &cut)
}

// SetTimeout moves the end time to now+d (POST /sandboxes/{id}/timeout), within the
// plan's maximum lifetime from the sandbox's start.
func (s *Sandbox) SetTimeout(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("set timeout of E2B sandbox %s: %s is not positive", s.id, d)
	}
	if err := s.closedErr(); err != nil {
		return fmt.Errorf("set timeout: %w", err)
	}
	end := time.Now().Add(d)
	limit := s.startedAt.Add(s.p.cfg.Plan.MaxLifetime)
	if end.After(limit) {
		return fmt.Errorf("set timeout of E2B sandbox %s to %s: it would end at %s, past the plan's maximum lifetime of %s (it must end by %s)",
			s.id, d, end.UTC().Format(time.RFC3339), s.p.cfg.Plan.MaxLifetime, limit.UTC().Format(time.RFC3339))
	}
	if err := s.p.api.setTimeout(ctx, s.id, int(math.Ceil(d.Seconds()))); err != nil {
		return s.wrap(fmt.Errorf("set timeout: %w", err))
	}
	s.mu.Lock()
	s.endsAt = end // E2B counts from when it got the request, a little later: never later than E2B
	s.mu.Unlock()
	if q := s.p.cfg.Quota; q != nil {
		q.Extended(ctx, s.id, end, s.log)
	}
	return nil
}

// Close kills the sandbox (DELETE /sandboxes/{id}); one E2B no longer knows is not an
// error. It is idempotent.
func (s *Sandbox) Close(ctx context.Context) error {
	return s.shutdown(ctx, "was closed")
}

func (s *Sandbox) shutdown(ctx context.Context, reason string) error {
	s.closeOnce.Do(func() {
		s.markGone(reason)
		s.previews.close()
		s.client.Close()
		// The kill is bounded by the API's own timeout, not ctx: a sandbox left running
		// costs until its end time.
		s.closeErr = s.p.api.kill(context.WithoutCancel(ctx), s.id)
		if s.closeErr != nil {
			s.closeErr = fmt.Errorf("close E2B sandbox %s: %w", s.id, s.closeErr)
		}
		if q := s.p.cfg.Quota; q != nil {
			q.Closed(context.WithoutCancel(ctx), s.id, time.Now(), s.log)
		}
	})
	return s.closeErr
}

// Exec runs a foreground command; its whole process group dies at the timeout.
func (s *Sandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	if err := s.closedErr(); err != nil {
		return sandbox.ExecResult{}, err
	}
	s.touched.Store(true)
	res, err := s.client.Exec(ctx, req)
	if err == nil && len(req.Argv) > 0 && res.ExitCode == 127 && notStarted(res.Stderr, req.Argv[0]) {
		// timeout(1), the wrapper every command runs under, could not start it: what envd
		// itself reports for a program that does not exist, as an error.
		return res, fmt.Errorf("exec %s: executable not found: %w", req.Argv[0], sandbox.ErrNotFound)
	}
	return res, s.wrap(err)
}

// notStarted reports whether stderr is timeout(1)'s own line for a program it could not
// find ("timeout: failed to run command 'x': No such file or directory", the quotes as
// the locale writes them).
func notStarted(stderr []byte, prog string) bool {
	line, _, _ := bytes.Cut(stderr, []byte("\n"))
	return bytes.HasPrefix(line, []byte("timeout: failed to run command ")) && bytes.Contains(line, []byte(prog)) &&
		bytes.HasSuffix(line, []byte(": No such file or directory"))
}

// Start runs a background command that lives until the sandbox ends, logging to
// /tmp/toolhost/{id}.log.
func (s *Sandbox) Start(ctx context.Context, req sandbox.ExecRequest) (sandbox.Process, error) {
	if err := s.closedErr(); err != nil {
		return sandbox.Process{}, err
	}
	s.touched.Store(true)
	pr, err := s.client.Start(ctx, req)
	return pr, s.wrap(err)
}
