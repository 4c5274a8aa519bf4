//go:build linux

// Package testnet builds "the internet" for a test, on this machine and nowhere else:
// two network namespaces of the test process's own, joined by a veth pair.
//
//   - the host side ("gw", 198.51.100.1 and 2001:db8:100::1) is where the code under
//     test dials from, as if it were the host: its default routes lead to the other side
//     and nowhere else;
//   - the internet side ("inet", 198.51.100.2 and 2001:db8:100::2) holds the test's hosts
//     on addresses of TEST-NET-3 (203.0.113.0/24) and 2001:db8:200::/64, a DNS server the
//     test controls (203.0.113.53), and, where a test puts them, addresses that must
//     never be reached (10.0.0.1, 169.254.169.254, fd00::1, ...) with something listening
//     on them, so that a refusal is a refusal and not a dead end.
//
// The namespaces have no names (nothing under /run/netns) and are held by descriptors of
// this process: Close, or the process ending, removes them and everything in them. No
// packet can leave the machine: neither namespace has a route to the host's own network.
//
// It needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and ip(8) from iproute2; without them
// New skips the test (fails it under CI=true).
package testnet

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/toolhost/toolhost/internal/egress"
	"github.com/toolhost/toolhost/internal/testenv"
)

// Addresses of the two sides.
var (
	GatewayAddr  = netip.MustParseAddr("198.51.100.1")
	InternetAddr = netip.MustParseAddr("198.51.100.2")
	GatewayAddr6 = netip.MustParseAddr("2001:db8:100::1")
	// DNSAddr is the test's DNS server (UDP and TCP port 53).
	DNSAddr = netip.MustParseAddr("203.0.113.53")
)

// Net is one test's internet.
type Net struct {
	gw, inet *netns
	own      *egress.HostAddrs // the host side's addresses, watched
	dns      *dnsServer
	ca       *testCA

	mu      sync.Mutex
	next    int                 // next host number in 203.0.113.0/24
	onLo    map[netip.Addr]bool // addresses put on the internet side's loopback
	servers []*http.Server      // closed by Close
	closers []func()            // closed by Close, before the namespaces
	certs   map[string]*tls.Certificate
}

// New builds the internet for t and removes it when t ends.
func New(t testing.TB) *Net {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Skipf(t, "testnet needs root to make network namespaces (run the tests as root; CI runs as root)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		testenv.Skipf(t, "testnet needs ip(8) (Debian package iproute2; scripts/setup.sh --test installs it): %v", err)
	}
	n, err := build()
	if err != nil {
		if n != nil {
			n.Close()
		}
		testenv.Require(t, "network namespaces and veth pairs (root, CAP_NET_ADMIN)", err)
	}
	t.Cleanup(n.Close)
	return n
}

func build() (*Net, error) {
	n := &Net{next: 10, onLo: map[netip.Addr]bool{}, certs: map[string]*tls.Certificate{}}
	var err error
	if n.gw, err = newNetns("gw"); err != nil {
		return nil, err
	}
	if n.inet, err = newNetns("inet"); err != nil {
		return n, err
	}
	if n.own, err = egress.WatchHostAddrs(n.gw.do); err != nil {
		return n, err
	}
	// Both ends are made inside the namespaces; nothing touches the machine's own.
	steps := []struct {
		ns   *netns
		to   *netns
		args []string
	}{
		{n.gw, n.inet, []string{"link", "add", "th0", "type", "veth", "peer", "name", "th1", "netns", "/proc/self/fd/3"}},
		{n.gw, nil, []string{"addr", "add", "198.51.100.1/24", "dev", "th0"}},
		{n.gw, nil, []string{"addr", "add", "2001:db8:100::1/64", "dev", "th0", "nodad"}},
		{n.gw, nil, []string{"link", "set", "th0", "up"}},
		{n.gw, nil, []string{"route", "add", "default", "via", "198.51.100.2"}},
		{n.gw, nil, []string{"-6", "route", "add", "default", "via", "2001:db8:100::2"}},
		{n.inet, nil, []string{"addr", "add", "198.51.100.2/24", "dev", "th1"}},
		{n.inet, nil, []string{"addr", "add", "2001:db8:100::2/64", "dev", "th1", "nodad"}},
		{n.inet, nil, []string{"link", "set", "th1", "up"}},
		// Anything the test did not put on the internet side is unreachable at once
		// (an ICMP error, with forwarding on), not a silent drop that waits for a timeout.
		{n.inet, nil, []string{"route", "add", "unreachable", "default"}},
		{n.inet, nil, []string{"-6", "route", "add", "unreachable", "default"}},
	}
	if err := n.inet.sysctl("net/ipv4/ip_forward", "1"); err != nil {
		return n, err
	}
	for _, kv := range [][2]string{
		{"net/ipv6/conf/all/forwarding", "1"},
		// Every refusal, not the first few per second.
		{"net/ipv4/icmp_ratelimit", "0"},
		{"net/ipv6/icmp/ratelimit", "0"},
	} {
		if err := n.inet.sysctl(kv[0], kv[1]); err != nil {
			return n, err
		}
	}
	for _, s := range steps {
		if s.to != nil {
			err = s.ns.ipTo(s.to, s.args...)
		} else {
			err = s.ns.ip(s.args...)
		}
		if err != nil {
			return n, err
		}
	}
	if n.ca, err = newTestCA(); err != nil {
		return n, err
	}
	if err := n.AddAddr(DNSAddr); err != nil {
		return n, err
	}
	if n.dns, err = startDNS(n.inet, netip.AddrPortFrom(DNSAddr, 53)); err != nil {
		return n, err
	}
	return n, nil
}

// Close removes everything: servers first, then the namespaces.
func (n *Net) Close() {
	n.mu.Lock()
	servers, closers := n.servers, n.closers
	n.servers, n.closers = nil, nil
	n.mu.Unlock()
	for _, s := range servers {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = s.Shutdown(ctx)
		cancel()
		_ = s.Close()
	}
	for i := len(closers) - 1; i >= 0; i-- {
		closers[i]()
	}
	if n.dns != nil {
		n.dns.close()
	}
	if n.own != nil {
		_ = n.own.Close()
	}
	if n.inet != nil {
		n.inet.close()
	}
	if n.gw != nil {
		n.gw.close()
	}
}

// DNS is the address of the test's DNS server, for sandbox.egress.resolver.
func (n *Net) DNS() netip.AddrPort { return netip.AddrPortFrom(DNSAddr, 53) }

// SetDNS makes name resolve to addrs (A and AAAA records, a TTL of one second); no
// addresses makes it not exist.
func (n *Net) SetDNS(name string, addrs ...netip.Addr) { n.dns.set(name, addrs) }

// DNSQueries counts the queries the DNS server answered.
func (n *Net) DNSQueries() int64 { return n.dns.queries.Load() }

// AddAddr puts addr on the internet side (its loopback), routed from the host side.
func (n *Net) AddAddr(addr netip.Addr) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.onLo[addr] {
		return nil
	}
	if err := addLo(n.inet, addr); err != nil {
		return err
	}
	n.onLo[addr] = true
	return nil
}

// AddHostAddr gives the host side one more address of its own (on its loopback): an
// address of "the host" in whatever range addr lies in (an operator's LAN, 172.16.0.0/12
// or fd00::/64), on which every service of the host bound to 0.0.0.0 or [::] answers.
// An IPv4 address is announced to the watchers of the host side's addresses (netlink)
// before AddHostAddr returns; an IPv6 one is announced when it is usable (after the
// kernel's address work, nodad).
func (n *Net) AddHostAddr(addr netip.Addr) error { return addLo(n.gw, addr) }

// addLo puts addr on the loopback of ns.
func addLo(ns *netns, addr netip.Addr) error {
	args := []string{"addr", "add", netip.PrefixFrom(addr, addr.BitLen()).String(), "dev", "lo"}
	if addr.Is6() {
		args = append([]string{"-6"}, append(args, "nodad")...)
	}
	return ns.ip(args...)
}

// AddHost gives name a new address in 203.0.113.0/24 (and its DNS record) and returns
// the address.
func (n *Net) AddHost(name string) (netip.Addr, error) {
	n.mu.Lock()
	i := n.next
	n.next++
	n.mu.Unlock()
	if i > 250 {
		return netip.Addr{}, errors.New("testnet: out of host addresses")
	}
	a := netip.AddrFrom4([4]byte{203, 0, 113, byte(i)})
	if err := n.AddAddr(a); err != nil {
		return netip.Addr{}, err
	}
	n.SetDNS(name, a)
	return a, nil
}

// Shape limits the link between the two sides to rate bits per second in each
// direction (a token bucket filter, tc-tbf, on both ends of the veth pair), as a slow
// link to a remote service: a test that measures a transfer on, say, 100 Mbit/s. It
// needs tc(8) (iproute2); the filters go with the namespaces.
func (n *Net) Shape(rate int64) error {
	if _, err := exec.LookPath("tc"); err != nil {
		return fmt.Errorf("testnet: shaping needs tc(8) (Debian package iproute2): %w", err)
	}
	// The bucket holds 10 ms of traffic (tbf needs at least rate/HZ) and the queue 50 ms.
	burst := max(rate/8/100, 16<<10)
	args := func(dev string) []string {
		return []string{"qdisc", "replace", "dev", dev, "root", "tbf", "rate", fmt.Sprintf("%dbit", rate),
			"burst", fmt.Sprint(burst), "latency", "50ms"}
	}
	if err := n.gw.run("tc", args("th0")...); err != nil {
		return err
	}
	return n.inet.run("tc", args("th1")...)
}

// Listen listens on the internet side.
func (n *Net) Listen(network, addr string) (net.Listener, error) { return n.inet.listen(network, addr) }

// ListenPacket listens for datagrams on the internet side.
func (n *Net) ListenPacket(network, addr string) (net.PacketConn, error) {
	return n.inet.listenPacket(network, addr)
}

// ListenHost listens on the host side (where the gateway dials from): a service of "the
// host" that a sandbox must not reach.
func (n *Net) ListenHost(network, addr string) (net.Listener, error) {
	return n.gw.listen(network, addr)
}

// Dial connects from the host side; DialContext is the gateway's Dialer.
func (n *Net) Dial(network, addr string) (net.Conn, error) {
	return n.gw.dial(context.Background(), network, addr)
}

// DialContext connects from the host side.
func (n *Net) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return n.gw.dial(ctx, network, addr)
}

// DialInternet connects from the internet side (to reach its own services directly).
func (n *Net) DialInternet(ctx context.Context, network, addr string) (net.Conn, error) {
	return n.inet.dial(ctx, network, addr)
}

// HostAddrs is the watch of the host side's own addresses (what the gateway must refuse
// as "this host's"), for egress.Config.HostAddrs: the gateway's own watch, made inside the
// host side. It goes with the network.
func (n *Net) HostAddrs() *egress.HostAddrs { return n.own }

// Serve serves h on l (plain HTTP) until Close.
func (n *Net) Serve(l net.Listener, h http.Handler) {
	s := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: quiet}
	n.mu.Lock()
	n.servers = append(n.servers, s)
	n.mu.Unlock()
	go func() { _ = s.Serve(l) }() // owned by n: Close shuts the server down
}

// ServeTLS serves h on l over TLS with a certificate for names from the test CA.
func (n *Net) ServeTLS(l net.Listener, h http.Handler, names ...string) error {
	cert, err := n.ca.issue(names...)
	if err != nil {
		return err
	}
	s := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: quiet,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{*cert}, MinVersion: tls.VersionTLS12}}
	n.mu.Lock()
	n.servers = append(n.servers, s)
	n.mu.Unlock()
	go func() { _ = s.ServeTLS(l, "", "") }() // owned by n: Close shuts the server down
	return nil
}

// quiet drops the test servers' own logs (handshakes the tests break on purpose).
var quiet = log.New(io.Discard, "", 0)

// OnClose runs f when the network is removed (before the namespaces go).
func (n *Net) OnClose(f func()) {
	n.mu.Lock()
	n.closers = append(n.closers, f)
	n.mu.Unlock()
}

// CAPEM is the test CA's certificate, for clients that must trust the test hosts.
func (n *Net) CAPEM() []byte { return n.ca.pem }

// CertPool holds the test CA.
func (n *Net) CertPool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(n.ca.cert)
	return p
}

// Certificate issues a certificate for names from the test CA.
func (n *Net) Certificate(names ...string) (*tls.Certificate, error) { return n.ca.issue(names...) }

// testCA is the CA of the test hosts' certificates.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA() (*testCA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "toolhost testnet CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(48 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

func (ca *testCA) issue(names ...string) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	sn, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: names[0]},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, nm := range names {
		if a, err := netip.ParseAddr(nm); err == nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, a.AsSlice())
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, nm)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("issue a test certificate: %w", err)
	}
	return &tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: key}, nil
}
