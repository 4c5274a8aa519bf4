//go:build linux

package local

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"

	"github.com/toolhost/toolhost/internal/volume"
)

// spareVolume keeps one workspace volume made ahead of time, so that creating a sandbox
// with a private workspace takes a ready volume instead of waiting for a loop device and a
// mount (milliseconds, many more on a busy host). Taking the spare starts making the
// next one in the background.
type spareVolume struct {
	pool *volume.Pool

	mu     sync.Mutex
	ready  *volume.Volume
	making bool
	closed bool
	wg     sync.WaitGroup // the background maker; close waits for it
	ctx    context.Context
	cancel context.CancelFunc
}

func newSpareVolume(pool *volume.Pool) *spareVolume {
	ctx, cancel := context.WithCancel(context.Background())
	s := &spareVolume{pool: pool, ctx: ctx, cancel: cancel}
	s.refill()
	return s
}

// take returns the spare, or makes a volume now when there is none ready, and starts
// making the next spare either way.
func (s *spareVolume) take(ctx context.Context) (*volume.Volume, error) {
	s.mu.Lock()
	v := s.ready
	s.ready = nil
	s.mu.Unlock()
	defer s.refill()
	if v != nil {
		return v, nil
	}
	return s.pool.Create(ctx, spareName())
}

// refill starts making a spare unless one is ready, being made, or the provider closed.
func (s *spareVolume) refill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ready != nil || s.making || s.closed {
		return
	}
	s.making = true
	s.wg.Add(1)
	go func() { // owned by spareVolume: ends when the volume is made; close waits for it
		defer s.wg.Done()
		v, err := s.pool.Create(s.ctx, spareName())
		s.mu.Lock()
		defer s.mu.Unlock()
		s.making = false
		switch {
		case err != nil:
			// Not fatal: the next sandbox makes its volume itself and says why if it fails.
		case s.closed:
			_ = closeVolume(v)
		default:
			s.ready = v
		}
	}()
}

// close stops the maker and releases an unused spare.
func (s *spareVolume) close() error {
	s.mu.Lock()
	s.closed = true
	v := s.ready
	s.ready = nil
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	if v != nil {
		return closeVolume(v)
	}
	return nil
}

func spareName() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "ws-" + hex.EncodeToString(b[:])
}
