//go:build linux

package egress_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/toolhost/toolhost/internal/egress"
	"github.com/toolhost/toolhost/internal/testenv"
	"github.com/toolhost/toolhost/internal/testnet"
)

// internalBody is what every place a sandbox must never reach answers: a test that reads
// it got through.
const internalBody = "INTERNAL SERVICE: you should never read this"

// fixture is the test internet with a gateway in front of it.
type fixture struct {
	t     testing.TB
	n     *testnet.Net
	g     *egress.Gateway
	c     *egress.Client
	audit *recorder
	proxy *url.URL // the client's listener (Serve), on the test's own loopback
	reg   netip.Addr

	mu   sync.Mutex
	auth []string // Authorization headers registry.test saw
}

type recorder struct {
	mu   sync.Mutex
	recs []egress.Record
}

func (r *recorder) add(rec *egress.Record) {
	r.mu.Lock()
	r.recs = append(r.recs, *rec)
	r.mu.Unlock()
}

func (r *recorder) all() []egress.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]egress.Record(nil), r.recs...)
}

// find waits (a hang bound, not a timing) for a record that match selects: records are
// written when a connection ends, which may be just after the client saw its answer.
func (r *recorder) find(t testing.TB, what string, match func(egress.Record) bool) egress.Record {
	t.Helper()
	var found egress.Record
	if !testenv.Eventually(func() bool {
		recs := r.all()
		i := slices.IndexFunc(recs, match)
		if i >= 0 {
			found = recs[i]
		}
		return i >= 0
	}) {
		t.Fatalf("no audit record of %s; records: %+v", what, r.all())
	}
	return found
}

// bad are the destinations no sandbox may reach, each with something listening, so a
// refusal is one; "host" ones are on the host side (where the gateway runs).
var bad = []struct {
	name string // a name under *.allowed.test resolving to it
	addr string
	host bool
}{
	{"lo.allowed.test", "127.0.0.1", true},
	{"lo6.allowed.test", "::1", true},
	{"own.allowed.test", testnet.GatewayAddr.String(), true},
	{"own6.allowed.test", testnet.GatewayAddr6.String(), true},
	{"ten.allowed.test", "10.0.0.1", false},
	{"meta.allowed.test", "169.254.169.254", false},
	{"meta6.allowed.test", "fd00:ec2::254", false},
	{"ula.allowed.test", "fd00::1", false},
	{"cgnat.allowed.test", "100.64.0.1", false},
	{"rfc1918.allowed.test", "192.168.7.7", false},
}

type fixtureOpt func(*egress.Config, *egress.ClientConfig)

func newFixture(t testing.TB, spec egress.Spec, opts ...fixtureOpt) *fixture {
	t.Helper()
	n := testnet.New(t)
	f := &fixture{t: t, n: n, audit: &recorder{}}
	var err error
	if f.reg, err = n.AddHost("registry.test"); err != nil {
		t.Fatal(err)
	}
	reg := http.NewServeMux()
	reg.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s", r.Host)
	})
	reg.HandleFunc("/auth", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.auth = append(f.auth, r.Header.Get("Authorization"))
		f.mu.Unlock()
		io.WriteString(w, "seen")
	})
	reg.HandleFunc("/bytes", func(w http.ResponseWriter, r *http.Request) {
		size, _ := strconv.Atoi(r.URL.Query().Get("n"))
		w.Header().Set("Content-Length", strconv.Itoa(size))
		chunk := make([]byte, 64<<10)
		for size > 0 {
			k := min(size, len(chunk))
			if _, err := w.Write(chunk[:k]); err != nil {
				return
			}
			size -= k
		}
	})
	reg.HandleFunc("/redirect", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", r.URL.Query().Get("to"))
		w.WriteHeader(http.StatusFound)
	})
	reg.HandleFunc("/quiet", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	for _, port := range []int{80, 8080} {
		l, err := n.Listen("tcp", netip.AddrPortFrom(f.reg, uint16(port)).String())
		if err != nil {
			t.Fatal(err)
		}
		n.Serve(l, reg)
	}
	l, err := n.Listen("tcp", netip.AddrPortFrom(f.reg, 443).String())
	if err != nil {
		t.Fatal(err)
	}
	if err := n.ServeTLS(l, reg, "registry.test", "other-name.test"); err != nil {
		t.Fatal(err)
	}
	// A raw TCP service on port 22 of an allowed name: reachable only with a rule for it.
	l22, err := n.Listen("tcp", netip.AddrPortFrom(f.reg, 22).String())
	if err != nil {
		t.Fatal(err)
	}
	serveLine(n, l22, "SSH-2.0-test\r\n")

	a, err := n.AddHost("a.allowed.test")
	if err != nil {
		t.Fatal(err)
	}
	la, err := n.Listen("tcp", netip.AddrPortFrom(a, 443).String())
	if err != nil {
		t.Fatal(err)
	}
	if err := n.ServeTLS(la, reg, "a.allowed.test"); err != nil {
		t.Fatal(err)
	}
	o, err := n.AddHost("other.test")
	if err != nil {
		t.Fatal(err)
	}
	lo, err := n.Listen("tcp", netip.AddrPortFrom(o, 80).String())
	if err != nil {
		t.Fatal(err)
	}
	n.Serve(lo, reg)
	for _, name := range []string{"evil-allowed.test", "allowed.test.evil.test", "blocked.allowed.test", "xn--bcher-kva.allowed.test"} {
		a, err := n.AddHost(name)
		if err != nil {
			t.Fatal(err)
		}
		l, err := n.Listen("tcp", netip.AddrPortFrom(a, 80).String())
		if err != nil {
			t.Fatal(err)
		}
		n.Serve(l, reg)
	}
	internal := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, internalBody) })
	for _, b := range bad {
		a := netip.MustParseAddr(b.addr)
		var l net.Listener
		var err error
		if b.host {
			l, err = n.ListenHost("tcp", netip.AddrPortFrom(a, 80).String())
		} else {
			if err := n.AddAddr(a); err != nil {
				t.Fatal(err)
			}
			l, err = n.Listen("tcp", netip.AddrPortFrom(a, 80).String())
		}
		if err != nil {
			t.Fatalf("listen on %s: %v", b.addr, err)
		}
		n.Serve(l, internal)
		n.SetDNS(b.name, a)
	}

	cfg := egress.Config{
		Resolver:  &egress.DNSResolver{Server: n.DNS(), Dialer: n},
		CacheTTL:  -1,
		Dialer:    n,
		HostAddrs: n.HostAddrs(),
		RootCAs:   n.CertPool(),
		Audit:     f.audit.add,
	}
	p, err := egress.Compile(spec)
	if err != nil {
		t.Fatal(err)
	}
	cc := egress.ClientConfig{Sandbox: "sb-1", Policy: p}
	for _, o := range opts {
		o(&cfg, &cc)
	}
	f.g = egress.New(cfg)
	if f.c, err = f.g.NewClient(cc); err != nil {
		t.Fatal(err)
	}
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = f.c.Serve(pl) }()
	t.Cleanup(func() { f.c.Close(); <-done })
	f.proxy = &url.URL{Scheme: "http", Host: pl.Addr().String()}
	return f
}

// serveLine answers every connection with one line and closes it.
func serveLine(n *testnet.Net, l net.Listener, line string) {
	n.OnClose(func() { l.Close() })
	go func() { // owned by n: OnClose closes l
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, line)
			c.Close()
		}
	}()
}

// conn is a connection to the gateway attributed to command cmd (a socket pair, one end
// served by ServeConn, as a provider hands the gateway a sandbox's connections).
func (f *fixture) conn(cmd string) net.Conn {
	f.t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		f.t.Fatal(err)
	}
	mk := func(fd int) net.Conn {
		file := os.NewFile(uintptr(fd), "pair")
		c, err := net.FileConn(file)
		file.Close()
		if err != nil {
			f.t.Fatal(err)
		}
		return c
	}
	client, server := mk(fds[0]), mk(fds[1])
	go f.c.ServeConn(server, egress.ConnInfo{Command: cmd})
	f.t.Cleanup(func() { client.Close() })
	return client
}

// client is an HTTP client whose every connection to the proxy is attributed to cmd;
// trust is its TLS roots (nil: the test CA).
func (f *fixture) client(cmd string, trust *x509.CertPool) *http.Client {
	if trust == nil {
		trust = f.n.CertPool()
	}
	tr := &http.Transport{
		Proxy: http.ProxyURL(f.proxy),
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return f.conn(cmd), nil
		},
		TLSClientConfig:   &tls.Config{RootCAs: trust},
		DisableKeepAlives: true,
	}
	f.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 60 * time.Second}
}

// get fetches u through the gateway and returns the status and body.
func (f *fixture) get(c *http.Client, u string) (int, string, error) {
	resp, err := c.Get(u)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// connect sends a raw CONNECT on a new connection and returns the status line, with the
// connection (open when the tunnel is).
func (f *fixture) connect(cmd, target string) (string, net.Conn, *bufio.Reader) {
	f.t.Helper()
	c := f.conn(cmd)
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil {
		f.t.Fatalf("CONNECT %s: read the status: %v", target, err)
	}
	for { // the headers, up to the blank line
		h, err := br.ReadString('\n')
		if err != nil {
			f.t.Fatalf("CONNECT %s: read the headers: %v", target, err)
		}
		if h == "\r\n" {
			break
		}
	}
	if !strings.Contains(line, " 200 ") { // the body of a refusal
		io.Copy(io.Discard, br)
	}
	return strings.TrimRight(line, "\r\n"), c, br
}
