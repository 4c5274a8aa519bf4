package egress

import (
	"bufio"
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
	"math/big"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// Credential injection. For the domains named in ClientConfig.Inject, and only for them,
// the gateway terminates the sandbox's TLS with a certificate from a CA of that sandbox
// alone, adds the header to every request, and sends it on over its own TLS connection,
// verified against the host's roots. The header's value exists only in the host process:
// the sandbox holds the CA's certificate (to trust it), never its key or the value.
//
// The CA can only issue for the injected domains (a critical name constraint, and no IP
// addresses), lives as long as the sandbox's client, and its key never leaves memory.
// Plain HTTP to an injected domain is forwarded without the header: a secret is never sent
// in clear text.

type injector struct {
	byDomain map[string]Injection
	caCert   *x509.Certificate
	caKey    *ecdsa.PrivateKey
	caPEM    []byte
	leafKey  *ecdsa.PrivateKey

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// caLifetime covers a sandbox's longest life with room; a rotation's successor gets a CA
// of its own.
const caLifetime = 72 * time.Hour

// reservedHeaders are headers an injection may not set: the gateway and HTTP itself own
// them.
var reservedHeaders = []string{"Host", "Content-Length", "Transfer-Encoding", "Connection", "Upgrade",
	"Te", "Trailer", "Keep-Alive", "Proxy-Connection", "Proxy-Authorization", "Proxy-Authenticate", "Expect"}

func newInjector(sandbox string, injs []Injection) (*injector, error) {
	inj := &injector{byDomain: map[string]Injection{}, leaves: map[string]*tls.Certificate{}}
	var domains []string
	for _, in := range injs {
		h, err := parseHost(in.Domain)
		if err != nil || h.isAddr() || strings.HasPrefix(in.Domain, "*") {
			return nil, fmt.Errorf("inject: domain %q must be one exact domain name", in.Domain)
		}
		name := http.CanonicalHeaderKey(in.Header)
		if !validToken(in.Header) || slices.ContainsFunc(reservedHeaders, func(r string) bool { return strings.EqualFold(r, name) }) {
			return nil, fmt.Errorf("inject: %q is not a header the gateway may set", in.Header)
		}
		if in.Value == "" || strings.ContainsAny(in.Value, "\r\n\x00") {
			return nil, fmt.Errorf("inject: the value for %s on %s is empty or spans lines", name, h.name)
		}
		if _, dup := inj.byDomain[h.name]; dup {
			return nil, fmt.Errorf("inject: %s is named twice", h.name)
		}
		inj.byDomain[h.name] = Injection{Domain: h.name, Header: name, Value: in.Value}
		domains = append(domains, h.name)
	}
	var err error
	if inj.caKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		return nil, err
	}
	if inj.leafKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:                serial(),
		Subject:                     pkix.Name{CommonName: "toolhost egress CA for sandbox " + sandbox, Organization: []string{"toolhost"}},
		NotBefore:                   now.Add(-time.Hour),
		NotAfter:                    now.Add(caLifetime),
		IsCA:                        true,
		BasicConstraintsValid:       true,
		MaxPathLenZero:              true,
		KeyUsage:                    x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		PermittedDNSDomainsCritical: true,
		PermittedDNSDomains:         domains,
		ExcludedIPRanges: []*net.IPNet{
			{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)},
			{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)},
		},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &inj.caKey.PublicKey, inj.caKey)
	if err != nil {
		return nil, fmt.Errorf("inject: make the sandbox's CA: %w", err)
	}
	if inj.caCert, err = x509.ParseCertificate(der); err != nil {
		return nil, err
	}
	inj.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return inj, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n.Add(n, big.NewInt(1))
}

func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// leaf is the certificate the gateway shows the sandbox for name.
func (inj *injector) leaf(name string) (*tls.Certificate, error) {
	inj.mu.Lock()
	defer inj.mu.Unlock()
	if c := inj.leaves[name]; c != nil {
		return c, nil
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(caLifetime - time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, inj.caCert, &inj.leafKey.PublicKey, inj.caKey)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der, inj.caCert.Raw}, PrivateKey: inj.leafKey}
	inj.leaves[name] = c
	return c, nil
}

// injection is the credential for an allowed destination, or nil: only names, only on
// port 443, only the exact domains named.
func (c *Client) injection(d decision) *Injection {
	if c.inject == nil || d.h.isAddr() || d.port != 443 {
		return nil
	}
	in, ok := c.inject.byDomain[d.h.name]
	if !ok {
		return nil
	}
	return &in
}

// brConn reads what the sandbox sent through the session's buffered reader (which may
// hold bytes already) and writes through the meter.
type brConn struct {
	*meter
	r io.Reader
}

func (c brConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// terminate serves a tunnel to an injected domain: TLS with the sandbox's CA, then each
// request forwarded over the gateway's own TLS with the header added.
func (s *session) terminate(r *Record, d decision, inj *Injection) {
	var sniErr string
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(hi *tls.ClientHelloInfo) (*tls.Certificate, error) {
			if hi.ServerName != "" {
				if h, err := parseHost(hi.ServerName); err != nil || h.name != d.h.name {
					sniErr = sniMismatch(d, hi.ServerName, nil)
					return nil, errors.New("server name differs from the tunnel's destination")
				}
			}
			return s.c.inject.leaf(d.h.name)
		},
	}
	tc := tls.Server(brConn{meter: s.m, r: s.br}, cfg)
	defer tc.Close()
	_ = s.conn.SetDeadline(time.Now().Add(handshakeTimeout))
	err := tc.Handshake()
	_ = s.conn.SetDeadline(time.Time{})
	if err != nil {
		if sniErr != "" {
			r.Decision, r.Rule, r.Reason = Deny, "TLS server name differs from the target", sniErr
			s.c.refused.add(s.info.Command, d.h.name+":443", sniErr)
		} else {
			r.Error = "TLS with the sandbox: " + err.Error()
		}
		return
	}
	br := bufio.NewReaderSize(tc, maxHead)
	for {
		_ = s.conn.SetReadDeadline(time.Now().Add(s.c.limits.IdleTimeout))
		req, hostHdr, err := readRequest(br)
		if err != nil {
			var re *requestError
			if errors.As(err, &re) {
				writeRefusal(tc, Verdict{Reason: "egress: " + re.msg, Status: re.status}, false)
			}
			return
		}
		_ = s.conn.SetReadDeadline(time.Time{})
		if hostHdr == "" {
			hostHdr = req.Host
		}
		if !sameAuthority(hostHdr, d.h.name, 443) {
			reason := fmt.Sprintf("egress: the request's Host header %q differs from the tunnel's destination %s", printable(hostHdr, 100), d.h.name)
			writeRefusal(tc, Verdict{Reason: reason, Status: http.StatusForbidden}, false)
			r.Decision, r.Rule, r.Reason = Deny, "Host header differs from the target", reason
			s.c.refused.add(s.info.Command, d.h.name+":443", reason)
			req.Body.Close()
			return
		}
		if req.Method == http.MethodConnect || req.URL.IsAbs() && req.URL.Host != "" && !sameAuthority(req.URL.Host, d.h.name, 443) {
			writeRefusal(tc, Verdict{Reason: "egress: inside a tunnel to " + d.h.name + ", requests go to " + d.h.name + " only", Status: http.StatusBadRequest}, false)
			req.Body.Close()
			return
		}
		keep := s.roundTrip(s.c.ctx, req, d, r, "https", tc)
		req.Body.Close()
		if !keep {
			return
		}
	}
}
