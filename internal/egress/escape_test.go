//go:build linux

package egress_test

import (
	"bufio"
	"io"
	"net/http"
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
