package fleet

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/lease"
	"github.com/toolhost/toolhost/internal/store/dir"
)

var secret = []byte("a-fleet-secret-of-more-than-32-bytes!!")

func newStore(t *testing.T) store.Store {
	st, err := dir.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// serveReplica joins st's fleet as a replica answering health on a loopback listener.
func serveReplica(t *testing.T, st store.Store, sec []byte) (*Fleet, *httptest.Server) {
	t.Helper()
	mux := http.NewServeMux()
	hs := httptest.NewUnstartedServer(mux)
	f, err := Join(context.Background(), Config{Advertise: "http://" + hs.Listener.Addr().String(), Secret: sec, Store: st, Heartbeat: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	mux.Handle("GET "+HealthPath, f.HealthHandler())
	hs.Start()
	t.Cleanup(func() { hs.Close(); f.Close(context.Background()) })
	return f, hs
}

// TestProbe: only proof counts. The named replica proving itself is alive; a refused
// connection or another replica of the fleet at the address is dead; a listener that
// does not answer in time, or answers without the secret, proves nothing.
func TestProbe(t *testing.T) {
	st := newStore(t)
	a, ahs := serveReplica(t, st, secret)
	b, _ := serveReplica(t, st, secret)
	ctx := context.Background()
	if got := b.Probe(ctx, a.Advertise(), a.Instance(), time.Second); got != lease.Alive {
		t.Errorf("a live replica: %v, want alive", got)
	}
	if got := b.Probe(ctx, a.Advertise(), "someoneelse", time.Second); got != lease.Dead {
		t.Errorf("another replica at the address: %v, want dead", got)
	}
	// A replica that does not know the secret proves nothing.
	c, _ := serveReplica(t, st, []byte("not-the-fleet-secret-but-32-bytes-long"))
	if got := b.Probe(ctx, c.Advertise(), "someoneelse", time.Second); got != lease.Unknown {
		t.Errorf("a stranger at the address: %v, want unknown", got)
	}
	// A stalled replica (accepts, never answers) proves nothing either.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if got := b.Probe(ctx, "http://"+ln.Addr().String(), a.Instance(), 300*time.Millisecond); got != lease.Unknown {
		t.Errorf("a listener that never answers: %v, want unknown", got)
	}
	ahs.Close() // the port now refuses
	if got := b.Probe(ctx, a.Advertise(), a.Instance(), time.Second); got != lease.Dead {
		t.Errorf("a refused connection: %v, want dead", got)
	}
	// Outside the peer ranges: not even asked.
	if got := b.Probe(ctx, "http://192.0.2.1:80", a.Instance(), time.Second); got != lease.Unknown {
		t.Errorf("an address outside the peers: %v, want unknown", got)
	}
}

// TestCheckTarget: a lease record's address is forwarded to only when it is in the peer
// ranges and the registry has that instance, fresh, at that address.
func TestCheckTarget(t *testing.T) {
	st := newStore(t)
	a, _ := serveReplica(t, st, secret)
	b, _ := serveReplica(t, st, secret)
	ctx := context.Background()
	if err := b.CheckTarget(ctx, a.Instance(), a.Advertise()); err != nil {
		t.Errorf("a registered replica: %v", err)
	}
	for _, c := range []struct{ name, inst, addr string }{
		{"an address outside the peers", a.Instance(), "http://192.0.2.7:8750"},
		{"another address than the registry's", a.Instance(), "http://127.0.0.1:1"},
		{"an instance with no record", "nosuchreplica", a.Advertise()},
		{"an instance that is no name", "../../etc", a.Advertise()},
		{"this replica", b.Instance(), b.Advertise()},
		{"not a URL", a.Instance(), "127.0.0.1:8750"},
		{"credentials in the URL", a.Instance(), "http://u:p@" + strings.TrimPrefix(a.Advertise(), "http://")},
	} {
		if err := b.CheckTarget(ctx, c.inst, c.addr); !errors.Is(err, ErrNotPeer) {
			t.Errorf("%s: %v, want ErrNotPeer", c.name, err)
		}
	}
	// A replica that stopped renewing its record is no target.
	a.Close(ctx)
	if err := b.CheckTarget(ctx, a.Instance(), a.Advertise()); !errors.Is(err, ErrNotPeer) {
		t.Errorf("a replica that left: %v, want ErrNotPeer", err)
	}
}

// TestJoin refuses what a replica cannot run with, and ReadSecret a secret others read.
func TestJoin(t *testing.T) {
	st := newStore(t)
	ctx := context.Background()
	for _, c := range []Config{
		{Advertise: "http://127.0.0.1:1", Secret: []byte("short"), Store: st},
		{Advertise: "127.0.0.1:1", Secret: secret, Store: st},
		{Advertise: "http://toolhost.example:1", Secret: secret, Store: st},
		{Advertise: "http://127.0.0.1:1", Secret: secret, Store: st, Peers: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}},
		{Advertise: "http://127.0.0.1:1", Secret: secret, Store: st, Instance: "a/b"},
	} {
		if f, err := Join(ctx, c); err == nil {
			f.Close(ctx)
			t.Errorf("joined with %+v", c)
		}
	}
	d := t.TempDir()
	p := filepath.Join(d, "secret")
	os.WriteFile(p, append(secret, '\n'), 0o644)
	if _, err := ReadSecret(p); err == nil || !strings.Contains(err.Error(), "readable by others") {
		t.Errorf("a secret others read: %v", err)
	}
	os.Chmod(p, 0o600)
	got, err := ReadSecret(p)
	if err != nil || string(got) != string(secret) {
		t.Errorf("a good secret: %q, %v", got, err)
	}
	os.WriteFile(p, []byte("short\n"), 0o600)
	if _, err := ReadSecret(p); err == nil {
		t.Error("a short secret was read")
	}
}

// TestStatus: the registry's replicas, each with the projects whose lease names it; a
// project held outside the fleet apart.
func TestStatus(t *testing.T) {
	st := newStore(t)
	a, _ := serveReplica(t, st, secret)
	ctx := context.Background()
	la, err := lease.Acquire(ctx, lease.Config{Store: st, Instance: a.Instance(), Addr: a.Advertise()}, "shop")
	if err != nil {
		t.Fatal(err)
	}
	defer la.Release(ctx)
	lb, err := lease.Acquire(ctx, lease.Config{Store: st, Host: "laptop"}, "blog")
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Release(ctx)
	s, err := ReadStatus(ctx, st, time.Second, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Replicas) != 1 || s.Replicas[0].Instance != a.Instance() || !s.Replicas[0].Fresh ||
		len(s.Replicas[0].Projects) != 1 || s.Replicas[0].Projects[0].Project != "shop" || s.Replicas[0].Projects[0].Epoch != la.Epoch() {
		t.Errorf("replicas: %+v", s.Replicas)
	}
	if len(s.Elsewhere) != 1 || s.Elsewhere[0].Project != "blog" || s.Elsewhere[0].Host != "laptop" {
		t.Errorf("held elsewhere: %+v", s.Elsewhere)
	}
}
