package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// http serves HTTP on a connection: forward requests (absolute-form) one after another,
// or one CONNECT, which turns the connection into a tunnel.
func (s *session) http() {
	for {
		_ = s.conn.SetReadDeadline(time.Now().Add(handshakeTimeout))
		// The bytes of a request count from its head (read ahead into s.br or not).
		up0, down0 := s.m.counts()
		up0 -= int64(s.br.Buffered())
		req, hostHdr, err := readRequest(s.br)
		if err != nil {
			if !errors.Is(err, io.EOF) && !isClosed(err) && s.m.endErr() == "" {
				var re *requestError
				if errors.As(err, &re) {
					writeRefusal(s.m.ctl(), Verdict{Reason: "egress: " + re.msg, Status: re.status}, false)
				}
			}
			return
		}
		_ = s.conn.SetReadDeadline(time.Time{})
		if req.Method == http.MethodConnect {
			s.connect(req)
			return
		}
		if !s.forward(req, hostHdr, up0, down0) {
			return
		}
	}
}

// requestError is a request the gateway cannot read, with the status to answer.
type requestError struct {
	status int
	msg    string
}

func (e *requestError) Error() string { return e.msg }

func isClosed(err error) bool {
	var ne net.Error
	return errors.Is(err, net.ErrClosed) || errors.As(err, &ne) && ne.Timeout() || errors.Is(err, errBudget)
}

// readRequest reads one request. The head is looked at before net/http parses it,
// because net/http drops the Host header of an absolute-form request, and a Host that
// differs from the URL is a request the gateway refuses (hostHdr returns it; "" when
// absent).
func readRequest(br *bufio.Reader) (*http.Request, string, error) {
	head, err := peekHead(br)
	if err != nil {
		return nil, "", err
	}
	hosts := 0
	hostHdr := ""
	lines := bytes.Split(head, []byte("\n"))
	for _, l := range lines[1:] {
		l = bytes.TrimRight(l, "\r")
		if len(l) > 0 && (l[0] == ' ' || l[0] == '\t') {
			return nil, "", &requestError{400, "the request has a folded header line, which the gateway does not accept"}
		}
		name, val, ok := bytes.Cut(l, []byte(":"))
		if ok && strings.EqualFold(string(name), "Host") {
			hosts++
			hostHdr = strings.TrimSpace(string(val))
		}
	}
	if hosts > 1 {
		return nil, "", &requestError{400, "the request has more than one Host header"}
	}
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil, "", &requestError{400, "the request could not be read as HTTP/1.1: " + err.Error()}
	}
	return req, hostHdr, nil
}

// peekHead returns the request head (up to the blank line) without consuming it.
func peekHead(br *bufio.Reader) ([]byte, error) {
	for {
		// All that is buffered, and then one byte more (which waits for the next read).
		b, err := br.Peek(br.Buffered())
		if err == nil {
			if i := bytes.Index(b, []byte("\r\n\r\n")); i >= 0 {
				return b[:i+2], nil
			}
			if i := bytes.Index(b, []byte("\n\n")); i >= 0 {
				return b[:i+1], nil
			}
			if br.Buffered() >= br.Size() {
				return nil, &requestError{431, fmt.Sprintf("the request head is longer than %d bytes", br.Size())}
			}
			b, err = br.Peek(br.Buffered() + 1)
		}
		if err != nil {
			if len(b) > 0 && errors.Is(err, io.EOF) {
				return nil, &requestError{400, "the connection ended inside a request head"}
			}
			if errors.Is(err, bufio.ErrBufferFull) {
				return nil, &requestError{431, fmt.Sprintf("the request head is longer than %d bytes", br.Size())}
			}
			return nil, err
		}
	}
}

// writeRefusal answers a refused request: the status and, as the body and (for CONNECT,
// whose body clients do not show) in the reason phrase, the sentence the model reads.
func writeRefusal(w io.Writer, v Verdict, connect bool) {
	status := v.Status
	if status == 0 {
		status = http.StatusForbidden
	}
	phrase := http.StatusText(status)
	if connect {
		phrase += " (" + printable(v.Reason, 300) + ")"
	}
	body := v.Reason + "\n"
	var b strings.Builder
	fmt.Fprintf(&b, "HTTP/1.1 %d %s\r\n", status, phrase)
	b.WriteString("Content-Type: text/plain; charset=utf-8\r\n")
	fmt.Fprintf(&b, "Content-Length: %d\r\n", len(body))
	fmt.Fprintf(&b, "Proxy-Status: toolhost-egress; error=%s\r\n", proxyStatusError(v))
	b.WriteString("Connection: close\r\n\r\n")
	b.WriteString(body)
	_, _ = io.WriteString(w, b.String())
}

// proxyStatusError is the RFC 9209 error type of a refusal.
func proxyStatusError(v Verdict) string {
	switch {
	case strings.HasPrefix(v.Rule, "always refused"):
		return "destination_ip_prohibited"
	case v.Rule == "no such host":
		return "dns_error"
	case v.Status == http.StatusBadGateway:
		return "destination_unavailable"
	case v.Status == http.StatusServiceUnavailable:
		return "proxy_internal_error"
	}
	return "http_request_denied"
}

// printable keeps a reason phrase on one line of visible ASCII.
func printable(s string, max int) string {
	b := make([]byte, 0, len(s))
	for _, r := range s {
		if len(b) >= max {
			break
		}
		switch {
		case r == '…':
			b = append(b, "..."...)
		case r >= 0x20 && r < 0x7f:
			b = append(b, byte(r))
		default:
			b = append(b, '?')
		}
	}
	return string(b)
}

// decision is one destination decided and, when allowed, resolved.
type decision struct {
	h     host
	port  int
	v     Verdict
	addrs []netip.Addr // allowed addresses, in the order to try
}

// decide runs the policy on a destination as the sandbox wrote it.
func (s *session) decide(ctx context.Context, hostText string, port int) decision {
	h, err := parseHost(hostText)
	if err != nil {
		return decision{h: h, port: port, v: refuse("not a name", fmt.Sprintf("%q is %v", printable(hostText, 100), err))}
	}
	d := decision{h: h, port: port}
	p := s.c.Policy()
	pd := p.checkHost(h, port)
	if pd.decided {
		d.v = pd.v
		return d
	}
	addrs, v := s.c.g.resolve(ctx, h)
	if v.Rule != "" {
		d.v = v
		return d
	}
	d.v = p.checkAddrs(h, port, pd, addrs, s.c.g.own.Has)
	if d.v.Allowed {
		d.addrs = addrs
		if s.c.budget.left() == 0 {
			d.v = Verdict{Rule: "budget used up", Reason: s.c.budgetReason(), Status: http.StatusForbidden}
		}
	}
	return d
}

// dial connects to the first address of d that answers.
func (s *session) dial(ctx context.Context, d decision) (net.Conn, netip.Addr, error) {
	return s.c.dialAddrs(ctx, d.addrs, d.port)
}

func (c *Client) dialAddrs(ctx context.Context, addrs []netip.Addr, port int) (net.Conn, netip.Addr, error) {
	var errs []error
	for _, a := range addrs {
		dctx, cancel := context.WithTimeout(ctx, c.g.cfg.DialTimeout)
		conn, err := c.g.dialer.DialContext(dctx, "tcp", netip.AddrPortFrom(a, uint16(port)).String())
		cancel()
		if err == nil {
			return conn, a, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	if len(errs) == 0 {
		return nil, netip.Addr{}, errors.New("no address to connect to")
	}
	return nil, netip.Addr{}, errors.Join(errs...)
}

// dialFailure is the verdict of an allowed destination that could not be reached.
func dialFailure(d decision, err error) Verdict {
	why := "it did not answer"
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		why = "the connection was refused"
	case errors.As(err, &ne) && ne.Timeout():
		why = "the connection timed out"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		why = "there is no route to it"
	}
	return Verdict{Allowed: true, Rule: d.v.Rule, Reason: fmt.Sprintf("egress: %s could not be reached: %s", dest(d.h, d.port), why), Status: http.StatusBadGateway}
}

// record starts the audit record of a destination.
func (s *session) record(proto string, d decision) *Record {
	return &Record{Sandbox: s.c.id, Command: s.info.Command, Proto: proto, Name: d.h.String(), Port: d.port, Rule: d.v.Rule}
}

// refused audits and remembers a refusal.
func (s *session) refused(r *Record, d decision, started time.Time) {
	r.Decision, r.Reason = Deny, d.v.Reason
	r.Time = time.Now()
	r.Micros = time.Since(started).Microseconds()
	name := d.h.String()
	if name == "" {
		name = printable(d.h.raw, 100)
	}
	s.c.refused.add(s.info.Command, name+":"+strconv.Itoa(d.port), d.v.Reason)
	s.c.audit(r)
}

// connect serves a CONNECT: decide, connect, answer 200, check the TLS server name, and
// splice (or, for an injected domain, terminate TLS and forward requests).
func (s *session) connect(req *http.Request) {
	started := time.Now()
	ctx := s.c.ctx
	hostText, port, err := splitHostPort(req.RequestURI, 0)
	if err != nil {
		writeRefusal(s.m.ctl(), Verdict{Reason: "egress: the CONNECT target must be host:port (" + err.Error() + ")", Status: 400}, true)
		return
	}
	d := s.decide(ctx, hostText, port)
	r := s.record("connect", d)
	if !d.v.Allowed {
		s.refused(r, d, started)
		writeRefusal(s.m.ctl(), d.v, true)
		return
	}
	s.tunnel(r, d, started, func() error {
		_, err := io.WriteString(s.m.ctl(), "HTTP/1.1 200 Connection established\r\n\r\n")
		return err
	}, func(v Verdict) { writeRefusal(s.m.ctl(), v, true) })
}

// tunnel joins the sandbox to an allowed destination: connect (a failure answers with
// fail), tell the client (ok), then splice, checking that a TLS client names the target,
// or terminate TLS for an injected domain.
func (s *session) tunnel(r *Record, d decision, started time.Time, ok func() error, fail func(Verdict)) {
	ctx := s.c.ctx
	up, addr, err := s.dial(ctx, d)
	if err != nil {
		v := dialFailure(d, err)
		r.Decision, r.Error = Allow, v.Reason
		s.finish(r, started, 0, 0)
		fail(v)
		return
	}
	r.Decision, r.Addr = Allow, addr.String()
	s.m.join(up)
	up0, down0 := s.m.counts()
	dst := d.h.String() + ":" + strconv.Itoa(d.port)
	s.m.spendFor(func() { s.c.refused.add(s.info.Command, dst, s.c.budgetReason()) })
	defer func() {
		s.m.spendFor(nil)
		u, dn := s.m.counts()
		if e := s.m.endErr(); e != "" && r.Error == "" {
			r.Error = e
		}
		s.finish(r, started, u-up0, dn-down0)
	}()
	if err := ok(); err != nil {
		up.Close()
		return
	}
	if inj := s.c.injection(d); inj != nil {
		up.Close() // the injector connects per request, through the transport
		r.Injected = inj.Header
		s.terminate(r, d, inj)
		return
	}
	// Downstream at once: a server that speaks first (SSH, SMTP) is not kept waiting for
	// the client.
	down := make(chan struct{})
	go func() { // owned by tunnel, which waits for it
		defer close(down)
		s.m.pipeDown(up)
	}()
	defer func() {
		<-down
		s.m.Conn.Close()
		up.Close()
	}()
	// Upstream: a TLS client must name the tunnel's destination.
	sni, isTLS, hello, err := peekHello(s.br, s.conn)
	if err != nil && !isTLS {
		up.Close() // the client went away before it said anything
		return
	}
	if isTLS {
		if reason := sniMismatch(d, sni, err); reason != "" {
			r.Decision, r.Rule, r.Reason = Deny, "TLS server name differs from the target", reason
			s.c.refused.add(s.info.Command, dst, reason)
			_, _ = s.m.ctl().Write(tlsAlertAccessDenied)
			up.Close()
			s.m.Conn.Close()
			return
		}
		if _, err := up.Write(hello); err != nil {
			up.Close()
			return
		}
	}
	s.m.pipeUp(s.br, up)
}

// sniMismatch is why a tunnel's ClientHello is refused, or "".
func sniMismatch(d decision, sni string, helloErr error) string {
	target := d.h.String()
	if helloErr != nil {
		return fmt.Sprintf("egress: the TLS handshake to %s:%d could not be read (%v)", target, d.port, helloErr)
	}
	if sni == "" {
		return "" // an address target, or a client that sends no name: nothing to compare
	}
	h, err := parseHost(sni)
	if err != nil || h.isAddr() || d.h.isAddr() || h.name != d.h.name {
		return fmt.Sprintf("egress: the TLS server name %q differs from the tunnel's destination %s; connect to the name you mean", printable(sni, 100), target)
	}
	return ""
}

func (s *session) finish(r *Record, started time.Time, up, down int64) {
	r.Time = time.Now()
	r.Micros = time.Since(started).Microseconds()
	r.BytesUp, r.BytesDown = up, down
	if r.Decision == "" {
		r.Decision = Allow
	}
	s.c.audit(r)
}

// hopHeaders are meant for one connection and never forwarded (RFC 9110 7.6.1), with the
// proxy's own.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// forward serves one absolute-form request; false ends the connection.
func (s *session) forward(req *http.Request, hostHdr string, up0, down0 int64) bool {
	started := time.Now()
	defer req.Body.Close()
	if req.URL.Scheme != "http" || req.URL.Host == "" {
		v := Verdict{Reason: "egress: the gateway forwards absolute http:// URLs (send https through CONNECT, as HTTPS_PROXY does); got " + printable(req.RequestURI, 200), Status: 400}
		writeRefusal(s.m.ctl(), v, false)
		return false
	}
	hostText, port, err := splitHostPort(req.URL.Host, 80)
	if err != nil {
		writeRefusal(s.m.ctl(), Verdict{Reason: "egress: bad host in the URL: " + err.Error(), Status: 400}, false)
		return false
	}
	if hostHdr != "" && !sameAuthority(hostHdr, hostText, port) {
		d := decision{h: host{raw: hostText}, port: port}
		if h, err := parseHost(hostText); err == nil {
			d.h = h
		}
		d.v = refuse("Host header differs from the URL", fmt.Sprintf("the request's Host header %q differs from its URL's host %s; send the request to the host you mean", printable(hostHdr, 100), printable(req.URL.Host, 100)))
		s.refused(s.record("http", d), d, started)
		writeRefusal(s.m.ctl(), d.v, false)
		return false
	}
	ctx := s.c.ctx
	d := s.decide(ctx, hostText, port)
	r := s.record("http", d)
	if !d.v.Allowed {
		s.refused(r, d, started)
		writeRefusal(s.m.ctl(), d.v, false)
		return false // the refusal said Connection: close
	}
	dst := d.h.String() + ":" + strconv.Itoa(d.port)
	s.m.spendFor(func() { s.c.refused.add(s.info.Command, dst, s.c.budgetReason()) })
	keep := s.roundTrip(ctx, req, d, r, "http", s.m)
	s.m.spendFor(nil)
	u, dn := s.m.counts()
	if e := s.m.endErr(); e != "" && r.Error == "" {
		r.Error = e
	}
	s.finish(r, started, u-up0, dn-down0)
	return keep
}

// sameAuthority: the Host header names the same host and port as the URL.
func sameAuthority(hostHdr, urlHost string, port int) bool {
	hh, hp, err := splitHostPort(hostHdr, port)
	if err != nil || hp != port {
		return false
	}
	a, err1 := parseHost(hh)
	b, err2 := parseHost(urlHost)
	return err1 == nil && err2 == nil && a.String() == b.String()
}

// destKey carries a request's decision to the transport's dial.
type destKey struct{}

// roundTrip sends an allowed request upstream and writes the response to w; false ends
// the connection. scheme is "http", or "https" for an injected domain, whose header it
// adds (inside TLS the gateway terminated; w is that TLS connection then).
func (s *session) roundTrip(ctx context.Context, req *http.Request, d decision, r *Record, scheme string, w io.Writer) bool {
	out := req.Clone(ctx)
	out.RequestURI = ""
	out.URL.Scheme = scheme
	out.URL.Host = hostPort(d) // what the transport dials (and pools by)
	out.Host = d.h.String()    // what the server is told: the name, its port only when not the scheme's
	if d.h.isAddr() && d.h.addr.Is6() {
		out.Host = "[" + out.Host + "]"
	}
	if !(scheme == "http" && d.port == 80 || scheme == "https" && d.port == 443) {
		out.Host += ":" + strconv.Itoa(d.port)
	}
	out.Close = false
	upgrade := upgradeType(req.Header)
	for _, h := range hopHeaders {
		out.Header.Del(h)
	}
	for _, f := range connectionTokens(req.Header) {
		out.Header.Del(f)
	}
	if upgrade != "" && scheme == "http" {
		out.Header.Set("Connection", "Upgrade")
		out.Header.Set("Upgrade", upgrade)
	}
	if scheme == "https" && s.c.inject != nil {
		if inj := s.c.injection(d); inj != nil {
			out.Header.Set(inj.Header, inj.Value)
		}
	}
	if len(req.Header.Values("Expect")) > 0 && strings.EqualFold(req.Header.Get("Expect"), "100-continue") {
		out.Header.Del("Expect")
		if _, err := io.WriteString(w, "HTTP/1.1 100 Continue\r\n\r\n"); err != nil {
			return false
		}
	}
	if req.ContentLength == 0 {
		out.Body = nil
	}
	var remote string
	trace := &httptrace.ClientTrace{GotConn: func(ci httptrace.GotConnInfo) {
		if a := ci.Conn.RemoteAddr(); a != nil {
			remote = a.String()
		}
	}}
	out = out.WithContext(httptrace.WithClientTrace(context.WithValue(ctx, destKey{}, d), trace))
	resp, err := s.c.transport.RoundTrip(out)
	if ap, perr := netip.ParseAddrPort(remote); perr == nil {
		r.Addr = ap.Addr().String()
	}
	if err != nil {
		var re *dialRefusal
		v := dialFailure(d, err)
		if errors.As(err, &re) {
			v = re.v
			r.Decision, r.Rule = Deny, re.v.Rule
		}
		if s.m.endErr() != "" {
			return false
		}
		r.Error = v.Reason
		if r.Decision == Deny {
			r.Reason = v.Reason
			s.c.refused.add(s.info.Command, d.h.String()+":"+strconv.Itoa(d.port), v.Reason)
		}
		writeRefusal(w, v, false)
		return false
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		if scheme != "http" {
			return false
		}
		return s.switchProtocols(resp)
	}
	for _, h := range hopHeaders {
		resp.Header.Del(h)
	}
	for _, f := range connectionTokens(resp.Header) {
		resp.Header.Del(f)
	}
	resp.ProtoMajor, resp.ProtoMinor, resp.Proto = 1, 1, "HTTP/1.1"
	if resp.ContentLength < 0 && bodyAllowed(req.Method, resp.StatusCode) {
		resp.TransferEncoding = []string{"chunked"}
	} else {
		resp.TransferEncoding = nil
	}
	resp.Close = req.Close
	// The body is copied through a large buffer: the response's body reads go straight to
	// the upstream socket for as much as the buffer has room for (the transport's reader
	// passes large reads through), so a bulk download costs a read and a write per
	// 256 KiB, not per 32 KiB (the plain-http forward proxy against direct: 0.6 with 32 KiB
	// at load 35; BenchmarkGatewayForwardThroughput).
	bw := respWriters.Get().(*bufio.Writer)
	bw.Reset(w)
	defer func() { bw.Reset(nil); respWriters.Put(bw) }()
	if err := resp.Write(bw); err != nil {
		return false
	}
	if err := bw.Flush(); err != nil {
		return false
	}
	return !req.Close && !resp.Close
}

// respWriters are the buffered writers forwarded responses are written through.
var respWriters = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 256<<10) }}

// hostPort is the authority of an allowed destination, as the transport dials it.
func hostPort(d decision) string {
	return net.JoinHostPort(d.h.String(), strconv.Itoa(d.port))
}

func bodyAllowed(method string, status int) bool {
	return method != http.MethodHead && status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

func upgradeType(h http.Header) string {
	for _, t := range connectionTokens(h) {
		if strings.EqualFold(t, "Upgrade") {
			return h.Get("Upgrade")
		}
	}
	return ""
}

func connectionTokens(h http.Header) []string {
	var out []string
	for _, v := range h.Values("Connection") {
		for _, f := range strings.Split(v, ",") {
			if f = textproto.TrimString(f); f != "" {
				out = append(out, f)
			}
		}
	}
	return out
}

// switchProtocols passes a 101 answer on and joins the two streams (a WebSocket over a
// plain HTTP proxy request).
func (s *session) switchProtocols(resp *http.Response) bool {
	rwc, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		return false
	}
	defer rwc.Close()
	resp.Body = nil
	var b bytes.Buffer
	fmt.Fprintf(&b, "HTTP/1.1 101 %s\r\n", http.StatusText(http.StatusSwitchingProtocols))
	_ = resp.Header.Write(&b)
	b.WriteString("\r\n")
	if _, err := s.m.ctl().Write(b.Bytes()); err != nil {
		return false
	}
	up := &rwcConn{rwc: rwc}
	s.m.join(up)
	splice(s.m, s.br, up)
	return false
}

// rwcConn lets an upgraded response body be spliced like a connection.
type rwcConn struct {
	net.Conn // nil: only Read, Write and Close are used
	rwc      io.ReadWriteCloser
}

func (c *rwcConn) Read(p []byte) (int, error)  { return c.rwc.Read(p) }
func (c *rwcConn) Write(p []byte) (int, error) { return c.rwc.Write(p) }
func (c *rwcConn) Close() error                { return c.rwc.Close() }

// dialRefusal: at connect time, an address the policy refuses.
type dialRefusal struct{ v Verdict }

func (e *dialRefusal) Error() string { return e.v.Reason }

// newTransport makes the client's upstream transport: it dials only what a request's
// decision allowed, deciding the addresses again for a connection it makes later.
func (c *Client) newTransport() *http.Transport {
	tlsCfg := &tls.Config{RootCAs: c.g.cfg.RootCAs, MinVersion: tls.VersionTLS12}
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           c.transportDial,
		TLSClientConfig:       tlsCfg,
		TLSHandshakeTimeout:   handshakeTimeout,
		DisableCompression:    true,
		MaxIdleConns:          64,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 0, // long polls are fine; the idle timeout bounds the client side
		ExpectContinueTimeout: 0,
		ForceAttemptHTTP2:     false,
	}
}

// transportDial connects for the transport: to the addresses of the request's decision,
// checked, or, for a destination it dials without one, decided from scratch.
func (c *Client) transportDial(ctx context.Context, network, addr string) (net.Conn, error) {
	d, ok := ctx.Value(destKey{}).(decision)
	if !ok || hostPort(d) != addr {
		hs, port, err := splitHostPort(addr, 0)
		if err != nil {
			return nil, err
		}
		s := &session{c: c}
		d = s.decide(ctx, hs, port)
		if !d.v.Allowed {
			return nil, &dialRefusal{d.v}
		}
	}
	conn, _, err := c.dialAddrs(ctx, d.addrs, d.port)
	return conn, err
}
