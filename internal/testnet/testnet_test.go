//go:build linux

package testnet_test

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/internal/egress"
	"github.com/toolhost/toolhost/internal/testnet"
)

// The harness itself: a host on the internet side answers by name, over HTTP and HTTPS,
// from the host side; an address nobody put there is unreachable; and the machine's own
// network is not reachable from either side.
func TestInternet(t *testing.T) {
	n := testnet.New(t)
	a, err := n.AddHost("www.example.test")
	if err != nil {
		t.Fatal(err)
	}
	l, err := n.Listen("tcp", netip.AddrPortFrom(a, 80).String())
	if err != nil {
		t.Fatal(err)
	}
	n.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello from "+r.Host) }))
	lt, err := n.Listen("tcp", netip.AddrPortFrom(a, 443).String())
	if err != nil {
		t.Fatal(err)
	}
	if err := n.ServeTLS(lt, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "tls") }), "www.example.test"); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res := &egress.DNSResolver{Server: n.DNS(), Dialer: n}
	addrs, err := res.LookupNetIP(ctx, "www.example.test")
	if err != nil || len(addrs) != 1 || addrs[0] != a {
		t.Fatalf("resolve www.example.test: %v, %v; want %v", addrs, err, a)
	}
	if _, err := res.LookupNetIP(ctx, "nowhere.example.test"); err == nil {
		t.Fatal("a name nobody set resolved")
	}

	c := &http.Client{Transport: &http.Transport{
		DialContext:     n.DialContext,
		TLSClientConfig: &tls.Config{RootCAs: n.CertPool()},
	}}
	defer c.CloseIdleConnections()
	for _, u := range []string{"http://www.example.test/", "https://www.example.test/"} {
		// The transport resolves through the host's resolver: dial the address instead.
		req, _ := http.NewRequestWithContext(ctx, "GET", u, nil)
		tr := c.Transport.(*http.Transport)
		tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			_, port, _ := net.SplitHostPort(addr)
			return n.DialContext(ctx, network, net.JoinHostPort(a.String(), port))
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", u, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.HasPrefix(string(b), "hello from www.example.test") && string(b) != "tls" {
			t.Fatalf("GET %s: %q", u, b)
		}
	}

	// Nothing else answers: an address no test put anywhere, and the machine's own
	// network (a public resolver's address leads to the internet side, which has no
	// route on).
	for _, addr := range []string{"203.0.113.99:80", "192.0.2.1:80", "8.8.8.8:53"} {
		dctx, dcancel := context.WithTimeout(ctx, 3*time.Second)
		conn, err := n.DialContext(dctx, "tcp", addr)
		dcancel()
		if err == nil {
			conn.Close()
			t.Fatalf("dial %s from the host side succeeded", addr)
		}
	}
}
