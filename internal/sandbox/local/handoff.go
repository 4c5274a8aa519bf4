//go:build linux

package local

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/cgroup"
	"golang.org/x/sys/unix"
)

var (
	_ sandbox.Handoff        = (*Provider)(nil)
	_ sandbox.HandoffChecker = (*Provider)(nil)
)

// CanHandoff reports whether old (or a sandbox it wraps) is one of this provider's.
func (p *Provider) CanHandoff(old sandbox.Sandbox) bool {
	o, ok := sandbox.As[*Sandbox](old)
	return ok && o.p == p
}

// Handoff ends old and starts a new sandbox over the same workspace. A local workspace is
// a host directory (or a volume mounted on one) that outlives the bubblewrap process
// mounting it, so a rotation does not have to copy the tree out and back in: every process
// of old is dead before the new sandbox starts, and the workspace object passes to the new
// sandbox as it is (a mount point stays where it is). old may have died already (its agent
// stopped answering, it reached its end time): its workspace was kept for this.
// old may be a wrapper of one of this provider's sandboxes (sandbox.As finds it).
// opts.Workspace is ignored: the workspace is old's.
func (p *Provider) Handoff(ctx context.Context, old sandbox.Sandbox, opts sandbox.CreateOptions) (sandbox.Sandbox, error) {
	o, ok := sandbox.As[*Sandbox](old)
	if !ok || o.p != p {
		return nil, fmt.Errorf("handoff: sandbox %s is not one of this provider's: %w", old.ID(), sandbox.ErrForeign)
	}
	timeout, err := p.check(opts)
	if err != nil {
		return nil, fmt.Errorf("handoff: %w", err)
	}
	// A spare takes the workspace when there is one: the pause is then ending old and
	// attaching the workspace, not starting a sandbox (pool.go).
	var spare *Sandbox
	if p.pool != nil {
		p.pool.want(opts)
		spare = p.pool.take(opts)
	}
	id := newID()
	if spare != nil {
		id = spare.id
	}
	ws := p.retire(o, "was handed off to "+id)
	if ws == nil {
		if spare != nil {
			spare.shutdown("was a spare for a handoff that had no workspace")
		}
		return nil, fmt.Errorf("handoff from %s: its workspace was released already: %w", o.id, errors.Join(sandbox.ErrClosed, sandbox.ErrNotFound))
	}
	if spare != nil {
		err := spare.takeOver(ctx, ws, timeout)
		if err == nil {
			p.log.Info("sandbox handed off", "from", o.id, "to", id, "spare", true)
			return spare, nil
		}
		// takeOver ended the spare, so ws is attached nowhere now: start one over it.
		p.log.Warn("a spare sandbox could not take the workspace; starting one", "err", err)
		id = newID()
	}
	s, err := p.start(ctx, id, ws, timeout, opts)
	if err != nil {
		// The workspace holds the only copy of work since the last snapshot: keep it with
		// old, whose Close releases it, so the caller can still restore or retry.
		o.mu.Lock()
		o.ws = ws
		o.mu.Unlock()
		// (o is dead or dying: retire ended it. Its Close waits for that and releases ws.)
		return nil, fmt.Errorf("handoff to %s: %w", id, err)
	}
	p.log.Info("sandbox handed off", "from", o.id, "to", id)
	return s, nil
}

// freezeBound is how long a handoff waits for the old sandbox's processes to stop before
// it kills them on its own time instead: a process in an uninterruptible sleep (a slow
// disk) holds a freeze until its system call returns.
const freezeBound = 250 * time.Millisecond

// killOnHandoff makes retire kill the old sandbox before it returns, as before the
// freeze: set only by BenchmarkHandoff, which measures both ways in one run.
var killOnHandoff = false

// retire ends o for a handoff and returns its workspace (nil when it was released
// already). Every process of o must be stopped before the workspace goes to another
// sandbox, but it need not be dead: dying is the teardown of bubblewrap's pid namespace,
// 190-270 ms of a rotation's pause at load 40 (docs/BENCHMARKS.md), while stopping is a
// freeze of o's cgroup, a millisecond. So o is frozen, marked ended (no call reaches its
// agent), its workspace taken, and its shutdown (the kill, the cleanup) runs on a
// goroutine owned by the provider, which Close waits for. A frozen process runs no
// instruction again, so nothing of o touches the workspace once this returns, with one
// exception the kill had not: a Linux AIO write (io_submit) issued before the freeze may
// still land, since exit waits for it and a freeze does not (io_uring is refused by the
// seccomp filter; AIO is allowed, as databases use it). Where there is no freezer, or the
// freeze does not finish within freezeBound, o is shut down here as before.
func (p *Provider) retire(o *Sandbox, reason string) *workspace {
	if killOnHandoff || !o.freeze(p.freezeWait) {
		o.shutdown(reason)
		return o.takeWorkspace()
	}
	o.mu.Lock()
	if o.reason == "" {
		o.reason = reason
	}
	ws := o.ws
	o.ws = nil
	o.mu.Unlock()
	p.retired.Add(1)
	go func() { // owned by the provider: Close waits for p.retired
		defer p.retired.Done()
		o.shutdown(reason)
	}()
	return ws
}

// freeze stops every process of the sandbox through its cgroup's freezer, and reports
// whether they all stopped within bound. kill then calls killFrozen first.
func (s *Sandbox) freeze(bound time.Duration) bool {
	if s.cg == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	if err := s.cg.Freeze(ctx); err != nil {
		if !errors.Is(err, cgroup.ErrNoFreezer) && !errors.Is(err, cgroup.ErrClosed) {
			s.log.Warn("freeze the sandbox for a handoff; killing it instead", "err", err)
		}
		return false
	}
	s.frozen.Store(true)
	return true
}

// killFrozen is kill's first step for a frozen sandbox. Its processes must die without
// running again, and bubblewrap, frozen too, must still reap the first one (or the
// kernel hands that to the machine's pid 1 as a zombie). A SIGKILL reaches a process
// frozen through cgroup v2: the first process dies, and the kernel kills every process
// of its pid namespace and waits for them before the pidfd says it exited. Only bubblewrap
// is left then, outside that namespace and the host's own: thawing lets it reap and
// exit. Without a pidfd, or through the v1 freezer (where the signal waits for a thaw,
// which would let the others run first), or past 5 s, the cgroup is killed whole
// (killGroup signals while frozen, then thaws) and kill goes on as for any sandbox.
func (s *Sandbox) killFrozen(killGroup func()) {
	if s.initFD >= 0 {
		_ = unix.PidfdSendSignal(s.initFD, unix.SIGKILL, nil, 0)
		fds := []unix.PollFd{{Fd: int32(s.initFD), Events: unix.POLLIN}}
		deadline := time.Now().Add(5 * time.Second) // a pid namespace's teardown: 190-270 ms at load 40
		for {
			n, err := unix.Poll(fds, int(time.Until(deadline).Milliseconds())+1)
			if n > 0 {
				if err := s.cg.Thaw(); err != nil {
					s.log.Warn("thaw the frozen sandbox's bubblewrap", "err", err)
					break
				}
				return
			}
			if (err != nil && !errors.Is(err, unix.EINTR)) || time.Now().After(deadline) {
				break
			}
		}
	}
	killGroup()
}
