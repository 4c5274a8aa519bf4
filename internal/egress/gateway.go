// Package egress is the door in the sandbox's wall: a gateway through which a sandbox
// reaches the destinations its policy names and nothing else.
//
// A sandbox has no route anywhere. Its only way out is a connection to the gateway, which
// speaks three protocols on one stream, told apart by the first byte: an HTTP forward
// proxy (absolute-form requests), HTTP CONNECT tunnels, and SOCKS5 with domain names.
// For every destination the gateway
//
//   - normalizes the name the sandbox wrote (case, trailing dot, IDNA; every spelling of
//     an IP address is an address) and decides it against the policy (deny wins; domains,
//     *.domain wildcards, domain:port, CIDRs; ports 80 and 443 by default);
//   - resolves the name itself, and checks every address it got just before it connects:
//     loopback, private, link-local (every cloud's metadata service), multicast,
//     unspecified, reserved and the host's own addresses are refused whatever name led
//     there;
//   - checks that a TLS client's server name agrees with the CONNECT or SOCKS target;
//   - bounds the sandbox: bytes per session (Budget), connections at once, an idle
//     timeout per connection;
//   - terminates TLS only for the domains it injects a credential into (a header whose
//     value never enters the sandbox), with a CA of that sandbox's own;
//   - audits every connection (sandbox, command, name, address, port, decision, the rule
//     that decided, bytes each way, duration), and keeps what it refused per command so
//     a tool result can tell the model.
//
// A refusal answers with a message written for the model that made the request: what was
// refused, why, and what to do (ask the operator to add it).
//
// The gateway is host code and treats everything the sandbox sends as hostile: every
// read has a deadline, every buffer a bound, and nothing it says is trusted beyond the
// connection it came on. Which sandbox a connection belongs to is decided by the caller of
// ServeConn (the socket it arrived on), never by the sandbox.
package egress

import (
	"bufio"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Defaults of Limits and Config.
const (
	DefaultMaxConns    = 256
	DefaultIdleTimeout = 5 * time.Minute
	DefaultDialTimeout = 10 * time.Second
	// handshakeTimeout bounds what the sandbox must send before anything is decided: a
	// request head, a SOCKS5 greeting, a TLS ClientHello.
	handshakeTimeout = 30 * time.Second
	// maxHead bounds an HTTP request head (request line and headers): the size of the
	// buffer it is read into.
	maxHead = 32 << 10
)

// Config configures a Gateway.
type Config struct {
	// Resolver resolves names (sandbox.egress.resolver); nil is SystemResolver.
	Resolver Resolver
	// CacheTTL keeps resolved addresses for a while (they are checked again at every
	// connect); 0 is 10 s, negative disables the cache.
	CacheTTL time.Duration
	// Dialer connects upstream; nil is a net.Dialer.
	Dialer Dialer
	// DialTimeout bounds one connect; 0 is DefaultDialTimeout.
	DialTimeout time.Duration
	// HostAddrs knows this host's own addresses, which are refused whatever the policy
	// says: those of the network namespace Dialer dials from. nil is the process's own
	// namespace's, watched once for every gateway of the process. The caller closes a
	// HostAddrs it gives, after the gateway's last client.
	HostAddrs *HostAddrs
	// RootCAs verify upstream servers where the gateway itself speaks TLS to them (the
	// domains it injects credentials into); nil is the host's roots.
	RootCAs *x509.CertPool
	// Audit receives one record per connection (per request for plain HTTP). It must be
	// safe for concurrent use and must not block for long.
	Audit func(*Record)
	// Logger logs the gateway's own troubles; nil discards.
	Logger *slog.Logger
}

// Gateway serves the connections of many sandboxes; each is a Client with its own policy.
type Gateway struct {
	cfg      Config
	log      *slog.Logger
	resolver Resolver
	dialer   Dialer
	own      *HostAddrs
}

// New makes a gateway.
func New(cfg Config) *Gateway {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.HostAddrs == nil {
		own, err := processHostAddrs()
		if err != nil {
			// Netlink refused (a seccomp filter, say): the interfaces' list, read again
			// at most every second.
			cfg.Logger.Warn("the host's addresses are read every second", "err", err)
			own = pollHostAddrs(interfaceAddrs, time.Second)
		}
		cfg.HostAddrs = own
	}
	g := &Gateway{cfg: cfg, log: cfg.Logger, own: cfg.HostAddrs}
	g.resolver = cfg.Resolver
	if g.resolver == nil {
		g.resolver = SystemResolver{}
	}
	switch {
	case cfg.CacheTTL == 0:
		g.resolver = &cachingResolver{r: g.resolver, ttl: 10 * time.Second}
	case cfg.CacheTTL > 0:
		g.resolver = &cachingResolver{r: g.resolver, ttl: cfg.CacheTTL}
	}
	g.dialer = cfg.Dialer
	if g.dialer == nil {
		g.dialer = &net.Dialer{}
	}
	return g
}

// Decide decides a destination by the policy alone, resolving nothing: an address is
// checked as written, a name by the rules that name it (the addresses it resolves to are
// checked by the gateway at connect time). hostport is "name:port" or "address:port".
func Decide(p *Policy, hostport string) Verdict {
	hs, port, err := splitHostPort(hostport, 0)
	if err != nil {
		return Verdict{Rule: "malformed destination", Reason: "egress: " + err.Error(), Status: 400}
	}
	h, err := parseHost(hs)
	if err != nil {
		return refuse("not a name", fmt.Sprintf("%q is %v", hs, err))
	}
	pd := p.checkHost(h, port)
	if pd.decided || !h.isAddr() {
		return pd.v
	}
	return p.checkAddrs(h, port, pd, []netip.Addr{h.addr}, nil)
}

// Check resolves and decides a destination without connecting: `toolhost policy test`
// and the doctor ask it. hostport is "name:port" (or an address); the verdict names the
// rule that decided.
func (g *Gateway) Check(ctx context.Context, p *Policy, hostport string) (Verdict, []netip.Addr) {
	hs, port, err := splitHostPort(hostport, 0)
	if err != nil {
		return Verdict{Rule: "malformed destination", Reason: "egress: " + err.Error(), Status: 400}, nil
	}
	h, err := parseHost(hs)
	if err != nil {
		return refuse("not a name", fmt.Sprintf("%q is %v", hs, err)), nil
	}
	pd := p.checkHost(h, port)
	if pd.decided {
		return pd.v, nil
	}
	addrs, v := g.resolve(ctx, h)
	if !v.Allowed && v.Rule != "" {
		return v, nil
	}
	return p.checkAddrs(h, port, pd, addrs, g.own.Has), addrs
}

// Lookup resolves a name with the gateway's resolver (the doctor's health check).
func (g *Gateway) Lookup(ctx context.Context, name string) ([]netip.Addr, error) {
	h, err := parseHost(name)
	if err != nil {
		return nil, err
	}
	if h.isAddr() {
		return []netip.Addr{h.addr}, nil
	}
	return g.resolver.LookupNetIP(ctx, h.name)
}

// resolve returns a host's addresses: the literal, or what the resolver says.
func (g *Gateway) resolve(ctx context.Context, h host) ([]netip.Addr, Verdict) {
	if h.isAddr() {
		return []netip.Addr{h.addr}, Verdict{}
	}
	addrs, err := g.resolver.LookupNetIP(ctx, h.name)
	if err != nil {
		if errors.Is(err, ErrNoSuchHost) {
			return nil, Verdict{Rule: "no such host", Reason: fmt.Sprintf("egress: %s does not exist (the gateway's resolver found no address for it)", h.name), Status: 502}
		}
		g.log.Warn("the resolver failed", "name", h.name, "err", err)
		return nil, Verdict{Rule: "resolver failed", Reason: fmt.Sprintf("egress: the name %s could not be resolved: %s; try again, and if it keeps failing ask the operator to check sandbox.egress.resolver", h.name, resolveFailure(err)), Status: 502}
	}
	return addrs, Verdict{}
}

// resolveFailure says why a lookup failed as far as the model can act on it: the
// server's address and the error's own text are the host's (its log has them).
func resolveFailure(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "the gateway's DNS server did not answer in time"
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EHOSTUNREACH):
		return "the gateway's DNS server could not be reached"
	}
	return "the gateway's DNS server failed"
}

// Limits bound one sandbox's use of the gateway; zero fields take the defaults.
type Limits struct {
	// MaxConns is how many connections the sandbox may have open at once, and how many
	// more may wait to send their first byte: past that the oldest that sent nothing is
	// closed.
	MaxConns int
	// IdleTimeout ends a connection with no bytes either way for this long.
	IdleTimeout time.Duration
}

// Injection adds a header to every request to one domain: a credential the sandbox uses
// without ever holding it. The gateway terminates TLS for that domain only.
type Injection struct {
	// Domain is the exact name (normalized like policy entries); no wildcard.
	Domain string
	// Header is the header's name, Value its value (the secret).
	Header, Value string
}

// ClientConfig configures the gateway's side of one sandbox.
type ClientConfig struct {
	// Sandbox names the sandbox in audit records and logs; Project its project.
	Sandbox string
	Project string
	// Policy decides its destinations (Client.SetPolicy changes it at run time).
	Policy *Policy
	// Budget bounds the bytes it sends and receives; shared by the sandboxes of one
	// session (a rotation's successor spends the same budget). nil is unlimited.
	Budget *Budget
	Limits Limits
	// Inject lists the credentials to add, by domain.
	Inject []Injection
}

// Client is the gateway's side of one sandbox: its policy, its bounds, its connections.
type Client struct {
	g       *Gateway
	id      string
	project string
	policy  atomic.Pointer[Policy]
	budget  *Budget
	limits  Limits
	inject  *injector // nil without injections

	transport *http.Transport // upstream for plain HTTP and injected HTTPS

	ctx    context.Context // ends with Close
	cancel context.CancelFunc
	slots  chan struct{} // one per open connection

	mu      sync.Mutex
	closed  bool
	conns   map[net.Conn]struct{}
	waiting []waiter // the connections that have sent nothing yet, oldest first
	wg      sync.WaitGroup
	refused refusals

	allowed, denied atomic.Int64
}

// NewClient makes the gateway's side of one sandbox.
func (g *Gateway) NewClient(cfg ClientConfig) (*Client, error) {
	if cfg.Policy == nil {
		return nil, errors.New("egress client: no policy")
	}
	if cfg.Limits.MaxConns <= 0 {
		cfg.Limits.MaxConns = DefaultMaxConns
	}
	if cfg.Limits.IdleTimeout <= 0 {
		cfg.Limits.IdleTimeout = DefaultIdleTimeout
	}
	c := &Client{
		g: g, id: cfg.Sandbox, project: cfg.Project, budget: cfg.Budget, limits: cfg.Limits,
		slots: make(chan struct{}, cfg.Limits.MaxConns),
		conns: map[net.Conn]struct{}{},
	}
	c.policy.Store(cfg.Policy)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	if len(cfg.Inject) > 0 {
		inj, err := newInjector(cfg.Sandbox, cfg.Inject)
		if err != nil {
			return nil, fmt.Errorf("egress client for %s: %w", cfg.Sandbox, err)
		}
		c.inject = inj
	}
	c.transport = c.newTransport()
	return c, nil
}

// Policy is the policy in force.
func (c *Client) Policy() *Policy { return c.policy.Load() }

// SetPolicy replaces the policy for new connections and requests; open tunnels stay.
func (c *Client) SetPolicy(p *Policy) {
	c.policy.Store(p)
	c.transport.CloseIdleConnections()
}

// CACert is the PEM certificate of this sandbox's CA, which the sandbox must trust for
// the injected domains; nil without injections.
func (c *Client) CACert() []byte {
	if c.inject == nil {
		return nil
	}
	return c.inject.caPEM
}

// Stats counts the connections (and plain HTTP requests) allowed and refused so far.
func (c *Client) Stats() (allowed, refused int64) { return c.allowed.Load(), c.denied.Load() }

// ConnInfo is what the caller of ServeConn knows about a connection's origin.
type ConnInfo struct {
	// Command names the command that made the connection (the agent's attribution), ""
	// when unknown.
	Command string
}

// ServeConn serves one connection from the sandbox until it ends, the sandbox's limits
// end it, or the client is closed; it closes conn.
func (c *Client) ServeConn(conn net.Conn, info ConnInfo) {
	if !c.track(conn, info) {
		conn.Close()
		return
	}
	defer c.untrack(conn)
	defer conn.Close()
	s := &session{c: c, conn: conn, info: info}
	s.serve()
}

// Serve accepts connections from l and serves each (with an empty ConnInfo) until l
// fails or the client is closed; then it closes l. For tests and for providers whose
// sandboxes reach the gateway through a listener of their own.
func (c *Client) Serve(l net.Listener) error {
	stop := context.AfterFunc(c.ctx, func() { l.Close() })
	defer stop()
	defer l.Close()
	for {
		conn, err := l.Accept()
		if err != nil {
			if c.ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			conn.Close()
			return nil
		}
		c.wg.Add(1)
		c.mu.Unlock()
		go func() { // counted in c.wg; Close closes conn and waits
			defer c.wg.Done()
			c.ServeConn(conn, ConnInfo{})
		}()
	}
}

// waiter is a connection that has sent nothing yet.
type waiter struct {
	conn net.Conn
	info ConnInfo
}

// track counts conn among the client's connections and among those that have sent
// nothing yet; when MaxConns of those wait already, the oldest is closed (it ends its
// ServeConn), so a flood of connections that send nothing costs the host a bounded
// number of them and never keeps a request from being served.
func (c *Client) track(conn net.Conn, info ConnInfo) bool {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return false
	}
	c.conns[conn] = struct{}{}
	c.wg.Add(1)
	var oldest waiter
	if len(c.waiting) >= c.limits.MaxConns {
		oldest = c.waiting[0]
		c.waiting = slices.Delete(c.waiting, 0, 1)
	}
	c.waiting = append(c.waiting, waiter{conn: conn, info: info})
	c.mu.Unlock()
	if oldest.conn != nil {
		oldest.conn.Close()
		c.idleClosed(oldest.info)
	}
	return true
}

// spoke takes conn off the connections that have sent nothing: it sent its first byte,
// or it ended.
func (c *Client) spoke(conn net.Conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i := slices.IndexFunc(c.waiting, func(w waiter) bool { return w.conn == conn }); i >= 0 {
		c.waiting = slices.Delete(c.waiting, i, i+1)
	}
}

// idleClosed audits the close of a connection that sent nothing while newer ones came,
// and tells its command why.
func (c *Client) idleClosed(info ConnInfo) {
	reason := fmt.Sprintf("egress: more than %d connections of this sandbox to the gateway sent nothing, so the oldest of them were closed; send the request as soon as the connection is open, and close connections you do not use", c.limits.MaxConns)
	c.refused.add(info.Command, "connections that sent nothing", reason)
	c.audit(&Record{Time: time.Now(), Sandbox: c.id, Command: info.Command, Decision: Deny, Rule: "idle connections", Reason: reason})
}

func (c *Client) untrack(conn net.Conn) {
	c.spoke(conn)
	c.mu.Lock()
	delete(c.conns, conn)
	c.mu.Unlock()
	c.wg.Done()
}

// Close ends every connection of the sandbox and waits for them.
func (c *Client) Close() {
	c.mu.Lock()
	c.closed = true
	for conn := range c.conns {
		conn.Close()
	}
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
	c.transport.CloseIdleConnections()
}

// Budget bounds the bytes a session's sandboxes move through the gateway, both ways
// together (sandbox.egress.max_bytes).
type Budget struct {
	max  int64
	used atomic.Int64
}

// NewBudget makes a budget of max bytes; max <= 0 is unlimited.
func NewBudget(max int64) *Budget { return &Budget{max: max} }

// Max is the bound; 0 for unlimited.
func (b *Budget) Max() int64 {
	if b == nil || b.max <= 0 {
		return 0
	}
	return b.max
}

// Used is how many bytes were spent.
func (b *Budget) Used() int64 {
	if b == nil {
		return 0
	}
	return b.used.Load()
}

// take spends up to n bytes and returns how many the budget had room for.
func (b *Budget) take(n int) int {
	if b == nil || b.max <= 0 || n == 0 {
		return n
	}
	for {
		cur := b.used.Load()
		room := b.max - cur
		if room <= 0 {
			return 0
		}
		k := min(int64(n), room)
		if b.used.CompareAndSwap(cur, cur+k) {
			return int(k)
		}
	}
}

// give returns n bytes taken and not used.
func (b *Budget) give(n int) {
	if b == nil || b.max <= 0 {
		return
	}
	b.used.Add(-int64(n))
}

// left is how many bytes remain; -1 for unlimited.
func (b *Budget) left() int64 {
	if b == nil || b.max <= 0 {
		return -1
	}
	return max(0, b.max-b.used.Load())
}

// errBudget: the session's budget is spent.
var errBudget = errors.New("the session's network budget is used up")

func (c *Client) budgetReason() string {
	return fmt.Sprintf("egress: this session's network budget of %s (sandbox.egress.max_bytes) is used up; nothing more can be downloaded or sent in this session",
		humanBytes(c.budget.Max()))
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return strconv.FormatInt(n>>30, 10) + " GiB"
	case n >= 1<<20:
		return strconv.FormatFloat(float64(n)/(1<<20), 'f', -1, 64) + " MiB"
	case n >= 1<<10:
		return strconv.FormatFloat(float64(n)/(1<<10), 'f', -1, 64) + " KiB"
	}
	return strconv.FormatInt(n, 10) + " bytes"
}

// Record is the audit of one connection (one request, for plain HTTP).
type Record struct {
	Time    time.Time `json:"time"` // when it ended
	Sandbox string    `json:"sandbox"`
	Project string    `json:"project,omitempty"`
	Command string    `json:"command,omitempty"`
	// Proto is how the sandbox asked: "http" (a forward request), "connect", "socks5".
	Proto string `json:"proto"`
	// Name is the destination as decided (normalized name, or address); Addr the address
	// connected to; Port the port.
	Name string `json:"name"`
	Addr string `json:"addr,omitempty"`
	Port int    `json:"port,omitempty"`
	// Decision is "allow" or "deny"; Rule the rule that decided; Reason, for a refusal,
	// what the sandbox was told.
	Decision string `json:"decision"`
	Rule     string `json:"rule"`
	Reason   string `json:"reason,omitempty"`
	// Error is why an allowed connection failed or was cut (unreachable, the budget).
	Error string `json:"error,omitempty"`
	// Injected names the header the gateway added (never its value).
	Injected string `json:"injected,omitempty"`
	// BytesUp went from the sandbox, BytesDown to it.
	BytesUp   int64 `json:"bytes_up"`
	BytesDown int64 `json:"bytes_down"`
	Micros    int64 `json:"us"`
}

// Decisions of a Record.
const (
	Allow = "allow"
	Deny  = "deny"
)

func (c *Client) audit(r *Record) {
	r.Project = c.project
	if r.Decision == Deny {
		c.denied.Add(1)
	} else {
		c.allowed.Add(1)
	}
	if c.g.cfg.Audit != nil {
		c.g.cfg.Audit(r)
	}
}

// session serves one connection.
type session struct {
	c    *Client
	conn net.Conn
	info ConnInfo
	m    *meter // conn, counted and bounded
	br   *bufio.Reader
}

func (s *session) serve() {
	c := s.c
	s.m = newMeter(s.conn, c.budget, c.limits.IdleTimeout)
	defer s.m.stop()
	s.br = bufio.NewReaderSize(s.m, maxHead)
	_ = s.conn.SetReadDeadline(time.Now().Add(handshakeTimeout))
	first, err := s.br.Peek(1)
	c.spoke(s.conn)
	if err != nil {
		return
	}
	// One slot per connection: past the limit the connection is refused in its own
	// protocol, so the client reads why.
	select {
	case c.slots <- struct{}{}:
		defer func() { <-c.slots }()
	default:
		reason := fmt.Sprintf("egress: %d connections of this sandbox are open already (the limit); close some and try again", c.limits.MaxConns)
		s.refuseEarly(first[0], reason)
		return
	}
	switch first[0] {
	case socks5Version:
		s.socks()
	case socks4Version:
		s.refuseSOCKS4()
	default:
		s.http()
	}
}

// refuseSOCKS4 answers a SOCKS4 request at once with SOCKS4's "rejected": it carries no
// name (4a's name is optional), so it is not a protocol the policy can be applied to.
func (s *session) refuseSOCKS4() {
	reason := "egress: SOCKS4 is not supported; use SOCKS5 with names (socks5h://) or HTTP CONNECT"
	r := &Record{Time: time.Now(), Sandbox: s.c.id, Command: s.info.Command, Proto: "socks4", Decision: Deny, Rule: "SOCKS4 not supported", Reason: reason}
	s.c.refused.add(s.info.Command, "a SOCKS4 request", reason)
	s.c.audit(r)
	_, _ = s.m.ctl().Write([]byte{0, socks4Rejected, 0, 0, 0, 0, 0, 0})
}

// refuseEarly answers a connection over the limit, in the protocol it started.
func (s *session) refuseEarly(first byte, reason string) {
	r := &Record{Time: time.Now(), Sandbox: s.c.id, Command: s.info.Command, Proto: "http", Decision: Deny, Rule: "too many connections", Reason: reason}
	if first == socks5Version {
		r.Proto = "socks5"
	}
	s.c.refused.add(s.info.Command, "more connections", reason)
	s.c.audit(r)
	if first == socks5Version {
		_, _ = s.conn.Write([]byte{socks5Version, 0xff}) // no acceptable method: the client stops
	} else {
		writeRefusal(s.conn, Verdict{Reason: reason, Status: http.StatusServiceUnavailable}, false)
	}
}
