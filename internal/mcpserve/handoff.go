package mcpserve

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/internal/rootapi"
)

// A replica of a fleet stopped with serve.drain handoff (Options.Drain) hands its
// sessions over instead of closing them, so a rolling deploy restarts no agent's dev
// server: Drain marks the replica draining (/readyz answers 503, its registry record says
// so, and a request for a project nobody holds is forwarded to a replica that is not
// draining), then hands each session over as soon as the call it runs, if any, has
// ended: the workspace committed, a sandbox that lives apart from this process (E2B)
// left running, the project's lease released. The client's next request, on any replica,
// opens the project there, which connects to that sandbox; the MCP session is adopted
// under its id (fleet.go). A call that arrives for a session while it is being handed
// over waits at the routing until the handoff has ended, then goes where the project
// went (a replica that is not draining); only one that passed the routing just before
// the handoff began is answered with an error saying to make it again.

// errMoving answers a call that arrived while its session was handed over.
var errMoving = errors.New("this session is moving to another server of the fleet (a deploy); make the call again: it will run there, on the same workspace")

// drainSettle is how long Drain waits after marking the replica draining for balancers
// to stop sending it requests (their readiness checks of /readyz) before it hands over.
const drainSettle = 2 * time.Second

// begin is b's session for one call, opening it on the first; done ends the call. A
// session being handed over answers errMoving.
func (b *binding) begin(ctx context.Context) (*toolhost.Session, func(), error) {
	b.mu.Lock()
	if b.moving {
		b.mu.Unlock()
		return nil, nil, errMoving
	}
	b.active.Add(1)
	b.mu.Unlock()
	sess, err := b.session(ctx)
	if err != nil {
		b.active.Done()
		return nil, nil, err
	}
	return sess, b.active.Done, nil
}

// handoff hands b's session over (see the top of this file), once its calls have ended
// or ctx has.
func (b *binding) handoff(ctx context.Context) error {
	b.mu.Lock()
	if b.moving {
		b.mu.Unlock()
		return nil
	}
	b.moving = true
	b.handing = make(chan struct{})
	defer close(b.handing)
	b.mu.Unlock()
	idle := make(chan struct{})
	go func() { // owned by handoff: ends when the calls do, which ctx bounds (they are cancelled at the end)
		b.active.Wait()
		close(idle)
	}()
	select {
	case <-idle:
	case <-ctx.Done():
		return fmt.Errorf("waiting for the calls of project %s to end: %w", b.project, ctx.Err())
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended || b.sess == nil {
		return nil
	}
	s := b.srv
	kept, err := rootapi.Handoff(ctx, b.sess)
	b.ended, b.handedOver = true, true
	close(b.gone)
	// The MCP session stays open here until Shutdown, after the HTTP server has
	// finished the requests under way: the answer to the call just ended is still on its
	// way to the client.
	b.let()
	if err != nil {
		s.log.Error("fleet: handing a session over", "project", b.project, "kept_sandbox", kept, "err", err)
		return fmt.Errorf("handing project %s over: %w", b.project, err)
	}
	s.metrics.handedOver.Add(1)
	s.log.Info("fleet: session handed over", "project", b.project, "kept_sandbox", kept)
	return nil
}

// handingOver returns a channel closed when the handoff of a session of project on this
// replica has ended, or nil when none is being handed over. A request for the project
// that reaches this replica meanwhile waits for it, then goes where the project went
// (route), instead of being answered errMoving.
func (s *Server) handingOver(project string) <-chan struct{} {
	s.mu.Lock()
	var bs []*binding
	for b := range s.open {
		if b.project == project {
			bs = append(bs, b)
		}
	}
	s.mu.Unlock()
	for _, b := range bs { // b.mu is taken before s.mu elsewhere (let): never under it here
		b.mu.Lock()
		moving, done := b.moving, b.handing
		b.mu.Unlock()
		if moving && done != nil {
			return done
		}
	}
	return nil
}

// awaitHandoff waits, when a session of project is being handed over here, for the
// handoff to end (at most handoffWait); false when ctx ended first.
func (s *Server) awaitHandoff(ctx context.Context, project string) (waited, ok bool) {
	done := s.handingOver(project)
	if done == nil {
		return false, true
	}
	t := time.NewTimer(handoffWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	case <-ctx.Done():
		return true, false
	}
	s.holders.drop(project)
	return true, true
}

// handoffWait bounds how long a request waits at the routing for the handoff of its
// session: one call's end (the handoff waits for the calls under way) and a commit.
const handoffWait = time.Minute

// Drain hands every open session over (serve.drain handoff; see the top of this file).
// Sessions not handed over by the time ctx ends are left to Shutdown.
func (s *Server) Drain(ctx context.Context) error {
	if s.opts.Fleet == nil {
		return nil
	}
	if err := s.opts.Fleet.SetDraining(ctx); err != nil {
		s.log.Warn("fleet: marking this replica draining in the store", "err", err)
	}
	select {
	case <-time.After(drainSettle):
	case <-ctx.Done():
	}
	s.mu.Lock()
	bs := make([]*binding, 0, len(s.open))
	for b := range s.open {
		bs = append(bs, b)
	}
	s.mu.Unlock()
	errs := make([]error, len(bs))
	var wg sync.WaitGroup
	for i, b := range bs {
		wg.Go(func() { errs[i] = b.handoff(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}
