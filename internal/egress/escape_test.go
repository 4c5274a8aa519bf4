//go:build linux

package egress_test

import (
	"bufio"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/internal/egress"
)

// More ways out, tried as a sandbox would: each must end at a refusal, never at a place
// in bad (whose body is internalBody).

// An allowed server that redirects to a place no sandbox may reach: the gateway never
// follows a redirect itself (the 302 goes back to the client untouched), and the client
// that follows it asks the gateway again, which refuses.
func TestRedirectToAPrivatePlace(t *testing.T) {
	f := newFixture(t, testSpec)
	var hops []string
	c := f.client("curl-L", nil)
	c.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		hops = append(hops, req.URL.String())
		return nil
	}
	for _, b := range bad {
		for _, to := range []string{"http://" + b.name + "/", "http://" + bracket(b.addr) + "/"} {
			hops = nil
			for _, from := range []string{"http://registry.test/redirect", "https://registry.test/redirect"} {
				u := from + "?to=" + url.QueryEscape(to)
				code, body, err := f.get(c, u)
				if err != nil || code != 403 || strings.Contains(body, "INTERNAL") || !strings.HasPrefix(body, "egress: ") {
					t.Errorf("GET %s, following: %d %q %v", u, code, body, err)
				}
			}
			if len(hops) != 2 || hops[0] != to || hops[1] != to {
				t.Errorf("the client's hops %q; want %q twice (the 302s reached it)", hops, to)
			}
		}
	}
	// The gateway answered the first request with the redirect itself.
	raw := f.conn("raw")
	_ = raw.SetDeadline(time.Now().Add(30 * time.Second))
	io.WriteString(raw, "GET http://registry.test/redirect?to=http://127.0.0.1/ HTTP/1.1\r\nHost: registry.test\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(raw), nil)
	if err != nil || resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "http://127.0.0.1/" {
		t.Errorf("the redirect through the gateway: %+v %v", resp, err)
	}
	f.audit.find(t, "the followed redirect's refusal", func(r egress.Record) bool {
		return r.Command == "curl-L" && r.Decision == egress.Deny && r.Rule == "always refused: loopback address"
	})
}

// One client connection, several requests: each is decided on its own, so an allowed
// first request does not carry a forbidden second one (pipelined, or kept alive).
func TestEveryRequestOnAConnectionIsDecided(t *testing.T) {
	f := newFixture(t, testSpec)
	c := f.conn("pipeline")
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	io.WriteString(c, "GET http://registry.test/hello HTTP/1.1\r\nHost: registry.test\r\n\r\n"+
		"GET http://lo.allowed.test/ HTTP/1.1\r\nHost: lo.allowed.test\r\n\r\n"+
		"GET http://127.0.0.1/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	br := bufio.NewReader(c)
	want := []int{200, 403}
	for i, code := range want {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("response %d: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != code || strings.Contains(string(body), "INTERNAL") {
			t.Errorf("response %d: %d %q; want %d", i, resp.StatusCode, body, code)
		}
	}
	// A refusal ends the connection: the third request is never served.
	if resp, err := http.ReadResponse(br, nil); err == nil {
		body, _ := io.ReadAll(resp.Body)
		if strings.Contains(string(body), "INTERNAL") {
			t.Fatalf("the third request reached the inside: %q", body)
		}
	}
}

// Requests the gateway does not forward at all: origin-form (a transparent-proxy style
// request naming its host only in Host), an https:// URL sent as a plain request, SOCKS4
// (no names, no policy), an absolute URL with user information pointing elsewhere.
func TestRequestsTheGatewayDoesNotForward(t *testing.T) {
	f := newFixture(t, testSpec)
	for _, c := range []struct {
		what, req string
		status    int
	}{
		{"origin-form", "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 400},
		{"origin-form to an allowed host", "GET /hello HTTP/1.1\r\nHost: registry.test\r\n\r\n", 400},
		{"https URL as a plain request", "GET https://lo.allowed.test/ HTTP/1.1\r\nHost: lo.allowed.test\r\n\r\n", 400},
		{"user information naming another host", "GET http://registry.test@127.0.0.1/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 403},
		{"two Host headers", "GET http://registry.test/hello HTTP/1.1\r\nHost: registry.test\r\nHost: 127.0.0.1\r\n\r\n", 400},
		{"a folded Host header", "GET http://registry.test/hello HTTP/1.1\r\nHost: registry.test\r\n 127.0.0.1\r\n\r\n", 400},
	} {
		conn := f.conn("odd")
		_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
		io.WriteString(conn, c.req)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Errorf("%s: %v", c.what, err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != c.status || strings.Contains(string(body), "INTERNAL") || !strings.HasPrefix(string(body), "egress: ") {
			t.Errorf("%s: %d %q; want %d with the gateway's reason", c.what, resp.StatusCode, body, c.status)
		}
	}
	// SOCKS4 CONNECT to 127.0.0.1:80: SOCKS4's "rejected" at once, and the connection
	// ends (the deadline is a hang bound).
	conn := f.conn("socks4")
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	conn.Write([]byte{4, 1, 0, 80, 127, 0, 0, 1, 'x', 0})
	got, err := io.ReadAll(conn)
	if err != nil || string(got) != "\x00\x5b\x00\x00\x00\x00\x00\x00" {
		t.Errorf("SOCKS4: % x %v; want SOCKS4's rejection and the end", got, err)
	}
	rs := f.c.TakeRefusals("socks4")
	if len(rs) != 1 || !strings.Contains(rs[0].Reason, "SOCKS4 is not supported") {
		t.Errorf("refusals: %+v", rs)
	}
}

// Spellings of places the issue does not list one by one: every one is refused, and by
// a rule that says why.
func TestMoreSpellings(t *testing.T) {
	f := newFixture(t, testSpec)
	for _, c := range []struct{ target, rule string }{
		{"0.0.0.0:80", "always refused: "},
		{"0:80", "always refused: "},
		{"[::]:80", "always refused: "},
		{"127.0.0.1.:80", "always refused: loopback address"},
		{"0177.0.0.1:80", "always refused: loopback address"},
		{"[::127.0.0.1]:80", "always refused: loopback address"},
		{"[64:ff9b::7f00:1]:80", "always refused: loopback address"},
		{"[2002:7f00:1::]:80", "always refused: loopback address"},
		{"[fe80::1%25lo]:80", "not a name"},
		{"[fe80::1]:80", "always refused: "},
		{"255.255.255.255:80", "always refused: "},
		{"224.0.0.1:80", "always refused: "},
		{"localhost:80", "not a name"},
		{"metadata:80", "not a name"},
		{"localhost.:80", "not a name"},
		{"registry.test..:80", "not a name"},
		{"registry.test:0", "port not allowed"},
		{"registry.test:65536", ""},
		{"registry.test:80:80", ""},
	} {
		line, conn, _ := f.connect("spell", c.target)
		conn.Close()
		if !strings.HasPrefix(line, "HTTP/1.1 4") {
			t.Errorf("CONNECT %s: %q; want a refusal", c.target, line)
			continue
		}
		if c.rule != "" && strings.HasPrefix(line, "HTTP/1.1 403 ") {
			f.audit.find(t, "CONNECT "+c.target, func(r egress.Record) bool {
				return r.Proto == "connect" && r.Decision == egress.Deny && strings.HasPrefix(r.Rule, c.rule)
			})
		}
	}
}

// An allow CIDR over a private range (an operator's LAN mirror) opens that range, and
// never this host's own address inside it: every service of the host bound to 0.0.0.0 or
// [::] answers there. Refused by literal (every spelling), by a name leading there
// (checked after resolution), over plain HTTP and CONNECT, and when the address appears
// on the host after the gateway last looked at the host's addresses.
func TestHostsOwnAddressInAnAllowedPrivateRange(t *testing.T) {
	spec := egress.Spec{Preset: egress.PresetNone, Allow: []string{"*.allowed.test", "172.16.0.0/12", "fd00::/64"}, Ports: []int{80, 8443}}
	f := newFixture(t, spec)
	// The LAN mirror, beyond the host: the allow CIDRs open it.
	mirror := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "mirror") })
	for name, a := range map[string]netip.Addr{"mirror.allowed.test": netip.MustParseAddr("172.16.5.5"), "mirror6.allowed.test": netip.MustParseAddr("fd00::55")} {
		if err := f.n.AddAddr(a); err != nil {
			t.Fatal(err)
		}
		l, err := f.n.Listen("tcp", netip.AddrPortFrom(a, 80).String())
		if err != nil {
			t.Fatal(err)
		}
		f.n.Serve(l, mirror)
		f.n.SetDNS(name, a)
	}
	// The host's own addresses in those ranges, and a service of the host on all of its
	// addresses.
	own, own6 := netip.MustParseAddr("172.16.99.1"), netip.MustParseAddr("fd00::99")
	for _, a := range []netip.Addr{own, own6} {
		if err := f.n.AddHostAddr(a); err != nil {
			t.Fatal(err)
		}
	}
	l, err := f.n.ListenHost("tcp", "[::]:8443")
	if err != nil {
		t.Fatal(err)
	}
	f.n.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, internalBody) }))
	f.n.SetDNS("lan.allowed.test", own)
	f.n.SetDNS("lan6.allowed.test", own6)

	c := f.client("curl", nil)
	for _, u := range []string{"http://172.16.5.5/", "http://mirror.allowed.test/", "http://[fd00::55]/", "http://mirror6.allowed.test/"} {
		if code, body, err := f.get(c, u); err != nil || code != 200 || body != "mirror" {
			t.Errorf("GET %s (the allowed mirror): %d %q %v", u, code, body, err)
		}
	}
	refused := func(what string, code int, body string, err error) {
		t.Helper()
		if err != nil || code != 403 || strings.Contains(body, "INTERNAL") || !strings.Contains(body, "one of this host's own addresses, which a sandbox may never reach") {
			t.Errorf("%s: %d %q %v; want a 403 saying it is this host's own address", what, code, body, err)
		}
	}
	for _, u := range []string{
		"http://172.16.99.1:8443/", "http://[fd00::99]:8443/", "http://[::ffff:172.16.99.1]:8443/", "http://[::ffff:ac10:6301]:8443/",
		"http://lan.allowed.test:8443/", "http://lan6.allowed.test:8443/",
	} {
		code, body, err := f.get(c, u)
		refused("GET "+u, code, body, err)
	}
	for _, target := range []string{"172.16.99.1:8443", "[fd00::99]:8443", "lan.allowed.test:8443"} {
		line, conn, _ := f.connect("curl", target)
		conn.Close()
		if !strings.HasPrefix(line, "HTTP/1.1 403 ") {
			t.Errorf("CONNECT %s: %q; want a refusal", target, line)
		}
	}
	f.audit.find(t, "the refusal of the host's own address by name", func(r egress.Record) bool {
		return r.Name == "lan.allowed.test" && r.Decision == egress.Deny && r.Rule == "always refused: this host's own address"
	})
	// An address the host gains after the gateway last read its addresses is refused at
	// once: the kernel tells the gateway.
	late := netip.MustParseAddr("172.16.99.2")
	if err := f.n.AddHostAddr(late); err != nil {
		t.Fatal(err)
	}
	code, body, err := f.get(c, "http://172.16.99.2:8443/")
	refused("GET the address the host gained", code, body, err)
}
