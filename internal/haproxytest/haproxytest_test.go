package haproxytest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/toolhost/toolhost/internal/testenv"
)

func needHAProxy(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(Binary); err != nil {
		testenv.Skipf(t, "HAProxy is not installed at %s (make test installs it: Debian package haproxy): %v", Binary, err)
	}
}

// TestConfigChecks: haproxy -c accepts the configuration with its variables set, and
// refuses it without them (every address comes from the environment).
func TestConfigChecks(t *testing.T) {
	needHAProxy(t)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
	defer cancel()
	env := Env("127.0.0.1:8750", "/run/haproxy-admin.sock", [Slots]string{"127.0.0.1:8751", "127.0.0.1:8752", "127.0.0.1:8753"})
	if err := Check(ctx, env); err != nil {
		t.Fatal(err)
	}
	if err := Check(ctx, nil); err == nil {
		t.Fatal("haproxy -c accepted the configuration without its variables")
	}
}

// TestConfigHasNoAffinity: the replicas share every project, so the balancer keeps no
// affinity: round robin, and none of HAProxy's ways to stick a client to a server.
func TestConfigHasNoAffinity(t *testing.T) {
	data, err := os.ReadFile(ConfigPath())
	if err != nil {
		t.Fatal(err)
	}
	balance := 0
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	for n := 1; sc.Scan(); n++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		switch {
		case f[0] == "balance":
			balance++
			if len(f) != 2 || f[1] != "roundrobin" {
				t.Errorf("line %d: %s: want balance roundrobin", n, sc.Text())
			}
		case strings.HasPrefix(f[0], "stick") || f[0] == "cookie" || f[0] == "hash-type" || f[0] == "persist" ||
			f[0] == "option" && len(f) > 1 && (f[1] == "persist" || f[1] == "prefer-last-server"):
			t.Errorf("line %d: %s: affinity", n, sc.Text())
		}
	}
	if balance != 1 {
		t.Errorf("%d balance lines, want 1", balance)
	}
}

// backend is a trivial replica: it answers its name, and /readyz 200 or 503. Like
// toolhost serve on loopback, it refuses a request that names no loopback host (so the
// balancer's health check must name one).
type backend struct {
	name     string
	srv      *httptest.Server
	draining atomic.Bool
	served   atomic.Int64 // requests other than health checks
}

func newBackend(t *testing.T, name string) *backend {
	b := &backend{name: name}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.Host)
		if err != nil {
			host = r.Host
		}
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			http.Error(w, fmt.Sprintf("Host %q is not a loopback name", r.Host), http.StatusForbidden)
			return
		}
		if r.URL.Path == "/readyz" {
			if b.draining.Load() {
				http.Error(w, "draining", http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ok")
			return
		}
		b.served.Add(1)
		io.WriteString(w, b.name)
	}))
	t.Cleanup(b.srv.Close)
	return b
}

func (b *backend) addr() string { return strings.TrimPrefix(b.srv.URL, "http://") }

// names sends n requests through the balancer, on one client's kept-alive connections,
// and returns who answered each.
func names(t *testing.T, c *http.Client, url string, n int) []string {
	t.Helper()
	var out []string
	for range n {
		resp, err := c.Get(url + "/work")
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("through the balancer: %s %q %v", resp.Status, body, err)
		}
		out = append(out, string(body))
	}
	return out
}

// alternates reports whether got alternates between two different names.
func alternates(got []string) bool {
	if len(got) < 2 || got[0] == got[1] {
		return false
	}
	for i, g := range got {
		if g != got[i%2] {
			return false
		}
	}
	return true
}

// TestBalancesRoundRobinAndTakesOutDraining starts HAProxy with the fleet's configuration
// in front of two replicas: requests alternate between them; one whose /readyz answers
// 503 is taken out, and every request goes to the other; ready again, it is back; and
// HAProxy stops of its soft stop, exiting 0.
func TestBalancesRoundRobinAndTakesOutDraining(t *testing.T) {
	needHAProxy(t)
	a, b := newBackend(t, "a"), newBackend(t, "b")
	p := Start(t, a.addr(), b.addr())
	p.WaitState(t, Server(1), "UP")
	p.WaitState(t, Server(2), "UP")
	if st, err := p.State(Server(3)); err != nil || st != "MAINT" {
		t.Fatalf("the slot left over is %q (%v), want MAINT", st, err)
	}
	c := &http.Client{Timeout: testenv.HangBound}
	defer c.CloseIdleConnections()

	if got := names(t, c, p.URL, 6); !alternates(got) {
		t.Fatalf("answers %v: not round robin between a and b", got)
	}

	b.draining.Store(true)
	p.WaitState(t, Server(2), "DOWN")
	before := b.served.Load()
	for i, got := range names(t, c, p.URL, 6) {
		if got != "a" {
			t.Fatalf("request %d went to %s, which drains", i, got)
		}
	}
	if n := b.served.Load() - before; n != 0 {
		t.Fatalf("the draining replica served %d requests", n)
	}

	b.draining.Store(false)
	p.WaitState(t, Server(2), "UP")
	if got := names(t, c, p.URL, 4); !alternates(got) {
		t.Fatalf("answers %v after b is ready again: not round robin", got)
	}

	c.CloseIdleConnections()
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	if !p.Exited() {
		t.Fatal("HAProxy still runs after Stop")
	}
	if conn, err := net.Dial("tcp", strings.TrimPrefix(p.URL, "http://")); err == nil {
		conn.Close()
		t.Fatal("the balancer's port still accepts connections after Stop")
	}
}
