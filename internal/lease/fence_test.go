package lease

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/store/dir"
)

func dirStore(t *testing.T) store.Store {
	t.Helper()
	st, err := dir.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// fleetCfg is hostCfg for a fleet replica: an instance and an address.
func fleetCfg(st store.Store, host, instance, addr string, c *clock) Config {
	cfg := hostCfg(st, host, c)
	cfg.Instance, cfg.Addr = instance, addr
	return cfg
}

// A holder the probe finds dead is taken over at once, before its lease expires: the
// taker's epoch is the next, the old holder's renewal finds it lost, and others are told
// of the new holder.
func TestProbeDeadTakesOver(t *testing.T) {
	ctx := context.Background()
	st := dirStore(t)
	a, err := Acquire(ctx, fleetCfg(st, "host-a", "inst-a", "a.fleet:8443", nil), "shop")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	var asked []Holder
	cfg := fleetCfg(st, "host-b", "inst-b", "b.fleet:8443", nil)
	cfg.ProbeTimeout = 5 * time.Second
	cfg.Probe = func(ctx context.Context, h Holder) Liveness {
		if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > 5*time.Second {
			t.Errorf("probe's context has no deadline within ProbeTimeout: %v %v", dl, ok)
		}
		asked = append(asked, h)
		return Dead
	}
	b, err := Acquire(ctx, cfg, "shop")
	if err != nil {
		t.Fatalf("Acquire with the holder found dead: %v", err)
	}
	defer b.Release(ctx)
	if len(asked) != 1 || asked[0].Instance != "inst-a" || asked[0].Addr != "a.fleet:8443" || asked[0].ID != a.Holder().ID {
		t.Errorf("probe asked about %+v, want a's holder %+v once", asked, a.Holder())
	}
	if b.Epoch() != a.Epoch()+1 {
		t.Errorf("b's epoch %d, want a's %d + 1", b.Epoch(), a.Epoch())
	}
	rerr := a.renew()
	if !errors.Is(rerr, ErrLost) {
		t.Fatalf("a's renewal after the takeover: %v", rerr)
	}
	a.setLost(rerr)
	if err := a.Fence(); !errors.Is(err, ErrFenced) || !errors.Is(err, ErrLost) || !errors.Is(err, store.ErrFenced) {
		t.Errorf("a.Fence after the takeover: %v", err)
	}
	select {
	case <-a.Done():
	default:
		t.Error("a.Done not closed once a lost the lease")
	}
	_, err = Acquire(ctx, hostCfg(st, "host-c", nil), "shop")
	var held *HeldError
	if !errors.As(err, &held) || held.Holder.ID != b.Holder().ID || held.Liveness != Unknown {
		t.Fatalf("c after the takeover: %v, want held by b (liveness unknown: no probe)", err)
	}
}

// A holder the probe finds alive, or cannot tell about, keeps its lease: HeldError, with
// the probe's answer and the holder's fleet address for forwarding, none of which the
// message shows.
func TestProbeAliveOrUnknownHeld(t *testing.T) {
	ctx := context.Background()
	st := dirStore(t)
	a, err := Acquire(ctx, fleetCfg(st, "host-a", "inst-a", "a.fleet:8443", nil), "shop")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	for _, lv := range []Liveness{Alive, Unknown, Liveness(42)} {
		cfg := hostCfg(st, "host-b", nil)
		var calls atomic.Int32
		cfg.Probe = func(context.Context, Holder) Liveness { calls.Add(1); return lv }
		_, err := Acquire(ctx, cfg, "shop")
		var held *HeldError
		if !errors.As(err, &held) || !errors.Is(err, ErrHeld) {
			t.Fatalf("probe answering %v: %v, want HeldError", lv, err)
		}
		want := lv
		if lv != Alive {
			want = Unknown
		}
		if held.Liveness != want || held.Holder.Addr != "a.fleet:8443" || held.Holder.Instance != "inst-a" || calls.Load() != 1 {
			t.Errorf("probe answering %v: %+v after %d probes", lv, held, calls.Load())
		}
		if msg := err.Error(); strings.Contains(msg, "a.fleet") || strings.Contains(msg, "inst-a") || !strings.Contains(msg, "open on host host-a") {
			t.Errorf("message %q shows the fleet's internals, or not the host", msg)
		}
	}
	if err := a.Fence(); err != nil {
		t.Errorf("a after the refused takers: %v", err)
	}
}

// A takeover of a holder found dead races the holder's renewal like any takeover: when
// the renewal wins, the holder lives (it renewed after the probe), the taker is told so,
// and the holder keeps its lease.
func TestProbeDeadButRenewed(t *testing.T) {
	ctx := context.Background()
	st := dirStore(t)
	a, err := Acquire(ctx, fleetCfg(st, "host-a", "inst-a", "a.fleet:8443", nil), "shop")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	cfg := hostCfg(st, "host-b", nil)
	cfg.Probe = func(context.Context, Holder) Liveness {
		if err := a.renew(); err != nil { // between b's probe and its claim
			t.Errorf("a's renewal: %v", err)
		}
		return Dead
	}
	_, err = Acquire(ctx, cfg, "shop")
	var held *HeldError
	if !errors.As(err, &held) || held.Liveness != Alive || held.Holder.ID != a.Holder().ID {
		t.Fatalf("taker that lost to the holder's renewal: %v, want held by a, alive", err)
	}
	if err := a.renew(); err != nil {
		t.Errorf("a's next renewal: %v", err)
	}
}

// httpHello is a test's fleet hello: GET / answers the instance.
func httpHello(ctx context.Context, addr string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/", nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 256))
	return string(b), err
}

// closedAddr is a loopback address where nothing listens (a listener's, closed).
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// ProbeWith on real addresses: refused or another instance is Dead, the holder itself
// Alive, no answer in time or no address Unknown; and through Acquire, a holder whose
// address refuses is taken over at once.
func TestProbeWith(t *testing.T) {
	probe := ProbeWith(httpHello)
	answering := func(instance string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, instance) }))
		t.Cleanup(srv.Close)
		return strings.TrimPrefix(srv.URL, "http://")
	}
	hanging := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	t.Cleanup(hanging.Close)
	refused := closedAddr(t)
	for _, c := range []struct {
		name string
		h    Holder
		want Liveness
	}{
		{"refused", Holder{Instance: "inst-a", Addr: refused}, Dead},
		{"another instance", Holder{Instance: "inst-a", Addr: answering("inst-z")}, Dead},
		{"itself", Holder{Instance: "inst-a", Addr: answering("inst-a")}, Alive},
		{"empty answer", Holder{Instance: "inst-a", Addr: answering("")}, Unknown},
		{"no answer in time", Holder{Instance: "inst-a", Addr: strings.TrimPrefix(hanging.URL, "http://")}, Unknown},
		{"no address", Holder{Instance: "inst-a"}, Unknown},
		{"not in a fleet", Holder{Addr: refused}, Unknown},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		if got := probe(ctx, c.h); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
		cancel()
	}

	ctx := context.Background()
	st := dirStore(t)
	a, err := Acquire(ctx, fleetCfg(st, "host-a", "inst-a", refused, nil), "shop")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	cfg := fleetCfg(st, "host-b", "inst-b", answering("inst-b"), nil)
	cfg.Probe = probe
	b, err := Acquire(ctx, cfg, "shop")
	if err != nil {
		t.Fatalf("taking over a holder whose address refuses: %v", err)
	}
	b.Release(ctx)
}

// Fence: writes carry the writer; once the lease is lost (a takeover seen by a renewal,
// or this host's clock past the expiry) every Put and Delete is refused, writing
// nothing; reads go on.
func TestFence(t *testing.T) {
	backends(t, func(t *testing.T, newStore func() store.Store) {
		ctx := context.Background()
		st := newStore()
		var ca, cb clock
		a, err := Acquire(ctx, fleetCfg(st, "host-a", "inst-a", "", &ca), "shop")
		if err != nil {
			t.Fatal(err)
		}
		defer a.Release(ctx)
		fa := Fence(st, a)
		if _, ok := fa.(store.URLer); !ok {
			t.Error("the fenced store lost its store's URLer")
		}
		before := time.Now().UTC()
		if _, err := fa.Put(ctx, "projects/shop/x", strings.NewReader("one"), store.PutOptions{Size: 3, Metadata: map[string]string{"sha256": "abc"}}); err != nil {
			t.Fatal(err)
		}
		oi, err := st.Head(ctx, "projects/shop/x")
		if err != nil {
			t.Fatal(err)
		}
		md := oi.Metadata
		wt, terr := time.Parse(time.RFC3339Nano, md[MetaTime])
		if md["sha256"] != "abc" || md[MetaInstance] != "inst-a" || md[MetaHolder] != a.Holder().ID ||
			md[MetaEpoch] != strconv.FormatUint(a.Epoch(), 10) || terr != nil || wt.Before(before.Add(-time.Second)) {
			t.Errorf("metadata %v: want the caller's and the writer's (instance inst-a, holder %s, epoch %d, a time)", md, a.Holder().ID, a.Epoch())
		}

		// b takes over (a's lease expired on b's clock); a learns it at its renewal.
		cb.advance(3 * time.Hour)
		b, err := Acquire(ctx, hostCfg(newStore(), "host-b", &cb), "shop")
		if err != nil {
			t.Fatal(err)
		}
		defer b.Release(ctx)
		rerr := a.renew()
		if !errors.Is(rerr, ErrLost) {
			t.Fatalf("a's renewal: %v", rerr)
		}
		a.setLost(rerr)
		_, err = fa.Put(ctx, "projects/shop/y", strings.NewReader("two"), store.PutOptions{Size: 3})
		if !errors.Is(err, ErrFenced) || !errors.Is(err, ErrLost) || !store.Permanent(err) || !strings.Contains(err.Error(), "fenced") {
			t.Fatalf("Put after the loss: %v, want ErrFenced (permanent)", err)
		}
		if err := fa.Delete(ctx, "projects/shop/x"); !errors.Is(err, ErrFenced) {
			t.Fatalf("Delete after the loss: %v", err)
		}
		if _, _, err := st.Get(ctx, "projects/shop/y"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("the refused Put wrote: %v", err)
		}
		rc, _, err := fa.Get(ctx, "projects/shop/x") // still there, and reads pass
		if err != nil {
			t.Fatalf("the refused Delete deleted, or reads are fenced: %v", err)
		}
		rc.Close()
	})
}

// A holder whose clock passed its expiry is fenced at once, before any renewal says so.
func TestFenceLocalExpiry(t *testing.T) {
	ctx := context.Background()
	st := dirStore(t)
	var c clock
	a, err := Acquire(ctx, hostCfg(st, "host-a", &c), "shop")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	fa := Fence(st, a)
	if _, err := fa.Put(ctx, "k", strings.NewReader("x"), store.PutOptions{Size: 1}); err != nil {
		t.Fatal(err)
	}
	c.advance(2*time.Hour + time.Second)
	if _, err := fa.Put(ctx, "k2", strings.NewReader("x"), store.PutOptions{Size: 1}); !errors.Is(err, ErrFenced) {
		t.Fatalf("Put past the expiry: %v", err)
	}
	if _, err := st.Head(ctx, "k2"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("written past the expiry: %v", err)
	}
}

// blockingStore holds every Put to a key under "slow/" until its context ends, after
// reading its body.
type blockingStore struct {
	store.Store
	started chan struct{}
}

func (b *blockingStore) Put(ctx context.Context, key string, r io.Reader, opts store.PutOptions) (store.ObjectInfo, error) {
	if !strings.HasPrefix(key, "slow/") {
		return b.Store.Put(ctx, key, r, opts)
	}
	io.Copy(io.Discard, r)
	b.started <- struct{}{}
	<-ctx.Done()
	return store.ObjectInfo{}, fmt.Errorf("put %s: %w", key, ctx.Err())
}

// A write under way when the lease is lost ends with it: at the loss a renewal found,
// and, when no renewal gets through, at the expiry.
func TestFenceCutsWriteInFlight(t *testing.T) {
	ctx := context.Background()
	t.Run("takeover", func(t *testing.T) {
		st := &blockingStore{Store: dirStore(t), started: make(chan struct{}, 1)}
		a, err := Acquire(ctx, hostCfg(st, "host-a", nil), "shop")
		if err != nil {
			t.Fatal(err)
		}
		defer a.Release(ctx)
		errc := make(chan error, 1)
		go func() {
			_, err := Fence(st, a).Put(ctx, "slow/x", bytes.NewReader([]byte("x")), store.PutOptions{Size: 1})
			errc <- err
		}()
		<-st.started
		a.setLost(fmt.Errorf("%w: project shop: another host took it over", ErrLost))
		if err := <-errc; !errors.Is(err, ErrFenced) || !strings.Contains(err.Error(), "took it over") {
			t.Fatalf("the write under way at the loss: %v", err)
		}
	})
	t.Run("expiry", func(t *testing.T) {
		f := &flakyStore{Store: dirStore(t)}
		f.puts.Store(true)
		st := &blockingStore{Store: f, started: make(chan struct{}, 1)}
		cfg := hostCfg(st, "host-a", nil)
		cfg.TTL, cfg.Renew = 300*time.Millisecond, 100*time.Millisecond
		a, err := Acquire(ctx, cfg, "shop")
		if err != nil {
			t.Fatal(err)
		}
		defer a.Release(ctx)
		f.down.Store(true) // no renewal gets through: the lease runs out
		errc := make(chan error, 1)
		go func() {
			_, err := Fence(st, a).Put(ctx, "slow/x", bytes.NewReader([]byte("x")), store.PutOptions{Size: 1})
			errc <- err
		}()
		<-st.started
		select {
		case err := <-errc:
			if !errors.Is(err, ErrFenced) {
				t.Fatalf("the write under way at the expiry: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the write under way outlived the lease")
		}
	})
	t.Run("parent", func(t *testing.T) {
		st := &blockingStore{Store: dirStore(t), started: make(chan struct{}, 1)}
		a, err := Acquire(ctx, hostCfg(st, "host-a", nil), "shop")
		if err != nil {
			t.Fatal(err)
		}
		defer a.Release(ctx)
		pctx, cancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() {
			_, err := Fence(st, a).Put(pctx, "slow/x", bytes.NewReader([]byte("x")), store.PutOptions{Size: 1})
			errc <- err
		}()
		<-st.started
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) || errors.Is(err, ErrFenced) {
			t.Fatalf("a write its caller cancelled: %v, want context.Canceled, not fenced", err)
		}
	})
}
