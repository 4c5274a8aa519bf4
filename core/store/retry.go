package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"
)

// Defaults of Retry's zero fields.
const (
	DefaultRetryAttempts   = 4 // the first try and 3 retries
	DefaultRetryBackoff    = time.Second
	DefaultRetryMaxBackoff = 4 * time.Second
	DefaultRetryWindow     = 8 * time.Second
)

// Retry is the one retry policy of toolhost's store traffic. Backends make a single
// attempt per request (the S3 backend turns the SDK's own retries off), and the caller
// that owns an operation (internal/snapshot for a save or a restore) retries it with this
// policy, so retries never nest and an outage fails fast: a store that refuses
// connections fails an operation after the waits of the backoff, well under ten seconds
// with the defaults.
//
// A try that fails with a Permanent error (no credentials, access denied, no bucket) is
// not retried, nor one whose context ended.
type Retry struct {
	// Attempts is how many tries are made in all, the first included; 0 means
	// DefaultRetryAttempts, and a negative value means one (no retries).
	Attempts int
	// Backoff is the wait before the first retry, doubling for each next one up to
	// MaxBackoff, with jitter (between half and all of it); 0 means the defaults.
	Backoff    time.Duration
	MaxBackoff time.Duration
	// Window is the total deadline of the retrying: no retry starts later than Window after
	// the first failure, and a wait that would end past it is not begun. It does not cut a
	// try in progress (AttemptTimeout does), so a long upload that fails is still retried
	// once the store answers again. 0 means DefaultRetryWindow.
	Window time.Duration
	// AttemptTimeout, when set, bounds each try.
	AttemptTimeout time.Duration
}

func (r Retry) withDefaults() Retry {
	switch {
	case r.Attempts == 0:
		r.Attempts = DefaultRetryAttempts
	case r.Attempts < 0:
		r.Attempts = 1
	}
	if r.Backoff <= 0 {
		r.Backoff = DefaultRetryBackoff
	}
	if r.MaxBackoff <= 0 {
		r.MaxBackoff = max(DefaultRetryMaxBackoff, r.Backoff)
	}
	if r.Window <= 0 {
		r.Window = DefaultRetryWindow
	}
	return r
}

// Attempt reports one failed try to Do's caller, before the wait that follows it.
type Attempt struct {
	N    int // 1-based
	Of   int // Attempts
	Err  error
	Wait time.Duration // the wait before the next try; 0 when Do gives up
	Last bool          // no try follows
}

// Do runs fn until it succeeds, fails permanently, ctx ends or the policy gives up.
// onFail, when set, is called after each failed try (one log line per attempt is the
// convention). Do returns the number of tries made and the last try's error; when it gave
// up on a retryable error the error says how many tries were made.
func (r Retry) Do(ctx context.Context, fn func(ctx context.Context) error, onFail func(Attempt)) (int, error) {
	r = r.withDefaults()
	start := time.Now()
	var firstFail time.Time
	for n := 1; ; n++ {
		actx, cancel := ctx, context.CancelFunc(func() {})
		if r.AttemptTimeout > 0 {
			actx, cancel = context.WithTimeout(ctx, r.AttemptTimeout)
		}
		err := fn(actx)
		cancel()
		if err == nil {
			return n, nil
		}
		now := time.Now()
		if firstFail.IsZero() {
			firstFail = now
		}
		a := Attempt{N: n, Of: r.Attempts, Err: err}
		if ctx.Err() != nil || Permanent(err) || n >= r.Attempts {
			a.Last = true
		} else {
			a.Wait = r.backoff(n - 1)
			if now.Add(a.Wait).After(firstFail.Add(r.Window)) {
				a.Wait, a.Last = 0, true
			}
		}
		if onFail != nil {
			onFail(a)
		}
		if a.Last {
			if n > 1 && !Permanent(err) && ctx.Err() == nil {
				return n, fmt.Errorf("%w (%d attempts in %s)", err, n, roundDur(now.Sub(start)))
			}
			return n, err
		}
		t := time.NewTimer(a.Wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return n, fmt.Errorf("%w (while waiting to retry: %w)", err, ctx.Err())
		}
	}
}

func (r Retry) backoff(retry int) time.Duration {
	d := r.Backoff << min(retry, 20)
	if d <= 0 || d > r.MaxBackoff {
		d = r.MaxBackoff
	}
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

// roundDur shortens a duration for a message: 3.512s, 250ms.
func roundDur(d time.Duration) time.Duration {
	if d >= time.Second {
		return d.Round(10 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}
