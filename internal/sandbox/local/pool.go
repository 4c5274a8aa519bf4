//go:build linux

package local

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
)

// The pool keeps sandboxes started ahead of need, so that Create and a rotation's Handoff
// take a running one instead of waiting for bubblewrap and the agent. A spare is a whole
// sandbox: in its cgroup, under its limits and its seccomp filter, its agent answering,
// on a slot (slot.go) in place of a workspace. Taking it attaches the workspace to the slot
// and asks the agent to open it: a few system calls and one round trip.
//
// Spares are kept per configuration: everything that shapes a sandbox when bubblewrap
// starts it (keyOf). The limits are the provider's, the same for every sandbox it makes;
// the lifetime is set when a spare is taken. Configurations are those the provider has been
// asked for (Warm, or a Create or Handoff), at most Config.Pool spares of each and poolKeys
// configurations. One spare is made at a time, in the background. A spare is never given
// twice: a taken sandbox belongs to whoever took it and is closed with it (a handoff ends
// it), so nothing one project ran is ever seen by another. Close drains the pool.

// poolKeys bounds the configurations the pool keeps spares for; the least recently asked
// for is dropped beyond it.
const poolKeys = 4

// spareMaxAge is how long a spare waits before it is replaced by a younger one: a
// sandbox's maximum lifetime counts from its start.
func (p *Provider) spareMaxAge() time.Duration { return min(p.cfg.MaxLifetime/4, time.Hour) }

// spareWarmBound bounds the command a new spare runs before it waits (a hang bound).
const spareWarmBound = time.Minute

// poolKey is a configuration.
type poolKey string

// keyOf is what a spare must have been started with to be given for opts: the network
// mode, the environment, and with NetworkEgress the very egress value (its gateway, whose
// door the spare opened at its start and which decides every connection it makes) with
// its policy and trusted certificates. The host makes one sandbox.Egress per session
// (sessionEgress) and passes it to every sandbox of that session, so an egress spare is
// only ever given within the session it was made for: one made for one policy is never
// given to a sandbox with another, even if both policies read the same.
func keyOf(opts sandbox.CreateOptions) poolKey {
	var b strings.Builder
	net := opts.Network
	if net == "" {
		net = sandbox.NetworkNone
	}
	b.WriteString(net)
	if net == sandbox.NetworkEgress {
		b.WriteString("\x00egress:")
		if opts.Egress == nil {
			b.WriteString("nil")
		} else {
			h := sha256.New()
			pol, _ := json.Marshal(opts.Egress.Policy)
			h.Write(pol)
			h.Write([]byte{0})
			h.Write(opts.Egress.Trust)
			fmt.Fprintf(&b, "%p/%s", opts.Egress, hex.EncodeToString(h.Sum(nil)))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(opts.Env)) {
		b.WriteString("\x00" + k + "=" + opts.Env[k])
	}
	return poolKey(b.String())
}

// template is opts as a spare is started with: no workspace (a slot instead), the
// spare's own lifetime.
func template(opts sandbox.CreateOptions) sandbox.CreateOptions {
	opts.Workspace, opts.Timeout = "", 0
	return opts
}

type sparePool struct {
	p    *Provider
	size int

	mu      sync.Mutex
	spares  map[poolKey][]*Sandbox
	configs []sandbox.CreateOptions // the configurations kept, most recently asked for last
	closed  bool
	wake    chan struct{}

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}  // the maker's end
	ended  sync.WaitGroup // shutdowns of spares dropped from the pool; close waits for them
}

func newSparePool(p *Provider, size int) *sparePool {
	ctx, cancel := context.WithCancel(context.Background())
	sp := &sparePool{p: p, size: size, spares: map[poolKey][]*Sandbox{}, wake: make(chan struct{}, 1),
		ctx: ctx, cancel: cancel, done: make(chan struct{})}
	go sp.maker() // owned by the pool: close stops it and waits
	return sp
}

// end shuts a spare down in the background; close waits for it. Called with mu held.
func (sp *sparePool) end(s *Sandbox, reason string) {
	sp.ended.Go(func() { s.shutdown(reason) })
}

// want notes a configuration to keep spares for.
func (sp *sparePool) want(opts sandbox.CreateOptions) {
	opts = template(opts)
	k := keyOf(opts)
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.closed {
		return
	}
	if i := slices.IndexFunc(sp.configs, func(o sandbox.CreateOptions) bool { return keyOf(o) == k }); i >= 0 {
		sp.configs = slices.Delete(sp.configs, i, i+1)
	}
	sp.configs = append(sp.configs, opts)
	for len(sp.configs) > poolKeys {
		sp.dropLocked(keyOf(sp.configs[0]))
	}
	sp.poke()
}

// forget stops keeping spares of opts' configuration and ends those kept.
func (sp *sparePool) forget(opts sandbox.CreateOptions) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if !sp.closed {
		sp.dropLocked(keyOf(template(opts)))
	}
}

func (sp *sparePool) dropLocked(k poolKey) {
	sp.configs = slices.DeleteFunc(sp.configs, func(o sandbox.CreateOptions) bool { return keyOf(o) == k })
	for _, s := range sp.spares[k] {
		sp.end(s, "was a spare no longer wanted")
	}
	delete(sp.spares, k)
}

func (sp *sparePool) poke() {
	select {
	case sp.wake <- struct{}{}:
	default:
	}
}

// take returns a spare of opts' configuration that is alive and young enough, or nil.
func (sp *sparePool) take(opts sandbox.CreateOptions) *Sandbox {
	k := keyOf(template(opts))
	sp.mu.Lock()
	defer sp.mu.Unlock()
	defer sp.poke()
	for len(sp.spares[k]) > 0 {
		s := sp.spares[k][0]
		sp.spares[k] = sp.spares[k][1:]
		if s.closedErr() == nil && time.Since(s.startedAt) < sp.p.spareMaxAge() {
			return s
		}
		sp.end(s, "was a spare too old to give")
	}
	return nil
}

// next is the configuration that lacks a spare, the most recently asked for first; none
// once the pool is closed (close takes the spares away while the maker may be here).
func (sp *sparePool) next() (sandbox.CreateOptions, bool) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.closed {
		return sandbox.CreateOptions{}, false
	}
	for i := len(sp.configs) - 1; i >= 0; i-- {
		k := keyOf(sp.configs[i])
		live := sp.spares[k][:0]
		for _, s := range sp.spares[k] {
			if s.closedErr() == nil {
				live = append(live, s)
			}
		}
		sp.spares[k] = live
		if len(live) < sp.size {
			return sp.configs[i], true
		}
	}
	return sandbox.CreateOptions{}, false
}

// maker starts spares, one at a time, while a configuration lacks one; it waits to be
// woken otherwise, and checks the spares' age now and then.
func (sp *sparePool) maker() {
	defer close(sp.done)
	failures := 0
	for {
		opts, ok := sp.next()
		if !ok {
			select {
			case <-sp.ctx.Done():
				return
			case <-sp.wake:
			case <-time.After(sp.p.spareMaxAge() / 4):
				sp.retireOld()
			}
			continue
		}
		s, err := sp.p.startSpare(sp.ctx, opts)
		if err != nil {
			if sp.ctx.Err() != nil {
				return
			}
			failures++
			sp.p.log.Warn("could not start a spare sandbox; sandboxes start when asked for", "err", err)
			select { // back off: whatever failed is not likely to pass at once
			case <-sp.ctx.Done():
				return
			case <-time.After(min(time.Duration(failures)*time.Second, time.Minute)):
			}
			continue
		}
		failures = 0
		k := keyOf(opts)
		sp.mu.Lock()
		if sp.closed || !slices.ContainsFunc(sp.configs, func(o sandbox.CreateOptions) bool { return keyOf(o) == k }) {
			sp.mu.Unlock()
			s.shutdown("was a spare no longer wanted")
			continue
		}
		sp.spares[k] = append(sp.spares[k], s)
		sp.mu.Unlock()
	}
}

// retireOld ends the spares past spareMaxAge; the maker replaces them.
func (sp *sparePool) retireOld() {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	for k, ss := range sp.spares {
		live := ss[:0]
		for _, s := range ss {
			if time.Since(s.startedAt) >= sp.p.spareMaxAge() {
				sp.end(s, "was a spare too old to give")
				continue
			}
			live = append(live, s)
		}
		sp.spares[k] = live
	}
}

// close stops the maker and ends every spare, the ones dropped before included; each
// shutdown is bounded (kill's waits), so this is too.
func (sp *sparePool) close() {
	sp.mu.Lock()
	sp.closed = true
	var all []*Sandbox
	for _, ss := range sp.spares {
		all = append(all, ss...)
	}
	sp.spares = nil
	sp.mu.Unlock()
	sp.cancel()
	<-sp.done
	for _, s := range all {
		sp.ended.Go(func() { s.shutdown("was closed") })
	}
	sp.ended.Wait()
}

// Warm makes the provider keep spare sandboxes of opts' configuration (keyOf), when its
// pool is on (Config.Pool): the next Create or Handoff of that configuration takes one.
// It returns at once.
func (p *Provider) Warm(opts sandbox.CreateOptions) {
	if p.pool != nil {
		p.pool.want(opts)
	}
}

// Unwarm stops keeping spares of opts' configuration and ends those kept: a session that
// closes calls it, so that no sandbox waits for a session (and its egress) that is gone.
func (p *Provider) Unwarm(opts sandbox.CreateOptions) {
	if p.pool != nil {
		p.pool.forget(opts)
	}
}

// Spares reports how many started sandboxes of opts' configuration are ready to be taken.
func (p *Provider) Spares(opts sandbox.CreateOptions) int {
	if p.pool == nil {
		return 0
	}
	p.pool.mu.Lock()
	defer p.pool.mu.Unlock()
	return len(p.pool.spares[keyOf(template(opts))])
}

// startSpare starts a sandbox on a slot, with no workspace yet.
func (p *Provider) startSpare(ctx context.Context, opts sandbox.CreateOptions) (*Sandbox, error) {
	id := newID()
	sl, err := p.newSlot(id)
	if err != nil {
		return nil, err
	}
	s, err := p.start(ctx, id, &workspace{path: sl.path, kind: "slot"}, p.spareMaxAge(), opts)
	if err != nil {
		if rerr := sl.release(); rerr != nil {
			p.log.Warn("release the slot of a spare that did not start", "sandbox", id, "err", rerr)
		}
		return nil, err
	}
	s.mu.Lock()
	s.ws, s.slot = nil, sl
	ended := s.reason != "" // its shutdown may have looked for the slot before it was set
	s.mu.Unlock()
	if ended {
		<-s.closeDone
		_ = sl.release() // once only, whoever comes first
		return nil, fmt.Errorf("spare sandbox %s ended as it started", id)
	}
	// One command and one opening of the workspace before it waits: the first of each in a
	// new sandbox costs about twice a later one (the agent's first launch, the code of its
	// handlers run for the first time, the connection to it), and that belongs to the
	// making of a spare, not to the one who takes it. Both act on the empty slot.
	wctx, cancel := context.WithTimeout(ctx, spareWarmBound)
	res, err := s.Exec(wctx, sandbox.ExecRequest{Argv: []string{"true"}, Timeout: spareWarmBound})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("exit code %d", res.ExitCode)
	}
	if err == nil {
		err = s.client.OpenWorkspace(wctx)
	}
	cancel()
	if err != nil {
		s.shutdown("was a spare whose first command failed")
		return nil, fmt.Errorf("spare sandbox %s: its first command: %w", id, err)
	}
	return s, nil
}

// takeOver gives a spare its workspace and its lifetime. On failure the spare is ended
// (its slot released, so ws is attached nowhere) and ws is left to the caller.
func (s *Sandbox) takeOver(ctx context.Context, ws *workspace, timeout time.Duration) error {
	fail := func(err error) error {
		s.shutdown("failed to take its workspace") // detaches ws before the caller gives it to another
		return fmt.Errorf("take spare sandbox %s: %w", s.id, err)
	}
	if err := s.slot.attach(ws); err != nil {
		return fail(err)
	}
	if err := s.client.OpenWorkspace(ctx); err != nil {
		return fail(err)
	}
	s.mu.Lock()
	if reason := s.reason; reason != "" { // ended meanwhile: wait until its shutdown has detached ws
		s.mu.Unlock()
		s.shutdown(reason)
		return fmt.Errorf("take spare sandbox %s: it %s: %w", s.id, reason, sandbox.ErrClosed)
	}
	defer s.mu.Unlock()
	s.ws = ws
	end := time.Now().Add(timeout)
	if limit := s.startedAt.Add(s.p.cfg.MaxLifetime); end.After(limit) {
		end = limit
	}
	s.endsAt = end
	s.timer.Reset(time.Until(end))
	return nil
}
