package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/toolhost/toolhost/core/sandbox"
)

var _ sandbox.Handoff = (*Provider)(nil)

// Handoff ends old and starts a new sandbox over the same workspace. A local workspace is
// a host directory that outlives the bubblewrap process mounting it, so a rotation does not
// have to copy the tree out and back in: every process of old is dead before the new
// sandbox starts, and a private workspace moves (one rename) into the new sandbox's run
// dir, staying private. opts.Workspace is ignored: the workspace is old's.
func (p *Provider) Handoff(ctx context.Context, old sandbox.Sandbox, opts sandbox.CreateOptions) (sandbox.Sandbox, error) {
	o, ok := old.(*Sandbox)
	if !ok || o.p != p {
		return nil, fmt.Errorf("handoff: sandbox %s is not one of this provider's", old.ID())
	}
	if err := o.closedErr(); err != nil {
		return nil, fmt.Errorf("handoff from %s: %w", o.id, err)
	}
	timeout, err := p.check(opts)
	if err != nil {
		return nil, fmt.Errorf("handoff: %w", err)
	}
	id := newID()
	runDir := filepath.Join(p.cfg.RunDir, id)
	if err := os.Mkdir(runDir, 0o700); err != nil {
		return nil, fmt.Errorf("handoff to %s: run dir: %w", id, err)
	}
	ws := o.workspace
	private := ws == filepath.Join(o.runDir, "workspace")
	var moveErr error
	o.shutdownThen("was handed off to "+id, func() bool {
		if private {
			dst := filepath.Join(runDir, "workspace")
			if moveErr = os.Rename(ws, dst); moveErr == nil {
				ws = dst
			}
		}
		return moveErr == nil
	})
	if moveErr != nil {
		_ = os.RemoveAll(runDir)
		return nil, fmt.Errorf("handoff to %s: move workspace: %w", id, moveErr)
	}
	s, err := p.start(ctx, id, ws, runDir, timeout, opts)
	if err != nil {
		_ = os.RemoveAll(runDir) // a private workspace goes with it: the caller restores
		return nil, fmt.Errorf("handoff to %s: %w", id, err)
	}
	p.log.Info("sandbox handed off", "from", o.id, "to", id)
	return s, nil
}
