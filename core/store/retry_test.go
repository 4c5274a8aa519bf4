package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/store"
)

func TestRetry(t *testing.T) {
	ctx := context.Background()
	fast := store.Retry{Attempts: 4, Backoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}
	down := fmt.Errorf("dial: %w", store.ErrUnreachable)

	t.Run("succeeds after failures", func(t *testing.T) {
		var lines []store.Attempt
		tries := 0
		n, err := fast.Do(ctx, func(context.Context) error {
			if tries++; tries < 3 {
				return down
			}
			return nil
		}, func(a store.Attempt) { lines = append(lines, a) })
		if err != nil || n != 3 || len(lines) != 2 || lines[0].N != 1 || lines[0].Of != 4 || lines[0].Last || lines[0].Wait <= 0 {
			t.Errorf("n %d, err %v, attempts %+v", n, err, lines)
		}
	})
	t.Run("gives up after Attempts, saying so", func(t *testing.T) {
		var last store.Attempt
		n, err := fast.Do(ctx, func(context.Context) error { return down }, func(a store.Attempt) { last = a })
		if n != 4 || !errors.Is(err, store.ErrUnreachable) || !strings.Contains(err.Error(), "(4 attempts in ") || !last.Last || last.N != 4 {
			t.Errorf("n %d, err %v, last %+v", n, err, last)
		}
	})
	t.Run("permanent errors are not retried", func(t *testing.T) {
		for _, e := range []error{store.ErrNoCredentials, store.ErrAccessDenied, store.ErrNoBucket, store.ErrInvalidKey} {
			n, err := fast.Do(ctx, func(context.Context) error { return fmt.Errorf("x: %w", e) }, nil)
			if n != 1 || !errors.Is(err, e) || strings.Contains(err.Error(), "attempts") {
				t.Errorf("%v: n %d, err %v", e, n, err)
			}
		}
	})
	t.Run("the window bounds the retrying", func(t *testing.T) {
		r := store.Retry{Attempts: 100, Backoff: 20 * time.Millisecond, MaxBackoff: 20 * time.Millisecond, Window: 50 * time.Millisecond}
		n, err := r.Do(ctx, func(context.Context) error { return down }, nil)
		// Waits of 10-20 ms each within 50 ms of the first failure: a handful of tries,
		// never the 100 allowed.
		if n < 2 || n > 6 || err == nil {
			t.Errorf("%d tries within a 50 ms window: %v", n, err)
		}
	})
	t.Run("each try gets AttemptTimeout", func(t *testing.T) {
		r := fast
		r.AttemptTimeout = 10 * time.Millisecond
		n, err := r.Do(ctx, func(ctx context.Context) error {
			<-ctx.Done()
			return fmt.Errorf("%w: %w", store.ErrUnreachable, ctx.Err())
		}, nil)
		if n != 4 || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("n %d, err %v", n, err)
		}
	})
	t.Run("a cancelled context stops at once", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		n, err := fast.Do(cctx, func(context.Context) error { cancel(); return down }, nil)
		if n != 1 || err == nil {
			t.Errorf("n %d, err %v", n, err)
		}
	})
}
