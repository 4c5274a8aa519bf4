package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
)

var (
	_ sandbox.Sandbox = (*Session)(nil)
	_ sandbox.Wrapper = (*Session)(nil)

	_ sandbox.GuardedFiles = (*Session)(nil)
)

// Unwrap is the sandbox under the session now: its abilities (sandbox.As) are the
// session's too. Nil once the session is fenced off (Config.Fence): its sandbox is no
// one's to use.
func (s *Session) Unwrap() sandbox.Sandbox {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.fenced() != nil {
		return nil
	}
	return s.sb
}

// do runs op on the current sandbox. If the sandbox turns out to be gone (a sign of
// trouble: it died before its cached end, or stopped answering), the session replaces it,
// and an op that can safely run twice runs once more. One that cannot (a command: it may
// have done half its work) fails with an error that says the sandbox was replaced.
func do[T any](ctx context.Context, s *Session, op func(sandbox.Sandbox) (T, error)) (T, error) {
	return doOp(ctx, s, true, op)
}

func doOp[T any](ctx context.Context, s *Session, repeatable bool, op func(sandbox.Sandbox) (T, error)) (T, error) {
	for attempt := 0; ; attempt++ {
		sb, release, err := s.current(ctx)
		if err != nil {
			var zero T
			return zero, err
		}
		v, err := op(sb)
		release()
		if attempt == 0 && errors.Is(err, sandbox.ErrClosed) && ctx.Err() == nil {
			s.log.Warn("session: sandbox reported closed; recovering", "sandbox", sb.ID(), "err", err)
			s.maintain(ctx, true)
			if repeatable {
				continue
			}
			return v, fmt.Errorf("%w; %w", err, ErrReplaced)
		}
		if attempt == 0 && errors.Is(err, sandbox.ErrCannotStart) && ctx.Err() == nil && s.replaceIfStuck(ctx, sb, err) {
			continue // it never started: run it on the new sandbox
		}
		return v, err
	}
}

// replaceIfStuck is called after a command of sb could not start for want of processes,
// descriptors or memory. If a trivial command cannot start either, what runs in sb has
// taken them for good (a fork bomb, limits lowered under the agent): the sandbox is as
// good as dead, and it is replaced as one would be, its workspace saved or handed over
// (rotate at its last call). It reports whether sb is no longer the session's sandbox.
func (s *Session) replaceIfStuck(ctx context.Context, sb sandbox.Sandbox, cause error) bool {
	pctx, cancel := context.WithTimeout(ctx, stuckProbeBound)
	_, err := sb.Exec(pctx, sandbox.ExecRequest{Argv: []string{"true"}, Timeout: stuckProbeBound})
	cancel()
	if !errors.Is(err, sandbox.ErrCannotStart) {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.sb == sb {
		s.log.Warn("session: the sandbox can no longer start commands; replacing it", "sandbox", sb.ID(), "err", cause)
		s.rotateFor(context.WithoutCancel(ctx), true, nil, true)
	}
	return s.sb != sb
}

// stuckProbeBound bounds the trivial command that tells a stuck sandbox from a busy one.
const stuckProbeBound = 30 * time.Second

// ErrReplaced: the sandbox ended during a command (it stopped answering, or something in
// it killed its agent) and the session replaced it. The command did not finish and was
// not run again. Whether the files were kept (a handoff) or are those of the last
// snapshot, the session's Notice says.
var ErrReplaced = errors.New("the sandbox ended during the command and was replaced; the command did not finish: run it again if it is still needed")

// ID names the session; the sandbox under it changes with each rotation.
func (s *Session) ID() string { return "session-" + s.cfg.ProjectID }

// SandboxID names the sandbox currently under the session.
func (s *Session) SandboxID() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.sb.ID()
}

func (s *Session) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	return doOp(ctx, s, false, func(sb sandbox.Sandbox) (sandbox.ExecResult, error) { return sb.Exec(ctx, req) })
}

func (s *Session) ReadFile(ctx context.Context, path string, maxBytes int64) ([]byte, error) {
	return do(ctx, s, func(sb sandbox.Sandbox) ([]byte, error) { return sb.ReadFile(ctx, path, maxBytes) })
}

func (s *Session) WriteFile(ctx context.Context, path string, data []byte) error {
	_, err := do(ctx, s, func(sb sandbox.Sandbox) (struct{}, error) { return struct{}{}, sb.WriteFile(ctx, path, data) })
	return err
}

// ReadFileGuarded and WriteFileGuarded run on the current sandbox's GuardedFiles; under
// one without it they fail with an error wrapping sandbox.ErrUnsupported (the caller then
// checks on its own).
func (s *Session) ReadFileGuarded(ctx context.Context, path string, maxBytes int64, g sandbox.FileGuard) ([]byte, error) {
	return do(ctx, s, func(sb sandbox.Sandbox) ([]byte, error) {
		gf, ok := sandbox.As[sandbox.GuardedFiles](sb)
		if !ok {
			return nil, fmt.Errorf("guarded read of %s: %w", path, sandbox.ErrUnsupported)
		}
		return gf.ReadFileGuarded(ctx, path, maxBytes, g)
	})
}

func (s *Session) WriteFileGuarded(ctx context.Context, path string, data []byte, g sandbox.FileGuard) error {
	_, err := do(ctx, s, func(sb sandbox.Sandbox) (struct{}, error) {
		gf, ok := sandbox.As[sandbox.GuardedFiles](sb)
		if !ok {
			return struct{}{}, fmt.Errorf("guarded write of %s: %w", path, sandbox.ErrUnsupported)
		}
		return struct{}{}, gf.WriteFileGuarded(ctx, path, data, g)
	})
	return err
}

func (s *Session) StatGuarded(ctx context.Context, path string, g sandbox.FileGuard) (sandbox.FileInfo, error) {
	return do(ctx, s, func(sb sandbox.Sandbox) (sandbox.FileInfo, error) {
		gf, ok := sandbox.As[sandbox.GuardedFiles](sb)
		if !ok {
			return sandbox.FileInfo{}, fmt.Errorf("guarded stat of %s: %w", path, sandbox.ErrUnsupported)
		}
		return gf.StatGuarded(ctx, path, g)
	})
}

func (s *Session) ListGuarded(ctx context.Context, req sandbox.ListRequest, g sandbox.FileGuard) (sandbox.ListResult, error) {
	return do(ctx, s, func(sb sandbox.Sandbox) (sandbox.ListResult, error) {
		gf, ok := sandbox.As[sandbox.GuardedFiles](sb)
		if !ok {
			return sandbox.ListResult{}, fmt.Errorf("guarded list of %s: %w", req.Path, sandbox.ErrUnsupported)
		}
		return gf.ListGuarded(ctx, req, g)
	})
}

func (s *Session) RemoveFileGuarded(ctx context.Context, path string, g sandbox.FileGuard) error {
	_, err := do(ctx, s, func(sb sandbox.Sandbox) (struct{}, error) {
		gf, ok := sandbox.As[sandbox.GuardedFiles](sb)
		if !ok {
			return struct{}{}, fmt.Errorf("guarded remove of %s: %w", path, sandbox.ErrUnsupported)
		}
		return struct{}{}, gf.RemoveFileGuarded(ctx, path, g)
	})
	return err
}

func (s *Session) Stat(ctx context.Context, path string) (sandbox.FileInfo, error) {
	return do(ctx, s, func(sb sandbox.Sandbox) (sandbox.FileInfo, error) { return sb.Stat(ctx, path) })
}

func (s *Session) List(ctx context.Context, req sandbox.ListRequest) (sandbox.ListResult, error) {
	return do(ctx, s, func(sb sandbox.Sandbox) (sandbox.ListResult, error) { return sb.List(ctx, req) })
}

func (s *Session) Archive(ctx context.Context, w io.Writer, excludes []string) error {
	_, err := do(ctx, s, func(sb sandbox.Sandbox) (struct{}, error) { return struct{}{}, sb.Archive(ctx, w, excludes) })
	return err
}

func (s *Session) Extract(ctx context.Context, r io.Reader) error {
	_, err := do(ctx, s, func(sb sandbox.Sandbox) (struct{}, error) { return struct{}{}, sb.Extract(ctx, r) })
	return err
}

// StartedAt is when the current sandbox started.
func (s *Session) StartedAt() time.Time {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.sb.StartedAt()
}

// EndsAt is the cached end of the current sandbox; the session acts before it.
func (s *Session) EndsAt() time.Time {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.endsAt
}

// SetTimeout extends the current sandbox.
func (s *Session) SetTimeout(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if err := s.fenced(); err != nil {
		return err
	}
	if err := s.sb.SetTimeout(ctx, d); err != nil {
		return err
	}
	s.noteEnd(s.sb.EndsAt())
	return nil
}
