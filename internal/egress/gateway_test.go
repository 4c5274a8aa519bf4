//go:build linux

package egress_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/net/proxy"

	"github.com/toolhost/toolhost/internal/egress"
	"github.com/toolhost/toolhost/internal/testenv"
)

var testSpec = egress.Spec{
	Allow: []string{"registry.test", "*.allowed.test", "registry.test:22"},
	Deny:  []string{"blocked.allowed.test", "bücher.allowed.test"},
}

// Without the gateway, every place the gateway refuses answers: the refusals below are
// the gateway's doing, not dead ends of the test network.
func TestBadPlacesAnswerWithoutTheGateway(t *testing.T) {
	f := newFixture(t, testSpec)
	c := &http.Client{Transport: &http.Transport{DialContext: f.n.DialContext}, Timeout: 30 * time.Second}
	for _, b := range bad {
		u := "http://" + net.JoinHostPort(b.addr, "80") + "/"
		code, body, err := f.get(c, u)
		if err != nil || code != 200 || body != internalBody {
			t.Errorf("GET %s directly: %d %q %v; the test network is not what the refusal tests assume", u, code, body, err)
		}
	}
}

func TestAllowed(t *testing.T) {
	f := newFixture(t, testSpec)
	c := f.client("cmd-1", nil)
	for _, u := range []string{"http://registry.test/hello", "https://registry.test/hello", "http://REGISTRY.TEST./hello"} {
		code, body, err := f.get(c, u)
		if err != nil || code != 200 || !strings.HasPrefix(body, "hello from registry.test") {
			t.Errorf("GET %s: %d %q %v", u, code, body, err)
		}
	}
	rec := f.audit.find(t, "the plain HTTP request", func(r egress.Record) bool { return r.Proto == "http" && r.Decision == egress.Allow })
	if rec.Sandbox != "sb-1" || rec.Command != "cmd-1" || rec.Name != "registry.test" || rec.Addr != f.reg.String() ||
		rec.Port != 80 || rec.Rule != "allow registry.test" || rec.BytesUp == 0 || rec.BytesDown == 0 {
		t.Errorf("audit of the plain request: %+v", rec)
	}
	rec = f.audit.find(t, "the CONNECT tunnel", func(r egress.Record) bool { return r.Proto == "connect" })
	if rec.Decision != egress.Allow || rec.Name != "registry.test" || rec.Port != 443 || rec.Addr != f.reg.String() || rec.BytesDown < 500 {
		t.Errorf("audit of the tunnel: %+v", rec)
	}
	if rs := f.c.TakeRefusals("cmd-1"); rs != nil {
		t.Errorf("refusals for allowed requests: %v", rs)
	}
}

func TestSOCKS5(t *testing.T) {
	f := newFixture(t, testSpec)
	d, err := proxy.SOCKS5("tcp", "unused", nil, dialFunc(func(ctx context.Context, network, addr string) (net.Conn, error) {
		return f.conn("socks-cmd"), nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	cd := d.(proxy.ContextDialer)
	tr := &http.Transport{DialContext: cd.DialContext, TLSClientConfig: &tls.Config{RootCAs: f.n.CertPool()}, DisableKeepAlives: true}
	c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	for _, u := range []string{"http://registry.test/hello", "https://registry.test/hello"} {
		code, body, err := f.get(c, u)
		if err != nil || code != 200 || !strings.HasPrefix(body, "hello from") {
			t.Errorf("GET %s over SOCKS5: %d %q %v", u, code, body, err)
		}
	}
	// Refused: a name not allowed, a private address by name, an IP literal.
	for _, target := range []string{"other.test:80", "ten.allowed.test:80", f.reg.String() + ":80"} {
		conn, err := cd.DialContext(context.Background(), "tcp", target)
		if err == nil {
			conn.Close()
			t.Errorf("SOCKS5 to %s was allowed", target)
		}
	}
	rs := f.c.TakeRefusals("socks-cmd")
	if len(rs) != 3 {
		t.Errorf("refusals over SOCKS5: %+v", rs)
	}
	f.audit.find(t, "the SOCKS5 refusal", func(r egress.Record) bool {
		return r.Proto == "socks5" && r.Decision == egress.Deny && r.Name == "other.test" && strings.HasPrefix(r.Rule, "no rule allows")
	})
	// SOCKS5 UDP ASSOCIATE and BIND are refused.
	c2 := f.conn("socks-cmd")
	_ = c2.SetDeadline(time.Now().Add(20 * time.Second))
	c2.Write([]byte{5, 1, 0})
	var greet [2]byte
	if _, err := io.ReadFull(c2, greet[:]); err != nil || greet != [2]byte{5, 0} {
		t.Fatalf("SOCKS5 greeting: %v %v", greet, err)
	}
	c2.Write([]byte{5, 3, 0, 1, 203, 0, 113, 10, 0, 53}) // UDP ASSOCIATE
	var rep [10]byte
	if _, err := io.ReadFull(c2, rep[:]); err != nil || rep[1] != 7 {
		t.Errorf("UDP ASSOCIATE: reply %v %v; want code 7 (command not supported)", rep, err)
	}
}

type dialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

func (f dialFunc) Dial(network, addr string) (net.Conn, error) {
	return f(context.Background(), network, addr)
}
func (f dialFunc) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return f(ctx, network, addr)
}

func TestRefusedDomainTellsTheModel(t *testing.T) {
	f := newFixture(t, testSpec)
	c := f.client("npm-install", nil)
	code, body, err := f.get(c, "http://other.test/hello")
	if err != nil {
		t.Fatal(err)
	}
	want := "egress: other.test is not an allowed domain (allowed: registry.test, *.allowed.test, registry.test:22); ask the operator to add it to sandbox.egress.allow\n"
	if code != 403 || body != want {
		t.Errorf("GET http://other.test/: %d %q\nwant 403 %q", code, body, want)
	}
	// The same through CONNECT: the status line says it too.
	line, _, _ := f.connect("npm-install", "other.test:443")
	if !strings.HasPrefix(line, "HTTP/1.1 403 Forbidden (egress: other.test is not an allowed domain") {
		t.Errorf("CONNECT other.test:443: %q", line)
	}
	// Twice refused, noted once per destination.
	f.get(c, "http://other.test/again")
	rs := f.c.TakeRefusals("npm-install")
	if len(rs) != 2 || rs[0].Dest != "other.test:80" || rs[1].Dest != "other.test:443" {
		t.Fatalf("refusals: %+v", rs)
	}
	note := egress.Note(rs)
	if !strings.Contains(note, "other.test is not an allowed domain") || strings.Count(note, "other.test is not") != 2 {
		t.Errorf("note: %q", note)
	}
	if rs := f.c.TakeRefusals("other-command"); rs != nil {
		t.Errorf("another command's refusals: %+v", rs)
	}
	rec := f.audit.find(t, "the refusal", func(r egress.Record) bool { return r.Decision == egress.Deny && r.Proto == "http" })
	if rec.Command != "npm-install" || rec.Name != "other.test" || rec.Port != 80 || rec.Rule != "no rule allows other.test" || rec.Addr != "" || !strings.HasPrefix(rec.Reason, "egress: ") {
		t.Errorf("audit of the refusal: %+v", rec)
	}
}

// Every refusal the issue lists, each by its rule, through CONNECT (and the internal
// places by plain HTTP too).
func TestRefusals(t *testing.T) {
	f := newFixture(t, testSpec)
	reg := f.reg.String()
	cases := []struct {
		target string
		rule   string
	}{
		{reg + ":443", "IP literal: no CIDR allows " + reg},
		{"registry.test:2222", "port not allowed: allow registry.test"},
		{"a.allowed.test:22", "port not allowed: allow *.allowed.test"},
		{"127.0.0.1:80", "always refused: loopback address"},
		{"[::1]:80", "always refused: loopback address"},
		{"2130706433:80", "always refused: loopback address"},
		{"017700000001:80", "always refused: loopback address"},
		{"0x7f000001:80", "always refused: loopback address"},
		{"0x7f.1:80", "always refused: loopback address"},
		{"127.1:80", "always refused: loopback address"},
		{"[::ffff:127.0.0.1]:80", "always refused: loopback address"},
		{"[::ffff:a9fe:a9fe]:80", "always refused: a cloud metadata service address"},
		{"169.254.169.254:80", "always refused: a cloud metadata service address"},
		{"10.0.0.1:80", "always refused: private address"},
		{"[fd00::1]:80", "always refused: private (IPv6 unique local) address"},
		{"evil-allowed.test:80", "no rule allows evil-allowed.test"},
		{"allowed.test.evil.test:80", "no rule allows allowed.test.evil.test"},
		{"blocked.allowed.test:80", "deny blocked.allowed.test"},
		{"BLOCKED.ALLOWED.TEST.:80", "deny blocked.allowed.test"},
		{"xn--bcher-kva.allowed.test:80", "deny xn--bcher-kva.allowed.test"},
		{"BÜCHER.allowed.test:80", "deny xn--bcher-kva.allowed.test"},
		{"registrу.test:443", "no rule allows xn--registr-"}, // Cyrillic у
	}
	for _, b := range bad {
		class := map[string]string{
			"lo.allowed.test": "loopback", "lo6.allowed.test": "loopback", "own.allowed.test": "this host's own",
			"own6.allowed.test": "this host's own", "ten.allowed.test": "private", "meta.allowed.test": "a cloud metadata service",
			"meta6.allowed.test": "a cloud metadata service", "ula.allowed.test": "private (IPv6 unique local)",
			"cgnat.allowed.test": "private (carrier-grade NAT, RFC 6598)", "rfc1918.allowed.test": "private",
		}[b.name]
		cases = append(cases, struct{ target, rule string }{b.name + ":80", "always refused: " + class + " address"})
	}
	for _, c := range cases {
		line, conn, _ := f.connect("probe", c.target)
		conn.Close()
		if !strings.HasPrefix(line, "HTTP/1.1 403 ") {
			t.Errorf("CONNECT %s: %q; want 403", c.target, line)
			continue
		}
		rec := f.audit.find(t, "CONNECT "+c.target, func(r egress.Record) bool {
			return r.Proto == "connect" && r.Decision == egress.Deny && strings.HasPrefix(r.Rule, c.rule)
		})
		_ = rec
	}
	// The same places over plain HTTP: refused, and the body never is the internal one.
	cl := f.client("probe-http", nil)
	for _, b := range bad {
		for _, host := range []string{b.name, bracket(b.addr)} {
			code, body, err := f.get(cl, "http://"+host+"/")
			if err != nil || code != 403 || strings.Contains(body, "INTERNAL") || !strings.HasPrefix(body, "egress: ") {
				t.Errorf("GET http://%s/: %d %q %v", host, code, body, err)
			}
		}
	}
}

func bracket(a string) string {
	if strings.Contains(a, ":") {
		return "[" + a + "]"
	}
	return a
}

// A plain request whose Host header names another host than its URL.
func TestHostHeaderMismatch(t *testing.T) {
	f := newFixture(t, testSpec)
	c := f.conn("curl")
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	io.WriteString(c, "GET http://registry.test/hello HTTP/1.1\r\nHost: other.test\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 403 || !strings.Contains(string(body), `Host header "other.test" differs from its URL's host registry.test`) {
		t.Errorf("%d %q", resp.StatusCode, body)
	}
	f.audit.find(t, "the Host mismatch", func(r egress.Record) bool { return r.Rule == "Host header differs from the URL" })
	// The same host in another spelling is the same host.
	c2 := f.conn("curl")
	_ = c2.SetDeadline(time.Now().Add(30 * time.Second))
	io.WriteString(c2, "GET http://registry.test/hello HTTP/1.1\r\nHost: REGISTRY.test.:80\r\n\r\n")
	resp, err = http.ReadResponse(bufio.NewReader(c2), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Errorf("same host, other spelling: %v %v", resp, err)
	}
}

// A TLS client that names another server than its CONNECT target.
func TestSNIMismatch(t *testing.T) {
	f := newFixture(t, testSpec)
	line, conn, br := f.connect("git", "registry.test:443")
	if line != "HTTP/1.1 200 Connection established" {
		t.Fatalf("CONNECT: %q", line)
	}
	// The test host's certificate is good for other-name.test too: only the gateway can
	// refuse this.
	tc := tls.Client(&bufConn{Conn: conn, r: br}, &tls.Config{ServerName: "other-name.test", RootCAs: f.n.CertPool()})
	err := tc.Handshake()
	if err == nil || !strings.Contains(err.Error(), "access denied") {
		t.Errorf("handshake naming other-name.test in a tunnel to registry.test: %v; want a TLS access-denied alert", err)
	}
	rec := f.audit.find(t, "the SNI refusal", func(r egress.Record) bool { return r.Decision == egress.Deny && r.Proto == "connect" })
	if rec.Rule != "TLS server name differs from the target" || !strings.Contains(rec.Reason, `"other-name.test" differs from the tunnel's destination registry.test`) {
		t.Errorf("audit: %+v", rec)
	}
	if rs := f.c.TakeRefusals("git"); len(rs) != 1 {
		t.Errorf("refusals: %+v", rs)
	}
	// The right name goes through.
	line, conn, br = f.connect("git", "registry.test:443")
	tc = tls.Client(&bufConn{Conn: conn, r: br}, &tls.Config{ServerName: "REGISTRY.test", RootCAs: f.n.CertPool()})
	if err := tc.Handshake(); err != nil {
		t.Errorf("handshake with the right name (%s): %v", line, err)
	}
	tc.Close()
}

type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// A name allowed by policy that the DNS turns to loopback between two requests: the
// second is refused, by the address, at connect time.
func TestDNSRebinding(t *testing.T) {
	f := newFixture(t, testSpec)
	f.n.SetDNS("rebind.allowed.test", f.reg)
	c := f.client("rebind", nil)
	code, _, err := f.get(c, "http://rebind.allowed.test/hello")
	if err != nil || code != 200 {
		t.Fatalf("first request: %d %v", code, err)
	}
	f.n.SetDNS("rebind.allowed.test", netip.MustParseAddr("127.0.0.1"))
	code, body, err := f.get(c, "http://rebind.allowed.test/hello")
	if err != nil || code != 403 || !strings.Contains(body, "rebind.allowed.test resolves to 127.0.0.1, a loopback address") {
		t.Errorf("after rebinding: %d %q %v", code, body, err)
	}
	// A name with one good and one bad address is refused whole.
	f.n.SetDNS("mixed.allowed.test", f.reg, netip.MustParseAddr("10.0.0.1"))
	code, body, _ = f.get(c, "http://mixed.allowed.test/hello")
	if code != 403 || !strings.Contains(body, "10.0.0.1, a private address") {
		t.Errorf("mixed addresses: %d %q", code, body)
	}
}

// A domain:port rule opens that port of that name, raw TCP through CONNECT.
func TestPortRule(t *testing.T) {
	f := newFixture(t, testSpec)
	line, conn, br := f.connect("ssh", "registry.test:22")
	if line != "HTTP/1.1 200 Connection established" {
		t.Fatalf("CONNECT registry.test:22: %q", line)
	}
	got, err := br.ReadString('\n')
	conn.Close()
	if err != nil || got != "SSH-2.0-test\r\n" {
		t.Errorf("through the tunnel: %q %v", got, err)
	}
}

func TestMaxBytes(t *testing.T) {
	const budget = 256 << 10
	f := newFixture(t, testSpec, func(_ *egress.Config, cc *egress.ClientConfig) { cc.Budget = egress.NewBudget(budget) })
	c := f.client("download", nil)
	_, body, err := f.get(c, "http://registry.test/bytes?n=4194304")
	if err == nil && len(body) >= 4<<20 {
		t.Fatalf("a 4 MiB download went through a 256 KiB budget")
	}
	if len(body) > budget {
		t.Errorf("read %d bytes past a budget of %d", len(body), budget)
	}
	rec := f.audit.find(t, "the cut download", func(r egress.Record) bool { return r.Error == "the session's network budget is used up" })
	if rec.BytesDown > budget || rec.BytesDown < budget/2 || rec.Decision != egress.Allow {
		t.Errorf("audit of the cut download: %+v", rec)
	}
	rs := f.c.TakeRefusals("download")
	if len(rs) != 1 || !strings.Contains(rs[0].Reason, "network budget of 256 KiB (sandbox.egress.max_bytes) is used up") {
		t.Errorf("refusals: %+v", rs)
	}
	// The next request is refused before it starts, saying why.
	code, body, err := f.get(c, "http://registry.test/hello")
	if err != nil || code != 403 || !strings.Contains(body, "network budget of 256 KiB") {
		t.Errorf("after the budget: %d %q %v", code, body, err)
	}
	// Through a tunnel too.
	_, _, err = f.get(c, "https://registry.test/bytes?n=1048576")
	if err == nil {
		t.Error("an HTTPS download after the budget was spent went through")
	}
}

func TestIdleTimeout(t *testing.T) {
	f := newFixture(t, testSpec, func(_ *egress.Config, cc *egress.ClientConfig) { cc.Limits.IdleTimeout = 300 * time.Millisecond })
	line, conn, br := f.connect("idle", "registry.test:80")
	if line != "HTTP/1.1 200 Connection established" {
		t.Fatal(line)
	}
	// Say nothing: the gateway ends the tunnel (the read returns; the deadline is a hang
	// bound only).
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, err := br.ReadByte()
	if err == nil {
		t.Fatal("read a byte from a silent tunnel")
	}
	var ne net.Error
	if errorsAs(err, &ne) && ne.Timeout() {
		t.Fatal("the gateway did not end an idle tunnel")
	}
	f.audit.find(t, "the idle end", func(r egress.Record) bool { return strings.HasPrefix(r.Error, "idle for") })
}

func errorsAs(err error, target *net.Error) bool {
	ne, ok := err.(net.Error)
	if ok {
		*target = ne
	}
	return ok
}

func TestMaxConns(t *testing.T) {
	f := newFixture(t, testSpec, func(_ *egress.Config, cc *egress.ClientConfig) { cc.Limits.MaxConns = 2 })
	var open []net.Conn
	for range 2 {
		line, conn, _ := f.connect("many", "registry.test:80")
		if line != "HTTP/1.1 200 Connection established" {
			t.Fatal(line)
		}
		open = append(open, conn)
	}
	line, conn, _ := f.connect("many", "registry.test:80")
	conn.Close()
	if !strings.HasPrefix(line, "HTTP/1.1 503 ") {
		t.Errorf("third connection: %q", line)
	}
	rs := f.c.TakeRefusals("many")
	if len(rs) != 1 || !strings.Contains(rs[0].Reason, "2 connections of this sandbox are open already") {
		t.Errorf("refusals: %+v", rs)
	}
	for _, c := range open {
		c.Close()
	}
	// Slots come back (a hang bound: the gateway notices the close).
	if !testenv.Eventually(func() bool {
		line, conn, _ = f.connect("many", "registry.test:80")
		conn.Close()
		return line == "HTTP/1.1 200 Connection established"
	}) {
		t.Fatalf("no slot came back: %q", line)
	}
}

const secret = "s3cret-token-that-never-enters-the-sandbox"

func TestInjection(t *testing.T) {
	f := newFixture(t, testSpec, func(_ *egress.Config, cc *egress.ClientConfig) {
		cc.Inject = []egress.Injection{{Domain: "registry.test", Header: "Authorization", Value: "Bearer " + secret}}
	})
	ca := f.c.CACert()
	if ca == nil || strings.Contains(string(ca), secret) {
		t.Fatal("no CA, or the secret in it")
	}
	blk, _ := pem.Decode(ca)
	caCert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if !caCert.PermittedDNSDomainsCritical || len(caCert.PermittedDNSDomains) != 1 || caCert.PermittedDNSDomains[0] != "registry.test" {
		t.Errorf("the CA is not constrained to the injected domain: %v", caCert.PermittedDNSDomains)
	}
	// The sandbox trusts its CA (and the test CA, for the other hosts).
	trust := f.n.CertPool()
	trust.AddCert(caCert)
	c := f.client("npm", trust)
	code, body, err := f.get(c, "https://registry.test/auth")
	if err != nil || code != 200 || body != "seen" {
		t.Fatalf("GET https://registry.test/auth: %d %q %v", code, body, err)
	}
	f.mu.Lock()
	seen := append([]string(nil), f.auth...)
	f.mu.Unlock()
	if len(seen) != 1 || seen[0] != "Bearer "+secret {
		t.Errorf("the upstream saw Authorization %q", seen)
	}
	// What the sandbox talked to was the gateway, with a certificate of its CA.
	resp, err := c.Get("https://registry.test/hello")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if iss := resp.TLS.PeerCertificates[0].Issuer.CommonName; !strings.HasPrefix(iss, "toolhost egress CA for sandbox sb-1") {
		t.Errorf("certificate issued by %q", iss)
	}
	// A client that trusts only the test CA cannot be fooled into trusting the gateway.
	if _, _, err := f.get(f.client("npm", nil), "https://registry.test/hello"); err == nil {
		t.Error("a client without the sandbox's CA accepted the gateway's certificate")
	}
	// Other domains stay untouched tunnels: the real server's certificate.
	resp, err = c.Get("https://a.allowed.test/hello")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if iss := resp.TLS.PeerCertificates[0].Issuer.CommonName; iss != "toolhost testnet CA" {
		t.Errorf("a.allowed.test's certificate issued by %q", iss)
	}
	// Plain HTTP to the injected domain: no secret in clear text.
	f.get(c, "http://registry.test/auth")
	f.mu.Lock()
	seen = append([]string(nil), f.auth...)
	f.mu.Unlock()
	if len(seen) != 2 || seen[1] != "" {
		t.Errorf("plain HTTP carried %q", seen)
	}
	// Inside the terminated tunnel, a request for another host is refused.
	line, conn, br := f.connect("npm", "registry.test:443")
	if line != "HTTP/1.1 200 Connection established" {
		t.Fatal(line)
	}
	tc := tls.Client(&bufConn{Conn: conn, r: br}, &tls.Config{ServerName: "registry.test", RootCAs: trust})
	io.WriteString(tc, "GET /auth HTTP/1.1\r\nHost: other.test\r\n\r\n")
	r2, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil || r2.StatusCode != 403 {
		t.Errorf("Host other.test inside the injected tunnel: %v %v", r2, err)
	}
	rec := f.audit.find(t, "the injected tunnel", func(r egress.Record) bool { return r.Injected == "Authorization" && r.Decision == egress.Allow })
	if strings.Contains(fmt.Sprintf("%+v", f.audit.all()), secret) {
		t.Error("the secret is in the audit")
	}
	_ = rec
}

// Two sandboxes on one gateway: each connection is audited and noted under the sandbox
// whose client served it, and each has its own policy.
func TestTwoSandboxes(t *testing.T) {
	f := newFixture(t, testSpec)
	p2, err := egress.Compile(egress.Spec{Allow: []string{"other.test"}})
	if err != nil {
		t.Fatal(err)
	}
	c2, err := f.g.NewClient(egress.ClientConfig{Sandbox: "sb-2", Policy: p2})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c2.Serve(l) }()
	cl2 := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: l.Addr().String()}), DisableKeepAlives: true}, Timeout: 30 * time.Second}
	if code, _, err := f.get(cl2, "http://other.test/hello"); err != nil || code != 200 {
		t.Errorf("sb-2 to other.test: %d %v", code, err)
	}
	if code, _, _ := f.get(cl2, "http://registry.test/hello"); code != 403 {
		t.Errorf("sb-2 to registry.test: %d; its policy does not allow it", code)
	}
	if code, _, _ := f.get(f.client("x", nil), "http://other.test/hello"); code != 403 {
		t.Errorf("sb-1 to other.test: %d", code)
	}
	for _, r := range f.audit.all() {
		want := "sb-1"
		if r.Name == "other.test" && r.Decision == egress.Allow || r.Name == "registry.test" && r.Decision == egress.Deny {
			want = "sb-2"
		}
		if r.Sandbox != want {
			t.Errorf("record %+v attributed to %s; want %s", r, r.Sandbox, want)
		}
	}
	if rs := c2.TakeRefusals(""); len(rs) != 1 || rs[0].Dest != "registry.test:80" {
		t.Errorf("sb-2's refusals: %+v", rs)
	}
	if a, r := c2.Stats(); a != 1 || r != 1 {
		t.Errorf("sb-2's stats: %d allowed, %d refused", a, r)
	}
}

// resolverFunc is a Resolver made of a function.
type resolverFunc func(ctx context.Context, name string) ([]netip.Addr, error)

func (f resolverFunc) LookupNetIP(ctx context.Context, name string) ([]netip.Addr, error) {
	return f(ctx, name)
}

// A name the gateway could not resolve is refused with a sentence the model can use: the
// name, that it could not be resolved, why as far as the model can act on it, and what to
// do; nothing of the host's (the DNS server's address, Go's error text, "<nil>").
func TestResolverFailureTellsTheModel(t *testing.T) {
	dead := netip.MustParseAddrPort("203.0.113.53:5300") // nothing listens: refused at once
	f := newFixture(t, testSpec, func(cfg *egress.Config, _ *egress.ClientConfig) {
		cfg.Resolver.(*egress.DNSResolver).Server = dead
	})
	// A DNS server that reads every query and answers none.
	silent := netip.MustParseAddrPort("203.0.113.53:5353")
	pc, err := f.n.ListenPacket("udp", silent.String())
	if err != nil {
		t.Fatal(err)
	}
	f.n.OnClose(func() { pc.Close() })
	go func() { // owned by the test network: OnClose closes pc
		buf := make([]byte, 1500)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
		}
	}()
	// A DNS server that answers every query with SERVFAIL.
	failing := netip.MustParseAddrPort("203.0.113.53:5354")
	pf, err := f.n.ListenPacket("udp", failing.String())
	if err != nil {
		t.Fatal(err)
	}
	f.n.OnClose(func() { pf.Close() })
	go func() { // owned by the test network: OnClose closes pf
		buf := make([]byte, 1500)
		for {
			n, from, err := pf.ReadFrom(buf)
			if err != nil {
				return
			}
			var m dnsmessage.Message
			if m.Unpack(buf[:n]) != nil {
				continue
			}
			m.Response, m.RCode, m.Answers = true, dnsmessage.RCodeServerFailure, nil
			if b, err := m.Pack(); err == nil {
				pf.WriteTo(b, from)
			}
		}
	}()
	hostInternals := []string{"<nil>", dead.Addr().String(), silent.String(), "10.0.0.53", "dial ", "read ", "udp", "server misbehaving"}
	check := func(what, reason, why string) {
		t.Helper()
		want := "egress: the name registry.test could not be resolved: " + why + "; try again, and if it keeps failing ask the operator to check sandbox.egress.resolver"
		if reason != want {
			t.Errorf("%s: %q\nwant %q", what, reason, want)
		}
		for _, s := range hostInternals {
			if strings.Contains(reason, s) {
				t.Errorf("%s: the reason %q says %q", what, reason, s)
			}
		}
	}
	// Through the gateway, as a sandbox meets it.
	code, body, err := f.get(f.client("npm", nil), "http://registry.test/hello")
	if err != nil || code != 502 {
		t.Errorf("GET with the resolver unreachable: %d %q %v", code, body, err)
	}
	check("GET with the resolver unreachable", strings.TrimSuffix(body, "\n"), "the gateway's DNS server could not be reached")
	f.audit.find(t, "the resolver's failure", func(r egress.Record) bool {
		return r.Decision == egress.Deny && r.Rule == "resolver failed" && r.Name == "registry.test"
	})
	p, err := egress.Compile(testSpec)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what string
		r    egress.Resolver
		why  string
	}{
		{"a DNS server that answers SERVFAIL", &egress.DNSResolver{Server: failing, Dialer: f.n}, "the gateway's DNS server failed"},
		{"a DNS server that never answers", &egress.DNSResolver{Server: silent, Dialer: f.n, Timeout: 100 * time.Millisecond}, "the gateway's DNS server did not answer in time"},
		// What the system resolver (SystemResolver, resolv.conf) returns when its server
		// fails; that resolver itself is not asked here: it would reach past this machine.
		{"the system resolver's failure", resolverFunc(func(ctx context.Context, name string) ([]netip.Addr, error) {
			return nil, &net.DNSError{Err: "server misbehaving", Name: name + ".", Server: "10.0.0.53:53", IsTemporary: true}
		}), "the gateway's DNS server failed"},
		{"the system resolver's timeout", resolverFunc(func(ctx context.Context, name string) ([]netip.Addr, error) {
			return nil, &net.DNSError{Err: "i/o timeout", Name: name + ".", Server: "10.0.0.53:53", IsTimeout: true}
		}), "the gateway's DNS server did not answer in time"},
	} {
		g := egress.New(egress.Config{Resolver: c.r, CacheTTL: -1, Dialer: f.n})
		v, addrs := g.Check(context.Background(), p, "registry.test:80")
		if v.Allowed || v.Status != 502 || v.Rule != "resolver failed" || len(addrs) != 0 {
			t.Errorf("%s: %+v %v", c.what, v, addrs)
		}
		check(c.what, v.Reason, c.why)
	}
}

// Connections that send nothing cannot pile up at the gateway: past MaxConns of them the
// oldest is closed, so the gateway holds a bounded number of a sandbox's connections
// however many it opens, and a request made during such a flood is served.
func TestIdleConnsAreBounded(t *testing.T) {
	const maxConns = 4
	f := newFixture(t, testSpec, func(_ *egress.Config, cc *egress.ClientConfig) { cc.Limits.MaxConns = maxConns })
	const idle = 5 * maxConns
	var closed atomic.Int64
	for range idle {
		c := f.conn("idle")
		go func() { // ends when the gateway (or the test's cleanup) closes the connection
			_, _ = c.Read(make([]byte, 1))
			closed.Add(1)
		}()
	}
	// All but maxConns of them are closed (a hang bound: each is served on its own
	// goroutine).
	testenv.WaitFor(t, "the gateway to close the oldest idle connections", func() bool { return closed.Load() == idle-maxConns })
	line, conn, _ := f.connect("work", "registry.test:80")
	conn.Close()
	if line != "HTTP/1.1 200 Connection established" {
		t.Errorf("a CONNECT during the flood: %q", line)
	}
	testenv.WaitFor(t, "the CONNECT's connection to take an idle one's place", func() bool { return closed.Load() == idle-maxConns+1 })
	rs := f.c.TakeRefusals("idle")
	if len(rs) != 1 || !strings.Contains(rs[0].Reason, "sent nothing") {
		t.Errorf("refusals: %+v", rs)
	}
	f.audit.find(t, "a closed idle connection", func(r egress.Record) bool {
		return r.Command == "idle" && r.Decision == egress.Deny && r.Rule == "idle connections"
	})
}
