package lease

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/store/dir"
	s3store "github.com/toolhost/toolhost/internal/store/s3"
	"github.com/toolhost/toolhost/internal/store/s3/s3test"
	"github.com/toolhost/toolhost/internal/testenv"
)

var srv *s3test.Server

func TestMain(m *testing.M) {
	for _, k := range []string{"AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_REGION"} {
		os.Unsetenv(k)
	}
	var err error
	srv, err = s3test.Start("")
	if err != nil {
		log.Fatalf("start the test S3 server: %v", err)
	}
	code := m.Run()
	srv.Close()
	os.Exit(code)
}

// backends runs f against each store backend: a directory and the in-process S3 server.
func backends(t *testing.T, f func(t *testing.T, newStore func() store.Store)) {
	t.Run("dir", func(t *testing.T) {
		d := filepath.Join(t.TempDir(), "store")
		f(t, func() store.Store {
			s, err := dir.New(d) // several instances on one directory: several hosts
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		})
	})
	t.Run("s3", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		bucket, err := srv.NewBucket(ctx, "lease")
		if err != nil {
			t.Fatal(err)
		}
		f(t, func() store.Store {
			s, err := s3store.New(ctx, s3store.Config{
				Bucket: bucket, Endpoint: srv.Endpoint, PathStyle: true, Region: s3test.Region,
				AccessKeyID: s3test.AccessKey, SecretAccessKey: s3test.SecretKey,
				MaxBackoff: 5 * time.Millisecond, TempDir: t.TempDir(),
			})
			if err != nil {
				t.Fatal(err)
			}
			return s
		})
	})
}

// clock is a settable clock shared by the hosts of a test.
type clock struct {
	mu  sync.Mutex
	off time.Duration
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.off)
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.off += d
	c.mu.Unlock()
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// hostCfg is a host's configuration: renewals far apart, so a test decides when one
// happens (by calling renew) unless it asks for them.
func hostCfg(st store.Store, host string, c *clock) Config {
	cfg := Config{Store: st, TTL: 2 * time.Hour, Renew: time.Hour, Host: host, Logger: quiet}
	if c != nil {
		cfg.now = c.now
	}
	return cfg
}

func TestSecondHostRefusedUntilRelease(t *testing.T) {
	backends(t, func(t *testing.T, newStore func() store.Store) {
		ctx := context.Background()
		a, err := Acquire(ctx, hostCfg(newStore(), "host-a", nil), "shop")
		if err != nil {
			t.Fatal(err)
		}
		_, err = Acquire(ctx, hostCfg(newStore(), "host-b", nil), "shop")
		var held *HeldError
		if !errors.As(err, &held) || !errors.Is(err, ErrHeld) {
			t.Fatalf("second Acquire: %v, want a HeldError", err)
		}
		if held.Holder.Host != "host-a" || held.Holder.ID != a.Holder().ID || held.Holder.PID != os.Getpid() {
			t.Errorf("holder %+v, want host-a's %+v", held.Holder, a.Holder())
		}
		msg := err.Error()
		for _, want := range []string{"project shop is open on host host-a", "since ", "close it there or wait until " + a.Expires().UTC().Format(time.RFC3339)} {
			if !strings.Contains(msg, want) {
				t.Errorf("message %q lacks %q", msg, want)
			}
		}
		// Another project is free.
		o, err := Acquire(ctx, hostCfg(newStore(), "host-b", nil), "other")
		if err != nil {
			t.Fatalf("another project: %v", err)
		}
		o.Release(ctx)

		if err := a.Err(); err != nil {
			t.Fatalf("held lease: %v", err)
		}
		if err := a.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := a.Err(); !errors.Is(err, ErrLost) {
			t.Errorf("after Release, Err = %v", err)
		}
		b, err := Acquire(ctx, hostCfg(newStore(), "host-b", nil), "shop")
		if err != nil {
			t.Fatalf("after release: %v", err)
		}
		defer b.Release(ctx)
		// One generation object is left: the newest.
		objs, err := store.ListAll(ctx, newStore(), Prefix("shop"))
		if err != nil || len(objs) != 1 {
			t.Errorf("lease objects: %v %v, want one", objs, err)
		}
	})
}

// A holder that died (stopped renewing) is taken over once its lease expired; a takeover
// is not possible before, and the old holder learns it lost the lease when it renews.
func TestExpiredTakenOver(t *testing.T) {
	backends(t, func(t *testing.T, newStore func() store.Store) {
		ctx := context.Background()
		var ca, cb clock
		a, err := Acquire(ctx, hostCfg(newStore(), "host-a", &ca), "shop")
		if err != nil {
			t.Fatal(err)
		}
		defer a.Release(ctx)
		if _, err := Acquire(ctx, hostCfg(newStore(), "host-b", &cb), "shop"); !errors.Is(err, ErrHeld) {
			t.Fatalf("before expiry: %v", err)
		}
		cb.advance(2*time.Hour + time.Second) // b's clock past a's expiry; a's not
		b, err := Acquire(ctx, hostCfg(newStore(), "host-b", &cb), "shop")
		if err != nil {
			t.Fatalf("after expiry: %v", err)
		}
		defer b.Release(ctx)
		if err := a.Err(); err != nil {
			t.Fatalf("a's own clock says it still holds: %v", err)
		}
		// a wakes up and renews: the generation it needs is b's.
		if err := a.renew(); !errors.Is(err, ErrLost) || !strings.Contains(err.Error(), "took it over") {
			t.Fatalf("a's renewal after the takeover: %v", err)
		}
		// b's lease is intact; a's Release gives nothing up.
		a.setLost(fmt.Errorf("%w: test", ErrLost))
		if err := a.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := Acquire(ctx, hostCfg(newStore(), "host-c", &cb), "shop"); !errors.Is(err, ErrHeld) || !strings.Contains(err.Error(), "host host-b") {
			t.Fatalf("after a's release, c: %v, want held by host-b", err)
		}
		// Its own clock also tells a holder its lease ran out.
		ca.advance(2*time.Hour + time.Second)
		if err := a.Err(); !errors.Is(err, ErrLost) {
			t.Fatalf("a past its expiry: %v", err)
		}
	})
}

// Many hosts take over one expired lease at once: exactly one wins each time, and the
// others name it.
func TestConcurrentTakeover(t *testing.T) {
	backends(t, func(t *testing.T, newStore func() store.Store) {
		ctx := context.Background()
		const rounds, takers = 15, 8
		var c clock
		stores := make([]store.Store, takers)
		for i := range stores {
			stores[i] = newStore()
		}
		for round := range rounds {
			project := fmt.Sprintf("p%d", round)
			if _, err := Acquire(ctx, hostCfg(stores[0], "dead", &c), project); err != nil {
				t.Fatal(err)
			}
			// The holder "dies": its renewals are an hour apart, and the clock moves past
			// its expiry.
			var won atomic.Int32
			var winner atomic.Value
			var wg sync.WaitGroup
			c2 := &clock{off: c.off + 3*time.Hour}
			leases := make(chan *Lease, takers)
			for i := range takers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					host := fmt.Sprintf("taker-%d", i)
					l, err := Acquire(ctx, hostCfg(stores[i], host, c2), project)
					switch {
					case err == nil:
						won.Add(1)
						winner.Store(host)
						leases <- l
					case !errors.Is(err, ErrHeld):
						t.Errorf("round %d, %s: %v", round, host, err)
					}
				}()
			}
			wg.Wait()
			close(leases)
			if n := won.Load(); n != 1 {
				t.Fatalf("round %d: %d takers won, want exactly 1", round, n)
			}
			_, err := Acquire(ctx, hostCfg(stores[0], "late", c2), project)
			if w := winner.Load().(string); !strings.Contains(fmt.Sprint(err), "host "+w) {
				t.Errorf("round %d: late taker got %v, want held by %s", round, err, w)
			}
			for l := range leases {
				l.Release(ctx)
			}
		}
	})
}

// The renewing goroutine renews the lease (newer generations, the old ones removed) and
// stops at Release.
func TestRenewal(t *testing.T) {
	backends(t, func(t *testing.T, newStore func() store.Store) {
		ctx := context.Background()
		st := newStore()
		cfg := hostCfg(st, "host-a", nil)
		cfg.Renew, cfg.CallTimeout = 5*time.Millisecond, 30*time.Second
		l, err := Acquire(ctx, cfg, "shop")
		if err != nil {
			t.Fatal(err)
		}
		first := l.Expires()
		if !testenv.Eventually(func() bool { return l.gen0() >= 4 }) {
			t.Fatalf("generation %d after %s of renewals every 5 ms", l.gen0(), testenv.HangBound)
		}
		if !l.Expires().After(first) {
			t.Errorf("expiry %s not after the first %s", l.Expires(), first)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		g := l.gen0()
		objs, err := store.ListAll(ctx, st, Prefix("shop"))
		if err != nil || len(objs) != 1 || objs[0].Key != genKey("shop", g+1) {
			t.Fatalf("after release: %v %v, want only generation %d (released)", objs, err, g+1)
		}
	})
}

func (l *Lease) gen0() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.gen
}

// A generation created again after its removal (a stalled host's late write) loses to
// the higher generation that exists.
func TestClaimBelowNewest(t *testing.T) {
	backends(t, func(t *testing.T, newStore func() store.Store) {
		ctx := context.Background()
		st := newStore()
		b, err := Acquire(ctx, hostCfg(st, "host-b", nil), "shop")
		if err != nil {
			t.Fatal(err)
		}
		defer b.Release(ctx)
		for range 3 {
			if err := b.renew(); err != nil {
				t.Fatal(err)
			}
		}
		if b.gen0() != 4 {
			t.Fatalf("b at generation %d, want 4", b.gen0())
		}
		a := &Lease{cfg: hostCfg(st, "host-a", nil), project: "shop", holder: Holder{Host: "host-a"}}
		a.cfg.defaults()
		won, err := a.claim(ctx, 2, record{Holder: a.holder, Expires: time.Now().Add(time.Hour)})
		if err != nil || won {
			t.Fatalf("claim of a removed generation below the newest: %v %v, want a loss", won, err)
		}
		if _, _, err := st.Get(ctx, genKey("shop", 2)); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("the lost claim's object is still there: %v", err)
		}
		if _, err := Acquire(ctx, hostCfg(st, "host-c", nil), "shop"); !errors.Is(err, ErrHeld) || !strings.Contains(err.Error(), "host-b") {
			t.Errorf("after a's late claim: %v", err)
		}
	})
}

// An unreadable generation (not written by this package) counts as expired.
func TestUnreadableGeneration(t *testing.T) {
	backends(t, func(t *testing.T, newStore func() store.Store) {
		ctx := context.Background()
		st := newStore()
		if _, err := st.Put(ctx, genKey("shop", 7), strings.NewReader(strings.Repeat("x", 10000)), store.PutOptions{Size: -1}); err != nil {
			t.Fatal(err)
		}
		l, err := Acquire(ctx, hostCfg(st, "host-a", nil), "shop")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(ctx)
		if l.gen0() != 8 {
			t.Errorf("generation %d, want 8", l.gen0())
		}
	})
}

// blindStore ignores IfNotExists, as some S3-compatible endpoints ignore If-None-Match.
type blindStore struct{ store.Store }

func (b blindStore) Put(ctx context.Context, key string, r io.Reader, opts store.PutOptions) (store.ObjectInfo, error) {
	opts.IfNotExists = false
	return b.Store.Put(ctx, key, r, opts)
}

func TestCheck(t *testing.T) {
	backends(t, func(t *testing.T, newStore func() store.Store) {
		ctx := context.Background()
		st := newStore()
		if err := Check(ctx, st, "lease-probe/x"); err != nil {
			t.Fatalf("Check: %v", err)
		}
		if _, _, err := st.Get(ctx, "lease-probe/x"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("probe left behind: %v", err)
		}
		if err := Check(ctx, blindStore{st}, "lease-probe/y"); !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "If-None-Match") {
			t.Fatalf("Check of a store that ignores IfNotExists: %v", err)
		}
	})
}

func TestConfig(t *testing.T) {
	st, err := dir.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := Acquire(context.Background(), Config{Store: st, TTL: time.Second, Renew: time.Second}, "p"); err == nil {
		t.Error("renew interval equal to the ttl accepted")
	}
	if _, err := Acquire(context.Background(), Config{Store: st}, "../x"); !errors.Is(err, store.ErrInvalidKey) {
		t.Errorf("bad project: %v", err)
	}
}

// flakyStore fails List (and, with puts set, Put) while down is set.
type flakyStore struct {
	store.Store
	down, puts atomic.Bool
}

var errDown = fmt.Errorf("%w: test outage", store.ErrUnreachable)

func (f *flakyStore) List(ctx context.Context, opts store.ListOptions) (store.ListPage, error) {
	if f.down.Load() {
		return store.ListPage{}, errDown
	}
	return f.Store.List(ctx, opts)
}

func (f *flakyStore) Put(ctx context.Context, key string, r io.Reader, opts store.PutOptions) (store.ObjectInfo, error) {
	if f.down.Load() && f.puts.Load() {
		return store.ObjectInfo{}, errDown
	}
	return f.Store.Put(ctx, key, r, opts)
}

// A generation whose creation cannot be verified is removed: it does not keep the
// project closed with no one renewing it.
func TestUnverifiedClaimRemoved(t *testing.T) {
	st, err := dir.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	f := &flakyStore{Store: st}
	a := &Lease{cfg: hostCfg(f, "host-a", nil), project: "shop", holder: Holder{Host: "host-a"}}
	a.cfg.defaults()
	f.down.Store(true)
	if won, err := a.claim(ctx, 1, record{Holder: a.holder, Expires: time.Now().Add(time.Hour)}); won || !errors.Is(err, store.ErrUnreachable) {
		t.Fatalf("claim with listing down: %v %v", won, err)
	}
	f.down.Store(false)
	l, err := Acquire(ctx, hostCfg(st, "host-b", nil), "shop")
	if err != nil {
		t.Fatalf("after the unverified claim: %v", err)
	}
	l.Release(ctx)
}

// While the store is down the holder keeps trying; when its lease runs out before a
// renewal gets through, the lease is lost: OnLost is called once, Err says so, and the
// renewing goroutine ends.
func TestLostWhenStoreDown(t *testing.T) {
	st, err := dir.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	f := &flakyStore{Store: st}
	f.puts.Store(true)
	var c clock
	cfg := hostCfg(f, "host-a", &c)
	cfg.Renew, cfg.CallTimeout = 5*time.Millisecond, 30*time.Second
	var lost atomic.Int32
	cfg.OnLost = func(error) { lost.Add(1) }
	l, err := Acquire(ctx, cfg, "shop")
	if err != nil {
		t.Fatal(err)
	}
	f.down.Store(true)
	c.advance(3 * time.Hour)
	select {
	case <-l.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the renewing goroutine did not end when the lease ran out")
	}
	if lost.Load() != 1 || !errors.Is(l.Err(), ErrLost) {
		t.Errorf("OnLost called %d times, Err %v", lost.Load(), l.Err())
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release of a lost lease: %v", err)
	}
}
