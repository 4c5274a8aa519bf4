//go:build linux

package toolhost

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/lease"
	"github.com/toolhost/toolhost/internal/sandbox/e2b/e2bfake"
	"github.com/toolhost/toolhost/internal/testenv"
)

// stallingStore refuses the lease's renewals once armed: its holder loses the lease as
// one that stalled past its ttl does.
type stallingStore struct {
	store.Store
	armed atomic.Bool
}

func (s *stallingStore) Put(ctx context.Context, key string, r io.Reader, opts store.PutOptions) (store.ObjectInfo, error) {
	if s.armed.Load() && strings.Contains(key, "/lease/") {
		return store.ObjectInfo{}, errors.New("test: the store does not answer")
	}
	return s.Store.Put(ctx, key, r, opts)
}

// TestLeaseLostMidCall: a call that ends after its session lost the project's lease (a
// replica stalled while the call ran, and another may have taken the project over from a
// record that does not know what the call did) is not answered as done: its result tells
// the model to make it again, where the project is now. Before, the paused replica of the
// fleet test answered a write_file as written, and the edit_file after it, on the replica
// that had taken over, was refused: the file had not been read in that session.
func TestLeaseLostMidCall(t *testing.T) {
	testenv.NeedBwrap(t)
	f := e2bfake.Start(t, e2bfake.Config{Logger: slog.New(slog.DiscardHandler)})
	cfg := e2bConfig(t, "e2b", f)
	cfg.Lease.TTL, cfg.Lease.Renew = time.Second, 100*time.Millisecond
	th := newToolhost(t, cfg)
	ss := &stallingStore{Store: th.storage.store}
	th.storage.store = ss
	s := open(t, th, SessionOptions{Project: "shop"})
	if !s.takeoverable {
		t.Fatal("a session on E2B is not takeoverable")
	}
	expect(t, s, "write_file", `{"path":"a.txt","content":"one"}`, false)

	ss.armed.Store(true)
	res, err := s.Dispatch(context.Background(), "bash", json.RawMessage(`{"command":"sleep 3; echo done > b.txt"}`))
	if !errors.Is(err, lease.ErrLost) || !res.IsError {
		t.Fatalf("a call through the lease's loss: error %v, result %+v; want ErrLost and an error result", err, res)
	}
	if text := testenv.ResultText(res); !strings.Contains(text, "lost project shop while it ran") || !strings.Contains(text, "Make the call again") {
		t.Errorf("the result does not tell the model what happened and what to do: %q", text)
	}
}
