package session

import "time"

// Clock is the session's time: when its sandbox ends, when to extend or rotate it, when to
// try again after a failure. Tests inject a fake (sessiontest.Clock) so that lifetimes
// pass without sleeping; the default is the system clock.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has passed on this clock, unless the
	// returned Timer is stopped first.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc.
type Timer interface {
	// Stop cancels the call; it reports whether it did (false: it ran or was stopped).
	Stop() bool
}

// SystemClock is the real time.
func SystemClock() Clock { return systemClock{} }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
