package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
)

var (
	_ sandbox.Sandbox = (*Workspace)(nil)
	_ sandbox.Wrapper = (*Workspace)(nil)

	_ sandbox.GuardedFiles = (*Workspace)(nil)
)

// Unwrap is the sandbox under the session now: its abilities (sandbox.As) are the
// session's too. Nil once the session is fenced off (Config.Fence): its sandbox is no
// one's to use.
func (s *Workspace) Unwrap() sandbox.Sandbox {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.fenced() != nil {
		return nil
	}
	return s.sb
}

// do runs op on the current sandbox. If the sandbox turns out to be gone (a sign of
// trouble: it died before its cached end, or stopped answering), the session replaces it
// (or waits for the rotation under way to), and an op that can safely run twice runs once
// more, on the new sandbox. One that cannot (a command: it may have done half its work)
// runs again only when the sandbox refused it before doing any of it (the error wraps
// sandbox.ErrNotRun); else it fails with an error that says the sandbox was replaced.
func do[T any](ctx context.Context, s *Workspace, op func(sandbox.Sandbox) (T, error)) (T, error) {
	return doOp(ctx, s, 0, true, op)
}

// doOp is do for an op that may run need (current) and, unless repeatable, must not run
// twice.
func doOp[T any](ctx context.Context, s *Workspace, need time.Duration, repeatable bool, op func(sandbox.Sandbox) (T, error)) (T, error) {
	for attempt := 0; ; attempt++ {
		sb, release, err := s.current(ctx, need)
		if err != nil {
			var zero T
			return zero, err
		}
		v, err := op(sb)
		release()
		if attempt == 0 && errors.Is(err, sandbox.ErrClosed) && ctx.Err() == nil {
			s.log.Warn("session: sandbox reported closed; recovering", "sandbox", sb.ID(), "err", err)
			s.recoverFrom(ctx, sb)
			if repeatable || errors.Is(err, sandbox.ErrNotRun) {
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

// recoverFrom is called after a call found sb ended. A rotation under way is waited for
// (sb may have ended under its save ahead: its end came sooner than the session knew);
// if sb is still the session's sandbox then, the session asks it and replaces it when it
// is gone. The caller's next current gives sb's replacement, or sb if it is alive after all.
func (s *Workspace) recoverFrom(ctx context.Context, sb sandbox.Sandbox) {
	for range 3 {
		s.mu.RLock()
		if s.closed || s.sb != sb {
			s.mu.RUnlock()
			return // replaced already
		}
		rotating, moved := s.rotating, s.moved
		s.mu.RUnlock()
		if !rotating {
			s.maintain(ctx, true, 0)
			return
		}
		if await(ctx, moved) != nil {
			return
		}
	}
}

// replaceIfStuck is called after a command of sb could not start for want of processes,
// descriptors or memory. If a trivial command cannot start either, what runs in sb has
// taken them for good (a fork bomb, limits lowered under the agent): the sandbox is as
// good as dead, and it is replaced as one would be, its workspace saved or handed over
// (rotate at its last call). It reports whether sb is no longer the session's sandbox.
func (s *Workspace) replaceIfStuck(ctx context.Context, sb sandbox.Sandbox, cause error) bool {
	pctx, cancel := context.WithTimeout(ctx, stuckProbeBound)
	_, err := sb.Exec(pctx, sandbox.ExecRequest{Argv: []string{"true"}, Timeout: stuckProbeBound})
	cancel()
	if !errors.Is(err, sandbox.ErrCannotStart) {
		return false
	}
	s.rotMu.Lock() // after a rotation under way, which may replace sb itself
	defer s.rotMu.Unlock()
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
func (s *Workspace) ID() string { return "session-" + s.cfg.ProjectID }

// SandboxID names the sandbox currently under the session.
func (s *Workspace) SandboxID() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.sb.ID()
}

func (s *Workspace) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	return doOp(ctx, s, execBound(ctx, req.Timeout), false, func(sb sandbox.Sandbox) (sandbox.ExecResult, error) { return sb.Exec(ctx, req) })
}

// execBound is how long a command may run: its timeout, else what is left of ctx, else 0
// (unknown: the session cannot plan for it).
func execBound(ctx context.Context, timeout time.Duration) time.Duration {
	if timeout > 0 {
		return timeout
	}
	if d, ok := ctx.Deadline(); ok {
		return max(time.Until(d), 0)
	}
	return 0
}

func (s *Workspace) ReadFile(ctx context.Context, path string, maxBytes int64) ([]byte, error) {
	return do(ctx, s, func(sb sandbox.Sandbox) ([]byte, error) { return sb.ReadFile(ctx, path, maxBytes) })
}

func (s *Workspace) WriteFile(ctx context.Context, path string, data []byte) error {
	_, err := do(ctx, s, func(sb sandbox.Sandbox) (struct{}, error) { return struct{}{}, sb.WriteFile(ctx, path, data) })
	return err
}

// ReadFileGuarded and WriteFileGuarded run on the current sandbox's GuardedFiles; under
// one without it they fail with an error wrapping sandbox.ErrUnsupported (the caller then
// checks on its own).
func (s *Workspace) ReadFileGuarded(ctx context.Context, path string, maxBytes int64, g sandbox.FileGuard) ([]byte, error) {
	return do(ctx, s, func(sb sandbox.Sandbox) ([]byte, error) {
		gf, ok := sandbox.As[sandbox.GuardedFiles](sb)
		if !ok {
			return nil, fmt.Errorf("guarded read of %s: %w", path, sandbox.ErrUnsupported)
		}
		return gf.ReadFileGuarded(ctx, path, maxBytes, g)
	})
}

// A write is replaced whole (a new file renamed over the old), so one cut short left the
// old contents and running it again is safe. A versioned write run again may find its
// first try landed before the sandbox ended (the file then holds data, not the version
// the guard names): that is its success, not ErrChanged.
func (s *Workspace) WriteFileGuarded(ctx context.Context, path string, data []byte, g sandbox.FileGuard) error {
	tries := 0
	_, err := do(ctx, s, func(sb sandbox.Sandbox) (struct{}, error) {
		gf, ok := sandbox.As[sandbox.GuardedFiles](sb)
		if !ok {
			return struct{}{}, fmt.Errorf("guarded write of %s: %w", path, sandbox.ErrUnsupported)
		}
		tries++
		err := gf.WriteFileGuarded(ctx, path, data, g)
		if tries > 1 && g.Versioned && errors.Is(err, sandbox.ErrChanged) {
			cur, rerr := gf.ReadFileGuarded(ctx, path, int64(len(data))+1, sandbox.FileGuard{NoLinks: g.NoLinks})
			if rerr == nil && sandbox.FileVersion(cur) == sandbox.FileVersion(data) {
				return struct{}{}, nil
			}
		}
		return struct{}{}, err
	})
	return err
}

func (s *Workspace) StatGuarded(ctx context.Context, path string, g sandbox.FileGuard) (sandbox.FileInfo, error) {
	return do(ctx, s, func(sb sandbox.Sandbox) (sandbox.FileInfo, error) {
		gf, ok := sandbox.As[sandbox.GuardedFiles](sb)
		if !ok {
			return sandbox.FileInfo{}, fmt.Errorf("guarded stat of %s: %w", path, sandbox.ErrUnsupported)
		}
		return gf.StatGuarded(ctx, path, g)
	})
}

func (s *Workspace) ListGuarded(ctx context.Context, req sandbox.ListRequest, g sandbox.FileGuard) (sandbox.ListResult, error) {
	return do(ctx, s, func(sb sandbox.Sandbox) (sandbox.ListResult, error) {
		gf, ok := sandbox.As[sandbox.GuardedFiles](sb)
		if !ok {
			return sandbox.ListResult{}, fmt.Errorf("guarded list of %s: %w", req.Path, sandbox.ErrUnsupported)
		}
		return gf.ListGuarded(ctx, req, g)
	})
}

func (s *Workspace) RemoveFileGuarded(ctx context.Context, path string, g sandbox.FileGuard) error {
	tries := 0
	_, err := do(ctx, s, func(sb sandbox.Sandbox) (struct{}, error) {
		gf, ok := sandbox.As[sandbox.GuardedFiles](sb)
		if !ok {
			return struct{}{}, fmt.Errorf("guarded remove of %s: %w", path, sandbox.ErrUnsupported)
		}
		tries++
		return struct{}{}, goneOnRetry(tries, gf.RemoveFileGuarded(ctx, path, g))
	})
	return err
}

// goneOnRetry: an op that makes something go away (a removal, a kill) and finds nothing
// when run again, its first try cut short by the sandbox's end, may have done it then; what
// was asked for holds either way, so it succeeded.
func goneOnRetry(tries int, err error) error {
	if tries > 1 && (errors.Is(err, sandbox.ErrNotFound) || errors.Is(err, fs.ErrNotExist)) {
		return nil
	}
	return err
}

func (s *Workspace) Stat(ctx context.Context, path string) (sandbox.FileInfo, error) {
	return do(ctx, s, func(sb sandbox.Sandbox) (sandbox.FileInfo, error) { return sb.Stat(ctx, path) })
}

func (s *Workspace) List(ctx context.Context, req sandbox.ListRequest) (sandbox.ListResult, error) {
	return do(ctx, s, func(sb sandbox.Sandbox) (sandbox.ListResult, error) { return sb.List(ctx, req) })
}

// Archive runs again on a replacement only if nothing reached w: a stream begun cannot
// be begun again.
func (s *Workspace) Archive(ctx context.Context, w io.Writer, excludes []string) error {
	_, err := doOp(ctx, s, 0, false, func(sb sandbox.Sandbox) (struct{}, error) {
		cw := &countingWriter{w: w}
		err := sb.Archive(ctx, cw, excludes)
		if err != nil && cw.n == 0 && errors.Is(err, sandbox.ErrClosed) {
			err = fmt.Errorf("%w (%w)", err, sandbox.ErrNotRun)
		}
		return struct{}{}, err
	})
	return err
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// Extract does not run again on a replacement: r is read already, and the workspace it
// left half filled was handed over.
func (s *Workspace) Extract(ctx context.Context, r io.Reader) error {
	_, err := doOp(ctx, s, 0, false, func(sb sandbox.Sandbox) (struct{}, error) { return struct{}{}, sb.Extract(ctx, r) })
	return err
}

// StartedAt is when the current sandbox started.
func (s *Workspace) StartedAt() time.Time {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.sb.StartedAt()
}

// EndsAt is the cached end of the current sandbox; the session acts before it.
func (s *Workspace) EndsAt() time.Time {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.endsAt
}

// SetTimeout extends the current sandbox.
func (s *Workspace) SetTimeout(ctx context.Context, d time.Duration) error {
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
