package mcpserve

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/toolhost/toolhost/internal/rootapi"
)

// DefaultOrphanAfter is how long a project's sandboxes wait, nobody holding the project,
// before a replica kills them (serve.fleet.orphan_after's default).
const DefaultOrphanAfter = 15 * time.Minute

// reapOrphans runs until ctx ends: every so often (a third of the orphan bound, at most
// a minute, jittered so that replicas do not list at once) it kills the orphans of the
// fleet, the sandboxes whose project nobody has held for longer than the bound
// (rootapi.ReapOrphans). A replica whose provider cannot list or kill its sandboxes
// finds none. The same pass deletes the stale records of stateless sessions
// (reapHandles).
func (s *Server) reapOrphans(ctx context.Context) {
	after := s.opts.OrphanAfter
	if after <= 0 {
		after = DefaultOrphanAfter
	}
	every := min(after/3, time.Minute)
	for {
		wait := every/2 + rand.N(every)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		rctx, cancel := context.WithTimeout(ctx, every)
		killed, err := rootapi.ReapOrphans(rctx, s.th, after)
		s.metrics.orphansReaped.Add(int64(len(killed)))
		if err != nil && ctx.Err() == nil {
			s.log.Warn("fleet: reaping orphan sandboxes", "err", err)
		}
		n, err := s.reapHandles(rctx)
		cancel()
		s.metrics.handlesReaped.Add(int64(n))
		if err != nil && ctx.Err() == nil {
			s.log.Warn("fleet: reaping stale session records", "err", err)
		}
	}
}
