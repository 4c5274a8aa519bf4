package sessiontest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
)

// Provider makes sandboxes of Inner (real ones) whose lifetimes follow Clock instead of
// the wall clock: StartedAt, EndsAt and SetTimeout are on Clock, the sandbox refuses to
// be extended past MaxLifetime from its start, and when Clock passes its end the sandbox
// is ended the way Inner ends an expired one (for the local provider, its workspace is kept
// for a handoff). Inner's own timeout is set to RealTimeout so that it never fires first.
type Provider struct {
	Inner       sandbox.Provider
	Clock       *Clock
	MaxLifetime time.Duration
	// RealTimeout is the wall-clock lifetime asked of Inner; default one hour.
	RealTimeout time.Duration

	mu   sync.Mutex
	made []*Sandbox
}

// Sandboxes returns every sandbox the provider made, oldest first.
func (p *Provider) Sandboxes() []*Sandbox {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*Sandbox(nil), p.made...)
}

// Last returns the newest sandbox the provider made, or nil.
func (p *Provider) Last() *Sandbox {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.made) == 0 {
		return nil
	}
	return p.made[len(p.made)-1]
}

var (
	_ sandbox.Provider       = (*Provider)(nil)
	_ sandbox.Handoff        = (*Provider)(nil)
	_ sandbox.HandoffChecker = (*Provider)(nil)
)

// CanHandoff reports whether Inner can hand over the sandbox under old, one of ours.
func (p *Provider) CanHandoff(old sandbox.Sandbox) bool {
	o, ok := old.(*Sandbox)
	return ok && sandbox.CanHandoff(p.Inner, o.Sandbox)
}

func (p *Provider) real(opts sandbox.CreateOptions) (sandbox.CreateOptions, time.Duration) {
	ttl := opts.Timeout
	opts.Timeout = p.RealTimeout
	if opts.Timeout <= 0 {
		opts.Timeout = time.Hour
	}
	if ttl <= 0 {
		ttl = time.Hour
	}
	return opts, ttl
}

// Create makes a sandbox of Inner that lives opts.Timeout on Clock.
func (p *Provider) Create(ctx context.Context, opts sandbox.CreateOptions) (sandbox.Sandbox, error) {
	ropts, ttl := p.real(opts)
	inner, err := p.Inner.Create(ctx, ropts)
	if err != nil {
		return nil, err
	}
	return p.wrap(inner, ttl), nil
}

// Handoff hands old's workspace over when Inner can.
func (p *Provider) Handoff(ctx context.Context, old sandbox.Sandbox, opts sandbox.CreateOptions) (sandbox.Sandbox, error) {
	h, ok := p.Inner.(sandbox.Handoff)
	o, isOurs := old.(*Sandbox)
	if !ok || !isOurs {
		return nil, errors.New("sessiontest: this provider cannot hand a workspace over")
	}
	o.stop()
	ropts, ttl := p.real(opts)
	inner, err := h.Handoff(ctx, o.Sandbox, ropts)
	if err != nil {
		return nil, err
	}
	return p.wrap(inner, ttl), nil
}

func (p *Provider) wrap(inner sandbox.Sandbox, ttl time.Duration) *Sandbox {
	now := p.Clock.Now()
	s := &Sandbox{Sandbox: inner, p: p, started: now}
	s.mu.Lock()
	s.arm(now.Add(ttl))
	s.mu.Unlock()
	p.mu.Lock()
	p.made = append(p.made, s)
	p.mu.Unlock()
	return s
}

// Sandbox is a real sandbox living by the Provider's Clock.
type Sandbox struct {
	sandbox.Sandbox
	p       *Provider
	started time.Time

	mu     sync.Mutex
	ends   time.Time
	timer  interface{ Stop() bool }
	killed bool
}

// arm sets the end and the timer that ends the sandbox then. Called with mu held.
func (s *Sandbox) arm(end time.Time) {
	if s.timer != nil {
		s.timer.Stop()
	}
	s.ends = end
	s.timer = s.p.Clock.AfterFunc(end.Sub(s.p.Clock.Now()), s.expire)
}

func (s *Sandbox) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.timer != nil {
		s.timer.Stop()
	}
}

// expire ends the inner sandbox as its provider ends an expired one: its own timeout,
// brought to now.
func (s *Sandbox) expire() {
	s.mu.Lock()
	if s.p.Clock.Now().Before(s.ends) || s.killed {
		s.mu.Unlock()
		return
	}
	s.killed = true
	s.mu.Unlock()
	_ = s.Sandbox.SetTimeout(context.Background(), time.Nanosecond)
}

// Expired reports whether the clock ended the sandbox.
func (s *Sandbox) Expired() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.killed
}

// StartedAt is the sandbox's start on the Clock.
func (s *Sandbox) StartedAt() time.Time { return s.started }

// EndsAt is the sandbox's end on the Clock.
func (s *Sandbox) EndsAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ends
}

// SetTimeout moves the end to Clock's now + d, within MaxLifetime of the start.
func (s *Sandbox) SetTimeout(_ context.Context, d time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.killed {
		return fmt.Errorf("set timeout of sandbox %s: %w", s.ID(), sandbox.ErrClosed)
	}
	end := s.p.Clock.Now().Add(d)
	if s.p.MaxLifetime > 0 && end.After(s.started.Add(s.p.MaxLifetime)) {
		return fmt.Errorf("set timeout of sandbox %s: past its maximum lifetime of %s", s.ID(), s.p.MaxLifetime)
	}
	s.arm(end)
	return nil
}

// Close stops the clock's timer and closes the inner sandbox.
func (s *Sandbox) Close(ctx context.Context) error {
	s.stop()
	return s.Sandbox.Close(ctx)
}

// Unwrap returns the inner sandbox.
func (s *Sandbox) Unwrap() sandbox.Sandbox { return s.Sandbox }
