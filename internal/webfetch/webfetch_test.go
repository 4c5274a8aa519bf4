//go:build linux

package webfetch_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/egress"
	"github.com/toolhost/toolhost/internal/host"
	"github.com/toolhost/toolhost/internal/testnet"
	"github.com/toolhost/toolhost/internal/webfetch"
	"github.com/toolhost/toolhost/policy"
)

// internalBody is what every place a fetch must never reach answers: a test that reads it
// got through.
const internalBody = "INTERNAL SERVICE: you should never read this"

const page = `<!doctype html><html><head><title>Docs</title><script>alert("x")</script></head>
<body><h1>Getting started</h1><p>Read <a href="/guide/install">the install guide</a> first.</p>
<ul><li>one</li><li>two</li></ul></body></html>`

// web is a test's internet: docs.test (http and https) and its friends on TEST-NET
// addresses, names under *.docs.test that resolve to addresses no fetch may reach, each
// with something listening there, and a gateway and Fetcher in front of it all.
type web struct {
	n *testnet.Net
	f *webfetch.Fetcher
}

// bad are names under *.docs.test resolving where no fetch may go, and whether the
// listener is on the host side (where the gateway runs) or the internet side.
var bad = []struct {
	name, addr string
	host       bool
}{
	{"lo.docs.test", "127.0.0.1", true},
	{"own.docs.test", testnet.GatewayAddr.String(), true},
	{"ten.docs.test", "10.0.0.1", false},
	{"meta.docs.test", "169.254.169.254", false},
	{"ula.docs.test", "fd00::1", false},
	{"rfc1918.docs.test", "192.168.7.7", false},
}

func newWeb(t *testing.T) *web {
	t.Helper()
	n := testnet.New(t)
	w := &web{n: n}
	docs, err := n.AddHost("docs.test")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(rw, page)
	})
	mux.HandleFunc("/plain", func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(rw, "ua=%s accept=%s", r.UserAgent(), r.Header.Get("Accept"))
	})
	mux.HandleFunc("/big", func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/plain")
		chunk := []byte(strings.Repeat("x", 64<<10))
		for range 64 { // 4 MiB, far past what the test asks for
			if _, err := rw.Write(chunk); err != nil {
				return
			}
		}
	})
	mux.HandleFunc("/quiet", func(rw http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // never answers
	})
	mux.HandleFunc("/to-private", func(rw http.ResponseWriter, r *http.Request) {
		http.Redirect(rw, r, "http://ten.docs.test/", http.StatusFound)
	})
	mux.HandleFunc("/to-metadata", func(rw http.ResponseWriter, r *http.Request) {
		http.Redirect(rw, r, "http://169.254.169.254/latest/meta-data/", http.StatusFound)
	})
	mux.HandleFunc("/to-other", func(rw http.ResponseWriter, r *http.Request) {
		http.Redirect(rw, r, "http://other.test/", http.StatusMovedPermanently)
	})
	mux.HandleFunc("/to-https", func(rw http.ResponseWriter, r *http.Request) {
		http.Redirect(rw, r, "https://docs.test/plain", http.StatusFound)
	})
	mux.HandleFunc("/redirect", func(rw http.ResponseWriter, r *http.Request) {
		http.Redirect(rw, r, r.URL.Query().Get("to"), http.StatusFound)
	})
	mux.HandleFunc("/loop", func(rw http.ResponseWriter, r *http.Request) {
		http.Redirect(rw, r, "/loop", http.StatusFound)
	})
	l, err := n.Listen("tcp", netip.AddrPortFrom(docs, 80).String())
	if err != nil {
		t.Fatal(err)
	}
	n.Serve(l, mux)
	ls, err := n.Listen("tcp", netip.AddrPortFrom(docs, 443).String())
	if err != nil {
		t.Fatal(err)
	}
	if err := n.ServeTLS(ls, mux, "docs.test"); err != nil {
		t.Fatal(err)
	}
	other, err := n.AddHost("other.test")
	if err != nil {
		t.Fatal(err)
	}
	lo, err := n.Listen("tcp", netip.AddrPortFrom(other, 80).String())
	if err != nil {
		t.Fatal(err)
	}
	n.Serve(lo, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) { io.WriteString(rw, internalBody) }))

	internal := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) { io.WriteString(rw, internalBody) })
	for _, b := range bad {
		a := netip.MustParseAddr(b.addr)
		var l net.Listener
		if b.host {
			l, err = n.ListenHost("tcp", netip.AddrPortFrom(a, 80).String())
		} else {
			if err = n.AddAddr(a); err == nil {
				l, err = n.Listen("tcp", netip.AddrPortFrom(a, 80).String())
			}
		}
		if err != nil {
			t.Fatalf("listening on %s: %v", b.addr, err)
		}
		n.Serve(l, internal)
		n.SetDNS(b.name, a)
	}
	g := egress.New(egress.Config{
		Resolver:  &egress.DNSResolver{Server: n.DNS(), Dialer: n},
		Dialer:    n,
		HostAddrs: n.HostAddrs(),
	})
	w.f, err = webfetch.New(webfetch.Config{Gateway: g, RootCAs: n.CertPool()})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// scope allows docs.test and every name below it: the bad names are allowed by name, so
// only the gateway's address check stands between a fetch and them.
var scope = &policy.Web{Preset: "none", Allow: []string{"docs.test", "*.docs.test"}}

func (w *web) fetch(t *testing.T, url string, maxBytes int) (host.FetchResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testHang)
	defer cancel()
	return w.f.Fetch(ctx, host.FetchTarget{Plugin: "webfetch", Scope: scope}, abi.FetchRequest{URL: url, MaxBytes: maxBytes})
}

// testHang bounds a fetch that should end: a hang bound, never a timing.
const testHang = 2 * time.Minute

func TestFetchAllowed(t *testing.T) {
	w := newWeb(t)
	for _, url := range []string{"http://docs.test/", "https://docs.test/"} {
		res, err := w.fetch(t, url, 0)
		if err != nil {
			t.Fatalf("%s: %v", url, err)
		}
		if res.Status != 200 || !strings.HasPrefix(res.ContentType, "text/html") || string(res.Body) != page || res.Truncated || res.URL != url {
			t.Errorf("%s: got %d %q %q truncated=%v body %q", url, res.Status, res.URL, res.ContentType, res.Truncated, res.Body)
		}
	}
	res, err := w.fetch(t, "http://docs.test/plain", 0)
	if err != nil {
		t.Fatal(err)
	}
	if body := string(res.Body); !strings.Contains(body, "ua="+webfetch.UserAgent) || !strings.Contains(body, "accept=text/html") {
		t.Errorf("the request's headers: %q", body)
	}
	// A redirect from http to https on an allowed name is followed, through CONNECT.
	res, err = w.fetch(t, "http://docs.test/to-https", 0)
	if err != nil {
		t.Fatal(err)
	}
	if res.URL != "https://docs.test/plain" || !strings.HasPrefix(string(res.Body), "ua=") {
		t.Errorf("after the redirect: %q %q", res.URL, res.Body)
	}
}

func TestFetchRefused(t *testing.T) {
	w := newWeb(t)
	cases := []struct {
		url  string
		want string
	}{
		{"http://other.test/", "other.test is not an allowed domain"},
		{"http://docs.test/to-other", "other.test is not an allowed domain"},
		{"http://docs.test/to-private", "private"},
		{"http://docs.test/to-metadata", "169.254.169.254"},
		{"http://169.254.169.254/latest/meta-data/", "169.254.169.254"},
		{"http://127.0.0.1/", "127.0.0.1"},
		{"http://[::1]/", "::1"},
		{"http://2130706433/", "127.0.0.1"}, // 127.0.0.1 spelled as a number
		{"http://docs.test:8080/", "port 8080"},
	}
	for _, b := range bad {
		cases = append(cases, struct{ url, want string }{"http://" + b.name + "/", b.addr})
	}
	for _, c := range cases {
		res, err := w.fetch(t, c.url, 0)
		if err == nil {
			t.Errorf("%s: fetched (HTTP %d, %q), want a refusal", c.url, res.Status, res.Body)
			continue
		}
		if !errors.Is(err, host.ErrRefused) {
			t.Errorf("%s: error %v does not wrap host.ErrRefused", c.url, err)
		}
		if msg := err.Error(); !strings.Contains(msg, c.want) || strings.Contains(msg, internalBody) {
			t.Errorf("%s: refusal %q does not say %q", c.url, msg, c.want)
		}
	}
	// The advice names the plugin's scope, not the sandbox's.
	_, err := w.fetch(t, "http://other.test/", 0)
	if err == nil || !strings.Contains(err.Error(), "web_fetch plugin's web.allow") || strings.Contains(err.Error(), "sandbox.egress") {
		t.Errorf("the refusal's advice: %v", err)
	}
}

// A web scope whose allow CIDR covers a private range (a LAN's docs server) opens that
// range, and never this host's own address inside it, where every service of the host
// bound to 0.0.0.0 or [::] answers: not fetched directly, by a name leading there, or
// after a redirect from an allowed page. The gateway's judge decides, as for a sandbox.
func TestFetchHostsOwnAddress(t *testing.T) {
	w := newWeb(t)
	lanDocs := netip.MustParseAddr("172.16.5.5")
	if err := w.n.AddAddr(lanDocs); err != nil {
		t.Fatal(err)
	}
	l, err := w.n.Listen("tcp", netip.AddrPortFrom(lanDocs, 80).String())
	if err != nil {
		t.Fatal(err)
	}
	w.n.Serve(l, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) { io.WriteString(rw, "lan docs") }))
	own, own6 := netip.MustParseAddr("172.16.99.1"), netip.MustParseAddr("fd00::99")
	for _, a := range []netip.Addr{own, own6} {
		if err := w.n.AddHostAddr(a); err != nil {
			t.Fatal(err)
		}
	}
	lh, err := w.n.ListenHost("tcp", "[::]:8443")
	if err != nil {
		t.Fatal(err)
	}
	w.n.Serve(lh, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) { io.WriteString(rw, internalBody) }))
	w.n.SetDNS("lan.docs.test", own)
	w.n.SetDNS("lan6.docs.test", own6)

	scope := &policy.Web{Preset: "none", Allow: []string{"docs.test", "*.docs.test", "172.16.0.0/12", "fd00::/64"}, Ports: []int{80, 443, 8443}}
	fetch := func(url string) (host.FetchResponse, error) {
		ctx, cancel := context.WithTimeout(context.Background(), testHang)
		defer cancel()
		return w.f.Fetch(ctx, host.FetchTarget{Plugin: "webfetch", Scope: scope}, abi.FetchRequest{URL: url})
	}
	if res, err := fetch("http://172.16.5.5/"); err != nil || string(res.Body) != "lan docs" {
		t.Fatalf("the LAN's docs server, which the scope allows: %+v %v", res, err)
	}
	for _, u := range []string{
		"http://172.16.99.1:8443/", "http://[fd00::99]:8443/", "http://[::ffff:172.16.99.1]:8443/",
		"http://lan.docs.test:8443/", "http://lan6.docs.test:8443/",
		"http://docs.test/redirect?to=" + url.QueryEscape("http://172.16.99.1:8443/"),
		"https://docs.test/redirect?to=" + url.QueryEscape("http://lan.docs.test:8443/"),
		"https://docs.test/redirect?to=" + url.QueryEscape("http://[fd00::99]:8443/"),
	} {
		res, err := fetch(u)
		if err == nil {
			t.Errorf("%s: fetched (HTTP %d, %q), want a refusal", u, res.Status, res.Body)
			continue
		}
		if msg := err.Error(); !errors.Is(err, host.ErrRefused) || !strings.Contains(msg, "one of this host's own addresses, which is never fetched") || strings.Contains(msg, internalBody) {
			t.Errorf("%s: %v; want the refusal of this host's own address", u, err)
		}
	}
}

func TestFetchBounds(t *testing.T) {
	w := newWeb(t)
	res, err := w.fetch(t, "http://docs.test/big", 1000)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Truncated || len(res.Body) != 1000 {
		t.Errorf("a 4 MiB body asked for 1000 bytes: truncated=%v, %d bytes", res.Truncated, len(res.Body))
	}
	// A server that never answers: the caller's deadline ends the fetch.
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := w.f.Fetch(ctx, host.FetchTarget{Plugin: "webfetch", Scope: scope}, abi.FetchRequest{URL: "http://docs.test/quiet"})
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("a silent server: %v, want the deadline", err)
		}
	case <-time.After(testHang):
		t.Fatal("a fetch of a silent server outlived its deadline")
	}
	// Redirects are bounded.
	_, err = w.fetch(t, "http://docs.test/loop", 0)
	if err == nil || !strings.Contains(err.Error(), "redirects") {
		t.Errorf("a redirect loop: %v", err)
	}
}

// TestFetchDefaultScope: a plugin without a web scope may fetch what the registries preset
// names, and nothing else.
func TestFetchDefaultScope(t *testing.T) {
	w := newWeb(t)
	ctx, cancel := context.WithTimeout(context.Background(), testHang)
	defer cancel()
	_, err := w.f.Fetch(ctx, host.FetchTarget{Plugin: "webfetch"}, abi.FetchRequest{URL: "http://docs.test/"})
	if !errors.Is(err, host.ErrRefused) || !strings.Contains(err.Error(), "registry.npmjs.org") {
		t.Errorf("docs.test without a scope: %v, want a refusal listing the registries", err)
	}
}

func TestCheck(t *testing.T) {
	for _, w := range []*policy.Web{nil, {Allow: []string{"go.dev", "*.python.org", "203.0.113.0/24:8080"}}, {Preset: "none"}} {
		if err := webfetch.Check(w); err != nil {
			t.Errorf("%+v: %v", w, err)
		}
	}
	for _, w := range []*policy.Web{{Preset: "everything"}, {Allow: []string{"bad name!"}}, {Deny: []string{"*"}}, {Ports: []int{70000}}} {
		if err := webfetch.Check(w); err == nil {
			t.Errorf("%+v: accepted", w)
		}
	}
}
