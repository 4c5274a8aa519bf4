// Package sessiontest helps test code that runs sessions: a fake Clock that tests move by
// hand, and a Provider whose sandboxes live by that clock, so a test can take a session
// through hours of sandbox lifetimes (extensions, rotations, last calls) without sleeping,
// on real sandboxes.
package sessiontest

import (
	"slices"
	"sync"
	"time"

	"github.com/toolhost/toolhost/internal/session"
)

// Clock is a session.Clock that only moves when told to. It is safe for concurrent use.
type Clock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*timer
}

var _ session.Clock = (*Clock)(nil)

// NewClock returns a clock that reads start.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc calls f in its own goroutine once the clock has been moved d past now.
func (c *Clock) AfterFunc(d time.Duration, f func()) session.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &timer{c: c, at: c.now.Add(d), f: f}
	if d <= 0 {
		go f()
		t.done = true
		return t
	}
	c.timers = append(c.timers, t)
	return t
}

// Advance moves the clock forward by d and fires the timers that came due, in order of
// their times. It returns once each due f has been started (not finished).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []*timer
	c.timers = slices.DeleteFunc(c.timers, func(t *timer) bool {
		if t.done || !t.at.After(c.now) {
			due = append(due, t)
			return true
		}
		return false
	})
	slices.SortFunc(due, func(a, b *timer) int { return a.at.Compare(b.at) })
	for _, t := range due {
		if !t.done {
			t.done = true
			go t.f()
		}
	}
	c.mu.Unlock()
}

// Pending is the number of timers waiting.
func (c *Clock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

type timer struct {
	c    *Clock
	at   time.Time
	f    func()
	done bool // fired or stopped; guarded by c.mu
}

func (t *timer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.done {
		return false
	}
	t.done = true
	return true
}
