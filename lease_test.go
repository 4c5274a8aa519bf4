//go:build linux

package toolhost

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/lease"
	"github.com/toolhost/toolhost/internal/store/s3/s3test"
	"github.com/toolhost/toolhost/internal/testenv"
)

// leaseStores runs f with a configuration on each store backend: a directory, and the
// test S3 server. Toolhosts made from the configuration share the store, as hosts do.
func leaseStores(t *testing.T, f func(t *testing.T, cfg Config)) {
	t.Run("dir", func(t *testing.T) {
		cfg := testConfig(t)
		cfg.Sandbox.Provider = "test-memory"
		f(t, cfg)
	})
	t.Run("s3", func(t *testing.T) {
		srv, err := s3test.Start(t.TempDir())
		if err != nil {
			t.Fatalf("starting the S3 server: %v", err)
		}
		t.Cleanup(func() { srv.Close() })
		bucket, err := srv.NewBucket(t.Context(), "lease")
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range map[string]string{
			"AWS_ACCESS_KEY_ID": s3test.AccessKey, "AWS_SECRET_ACCESS_KEY": s3test.SecretKey,
			"AWS_REGION": s3test.Region, "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
			"AWS_EC2_METADATA_DISABLED": "true", "AWS_PROFILE": "", "AWS_ENDPOINT_URL": "", "AWS_ENDPOINT_URL_S3": "",
		} {
			t.Setenv(k, v)
		}
		cfg := testConfig(t)
		cfg.Sandbox.Provider = "test-memory"
		cfg.Store.Kind = "s3"
		for k, v := range map[string]any{"store.s3.bucket": bucket, "store.s3.endpoint": srv.Endpoint, "store.s3.path_style": true} {
			if err := cfg.Set(k, v); err != nil {
				t.Fatal(err)
			}
		}
		f(t, cfg)
	})
}

func thisHost(t *testing.T) string {
	h, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestLeaseTwoHosts: two Toolhosts on one store cannot open one project at once; the
// second is told who has it; once the first closes, the second can.
func TestLeaseTwoHosts(t *testing.T) {
	leaseStores(t, func(t *testing.T, cfg Config) {
		ctx := context.Background()
		a, b := newToolhost(t, cfg), newToolhost(t, cfg)
		sa, err := a.Open(ctx, SessionOptions{Project: "shop"})
		if err != nil {
			t.Fatal(err)
		}
		_, err = b.Open(ctx, SessionOptions{Project: "shop"})
		if !errors.Is(err, lease.ErrHeld) {
			t.Fatalf("second host's Open: %v, want the project held", err)
		}
		want := fmt.Sprintf("project shop is open on host %s (pid %d, since ", thisHost(t), os.Getpid())
		if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "close it there or wait until ") {
			t.Errorf("message %q lacks %q", err, want)
		}
		// The first host's sessions share its lease: a second one opens, and the lease
		// stays until both closed.
		sa2, err := a.Open(ctx, SessionOptions{Project: "shop"})
		if err != nil {
			t.Fatalf("second session on the first host: %v", err)
		}
		if err := sa2.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Open(ctx, SessionOptions{Project: "shop"}); !errors.Is(err, lease.ErrHeld) {
			t.Fatalf("with one of the first host's two sessions closed: %v", err)
		}
		other := open(t, b, SessionOptions{Project: "other"})
		expect(t, other, "bash", `{"command": "echo hi"}`, false)
		expect(t, sa, "bash", `{"command": "echo still here"}`, false, "still here")
		if err := sa.Close(ctx); err != nil {
			t.Fatal(err)
		}
		sb := open(t, b, SessionOptions{Project: "shop"})
		expect(t, sb, "bash", `{"command": "echo now b"}`, false, "now b")
	})
}

// putGeneration writes a lease generation as another host would have.
func putGeneration(t *testing.T, st store.Store, project string, gen int, host string, expires time.Time) {
	if t != nil {
		t.Helper()
	}
	body, _ := json.Marshal(map[string]any{"host": host, "pid": 4242, "id": "feedface", "since": expires.Add(-time.Hour), "expires": expires})
	key := fmt.Sprintf("%s%020d", lease.Prefix(project), gen)
	if _, err := st.Put(context.Background(), key, strings.NewReader(string(body)), store.PutOptions{Size: int64(len(body)), IfNotExists: true}); err != nil && t != nil {
		t.Fatal(err)
	}
}

// TestLeaseExpiredTakenOver: a lease whose holder died (it stopped renewing) is taken over
// once it expired; a live one of another host is not.
func TestLeaseExpiredTakenOver(t *testing.T) {
	leaseStores(t, func(t *testing.T, cfg Config) {
		ctx := context.Background()
		th := newToolhost(t, cfg)
		st := th.Storage().Store()
		putGeneration(t, st, "live", 3, "ghost-live", time.Now().Add(time.Hour))
		_, err := th.Open(ctx, SessionOptions{Project: "live"})
		if !errors.Is(err, lease.ErrHeld) || !strings.Contains(err.Error(), "project live is open on host ghost-live (pid 4242") {
			t.Fatalf("a live lease of another host: %v", err)
		}
		putGeneration(t, st, "dead", 3, "ghost-dead", time.Now().Add(-time.Second))
		s := open(t, th, SessionOptions{Project: "dead"})
		expect(t, s, "bash", `{"command": "echo taken"}`, false, "taken")
		// Generation 4 took over; a loaded machine may have renewed it since (5, 6...),
		// each renewal writing the next before it removes the one before, so a listing
		// between the two sees both: one object, past 3, once the renewal settled.
		var objs []store.ObjectInfo
		if !testenv.Eventually(func() bool {
			objs, err = store.ListAll(ctx, st, lease.Prefix("dead"))
			return err == nil && len(objs) == 1
		}) {
			t.Fatalf("lease objects after the takeover: %v %v, want one", objs, err)
		}
		gen, err := strconv.ParseUint(objs[0].Key[strings.LastIndexByte(objs[0].Key, '/')+1:], 10, 64)
		if err != nil || gen < 4 {
			t.Errorf("lease object after the takeover: %s, want generation 4 or later", objs[0].Key)
		}
	})
}

// TestLeaseLost: a session whose lease another host took over runs no more tools and
// commits nothing.
func TestLeaseLost(t *testing.T) {
	cfg := testConfig(t)
	cfg.Sandbox.Provider = "test-memory"
	cfg.Lease.Renew = 10 * time.Millisecond
	th := newToolhost(t, cfg)
	s := open(t, th, SessionOptions{Project: "shop"})
	expect(t, s, "bash", `{"command": "echo mine"}`, false, "mine")
	// Another host's generation far ahead of this one's: its next renewal sees it.
	putGeneration(t, th.Storage().Store(), "shop", 1<<40, "usurper", time.Now().Add(time.Hour))
	testenv.WaitFor(t, "the session to notice", func() bool { return s.leaseErr() != nil })

	res, err := s.Dispatch(context.Background(), "bash", json.RawMessage(`{"command": "echo again"}`))
	if err == nil || !res.IsError || !strings.Contains(testenv.ResultText(res), "project shop may be open on another host") {
		t.Errorf("a call after the loss: %v %+v", err, res)
	}
	if _, err := s.Commit(context.Background(), "x"); !errors.Is(err, lease.ErrLost) {
		t.Errorf("a commit after the loss: %v", err)
	}
	// Nor does a rotation save: every save of the session goes through its recorder.
	if _, err := s.wake.SaveLabeled(context.Background(), "shop", "rotation", func(w io.Writer) error { return nil }); !errors.Is(err, lease.ErrLost) {
		t.Errorf("a save after the loss: %v", err)
	}
	if objs, err := store.ListAll(context.Background(), th.Storage().Store(), "projects/shop/snapshots/"); err != nil || len(objs) != 0 {
		t.Errorf("snapshots saved after the loss: %v %v", objs, err)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Errorf("Close: %v", err)
	}
	if _, err := th.Open(context.Background(), SessionOptions{Project: "shop"}); !strings.Contains(fmt.Sprint(err), "host usurper") {
		t.Errorf("after the loss, the usurper's lease stands: %v", err)
	}
}

// TestLeaseEndsWithToolhost: a session left open gives its lease up when its Toolhost
// closes.
func TestLeaseEndsWithToolhost(t *testing.T) {
	cfg := testConfig(t)
	cfg.Sandbox.Provider = "test-memory"
	a, err := New(context.Background(), cfg, quiet())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Open(context.Background(), SessionOptions{Project: "shop"}); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	open(t, newToolhost(t, cfg), SessionOptions{Project: "shop"})
}

// TestLeaseOff: lease.enabled false takes no lease.
func TestLeaseOff(t *testing.T) {
	cfg := testConfig(t)
	cfg.Sandbox.Provider = "test-memory"
	cfg.Lease.Enabled = false
	a, b := newToolhost(t, cfg), newToolhost(t, cfg)
	open(t, a, SessionOptions{Project: "shop"})
	open(t, b, SessionOptions{Project: "shop"})
	if objs, err := store.ListAll(context.Background(), a.Storage().Store(), "projects/shop/lease/"); err != nil || len(objs) != 0 {
		t.Errorf("lease objects with leases off: %v %v", objs, err)
	}
}

// blindStore ignores IfNotExists, as an S3-compatible endpoint that ignores If-None-Match.
type blindStore struct{ store.Store }

func (b blindStore) Put(ctx context.Context, key string, r io.Reader, opts store.PutOptions) (store.ObjectInfo, error) {
	opts.IfNotExists = false
	return b.Store.Put(ctx, key, r, opts)
}

// countHandler counts the records that contain a text.
type countHandler struct {
	slog.Handler
	text string
	n    *atomic.Int32
}

func (h countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.text) {
		h.n.Add(1)
	}
	return nil
}

// TestLeaseStoreWithoutConditionalWrites: on a store that ignores conditional writes no
// lease can be kept: sessions open without one, and the Toolhost says so once.
func TestLeaseStoreWithoutConditionalWrites(t *testing.T) {
	cfg := testConfig(t)
	cfg.Sandbox.Provider = "test-memory"
	var warned atomic.Int32
	th := newToolhost(t, cfg, WithLogger(slog.New(countHandler{slog.DiscardHandler, "project leases are off", &warned})))
	th.storage.store = blindStore{th.storage.store}
	for range 3 {
		open(t, th, SessionOptions{Project: "shop"})
	}
	if n := warned.Load(); n != 1 {
		t.Errorf("warned %d times, want once", n)
	}
	if objs, err := store.ListAll(context.Background(), th.Storage().Store(), lease.Prefix("shop")); err != nil || len(objs) != 0 {
		t.Errorf("lease objects on a store that cannot keep them: %v %v", objs, err)
	}
}

// losingStore is a host's store whose project lease is lost during the first write of a
// save once armed: another host's generation appears, the holder's renewal finds it,
// and the write (under way meanwhile) goes on only once its context ended, as a store
// call under way does.
type losingStore struct {
	store.Store
	armed atomic.Bool
	lost  func() bool // the holder knows it lost the lease
	hit   atomic.Int32
}

func (l *losingStore) Put(ctx context.Context, key string, r io.Reader, opts store.PutOptions) (store.ObjectInfo, error) {
	// The session's record is written in the background whenever it changes (a file
	// written changes edit_file's state in it): not the save this store times the loss by.
	if strings.Contains(key, "/lease/") || strings.Contains(key, "/sessions/") || strings.HasPrefix(key, "lease-probe/") || !l.armed.Load() {
		return l.Store.Put(ctx, key, r, opts)
	}
	if l.hit.Add(1) == 1 {
		putGeneration(nil, l.Store, "shop", 1<<40, "usurper", time.Now().Add(time.Hour))
		if !testenv.Eventually(l.lost) {
			return store.ObjectInfo{}, errors.New("test: the holder never noticed the takeover")
		}
		select {
		case <-ctx.Done():
		case <-time.After(testenv.HangBound):
			return store.ObjectInfo{}, errors.New("test: the write's context outlived the lease")
		}
	}
	return l.Store.Put(ctx, key, r, opts)
}

// TestLeaseFencesWrites: a session's writes carry its lease's epoch and holder; a save
// under way when the lease is lost (past the session's own check) is cut short and
// refused by the fenced store, and stores nothing.
func TestLeaseFencesWrites(t *testing.T) {
	leaseStores(t, func(t *testing.T, cfg Config) {
		ctx := context.Background()
		cfg.Lease.Renew = 10 * time.Millisecond
		th := newToolhost(t, cfg)
		ls := &losingStore{Store: th.storage.store}
		th.storage.store = ls
		s := open(t, th, SessionOptions{Project: "shop"})
		ls.lost = func() bool { return s.leaseErr() != nil }
		expect(t, s, "write_file", `{"path": "a.txt", "content": "one"}`, false)
		saved, err := s.Commit(ctx, "one")
		if err != nil {
			t.Fatal(err)
		}
		l := s.lease.l
		oi, err := th.Storage().Store().Head(ctx, saved.Key)
		if err != nil {
			t.Fatal(err)
		}
		if md := oi.Metadata; md[lease.MetaEpoch] != strconv.FormatUint(l.Epoch(), 10) || md[lease.MetaHolder] != l.Holder().ID || md[lease.MetaTime] == "" {
			t.Errorf("the snapshot's metadata %v does not name its writer (epoch %d, holder %s)", md, l.Epoch(), l.Holder().ID)
		}

		expect(t, s, "write_file", `{"path": "b.txt", "content": "two"}`, false)
		before, err := th.Storage().Snapshots(ctx, "shop")
		if err != nil {
			t.Fatal(err)
		}
		ls.armed.Store(true)
		info2, err := s.live.Commit(ctx, "two") // past Session.Commit's own check, as a save under way is
		if !errors.Is(err, lease.ErrFenced) || !errors.Is(err, lease.ErrLost) || ls.hit.Load() != 1 {
			t.Fatalf("a save under way at the loss: %v (%d writes tried), want ErrFenced, one write (%+v)", err, ls.hit.Load(), info2)
		}
		after, err := th.Storage().Snapshots(ctx, "shop")
		if err != nil || len(after) != len(before) {
			t.Errorf("snapshots after the fenced save: %v %v, want the %d from before", after, err, len(before))
		}
		if _, err := s.Commit(ctx, "three"); !errors.Is(err, lease.ErrFenced) {
			t.Errorf("a commit after the loss: %v, want ErrFenced", err)
		}
		if _, err := s.live.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, lease.ErrFenced) {
			t.Errorf("a sandbox operation after the loss: %v, want ErrFenced", err)
		}
	})
}
