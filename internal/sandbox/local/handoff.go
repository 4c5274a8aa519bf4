//go:build linux

package local

import (
	"context"
	"errors"
	"fmt"

	"github.com/toolhost/toolhost/core/sandbox"
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
	o.shutdown("was handed off to " + id)
	ws := o.takeWorkspace()
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
		return nil, fmt.Errorf("handoff to %s: %w", id, err)
	}
	p.log.Info("sandbox handed off", "from", o.id, "to", id)
	return s, nil
}
