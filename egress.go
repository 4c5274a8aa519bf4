package toolhost

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/toolhost/toolhost/audit"
	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/egress"
)

// egressNet is what the gateway dials (and asks its DNS server through), and the host
// addresses it refuses; by default this machine's network. Tests give it their own
// internet (internal/testnet).
type egressNet struct {
	dial      func(ctx context.Context, network, addr string) (net.Conn, error)
	hostAddrs *egress.HostAddrs
}

// gatewayState is the Toolhost's egress gateway, made with the first session that needs
// it.
type gatewayState struct {
	once sync.Once
	g    *egress.Gateway
	host *egress.Policy
	// trust is sandbox.egress.ca_file's certificates, which sandboxes trust too; roots
	// are the host's roots with them, which verify the servers the host itself talks to
	// through the gateway (web fetches); nil without a CA file: the host's roots.
	trust  []byte
	roots  *x509.CertPool
	inject []egress.Injection
	err    error

	mu    sync.Mutex
	stats map[string]*egressStats // by project
}

// egressStats counts a project's connections through the gateway.
type egressStats struct {
	Allowed, Refused atomic.Int64
}

// gateway makes (once) and returns the egress gateway.
func (t *Toolhost) gateway() (*gatewayState, error) {
	s := &t.egress
	s.once.Do(func() { s.err = t.makeGateway(s) })
	return s, s.err
}

func (t *Toolhost) makeGateway(s *gatewayState) error {
	cfg := &t.cfg.Sandbox.Egress
	var err error
	if s.host, err = t.cfg.hostPolicy(); err != nil {
		return fmt.Errorf("sandbox.egress: %w", err)
	}
	gc := egress.Config{Logger: t.opts.log.With("component", "egress"), Audit: t.egressAudit}
	// Without a CA file the roots stay nil, the host's own, which crypto/tls loads at the
	// first TLS handshake: parsing the system's roots costs ~20 ms of CPU, which a
	// session that never speaks TLS from the host (every one-shot call) need not pay.
	var roots *x509.CertPool
	if cfg.CAFile != "" {
		if roots, err = x509.SystemCertPool(); err != nil || roots == nil {
			roots = x509.NewCertPool()
		}
		b, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return fmt.Errorf("sandbox.egress.ca_file: %w", err)
		}
		if !roots.AppendCertsFromPEM(b) {
			return fmt.Errorf("sandbox.egress.ca_file %s: no PEM certificate in it", cfg.CAFile)
		}
		s.trust = pemOnly(b)
	}
	if n := t.opts.egressNet; n != nil {
		gc.HostAddrs = n.hostAddrs
		gc.Dialer = dialerFunc(n.dial)
	}
	gc.RootCAs = roots
	s.roots = roots
	server, err := parseResolver(cfg.Resolver)
	if err != nil {
		return err
	}
	if server.IsValid() {
		gc.Resolver = &egress.DNSResolver{Server: server, Dialer: gc.Dialer}
	}
	for i, in := range cfg.Inject {
		v, err := secretValue("the secret", in.Secret)
		if err != nil {
			return fmt.Errorf("sandbox.egress.inject[%d] (%s): %w", i, in.Domain, err)
		}
		s.inject = append(s.inject, egress.Injection{Domain: in.Domain, Header: in.Header, Value: v})
	}
	s.g = egress.New(gc)
	t.opts.log.Debug("sandbox network", "mode", t.cfg.Sandbox.Network, "preset", s.host.Preset(),
		"allow", strings.Join(s.host.Allowed(), ","), "ports", s.host.Ports(), "resolver", cfg.Resolver,
		"injected_domains", len(s.inject))
	return nil
}

// pemOnly keeps the certificate blocks of a PEM file (never a key that sits beside them).
func pemOnly(b []byte) []byte {
	var out []byte
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return out
		}
		if blk.Type == "CERTIFICATE" {
			out = append(out, pem.EncodeToMemory(blk)...)
		}
	}
}

type dialerFunc func(ctx context.Context, network, addr string) (net.Conn, error)

func (f dialerFunc) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return f(ctx, network, addr)
}

// egressAudit turns the gateway's records into audit records and counts them per project.
func (t *Toolhost) egressAudit(r *egress.Record) {
	s := &t.egress
	if r.Project != "" {
		s.mu.Lock()
		if s.stats == nil {
			s.stats = map[string]*egressStats{}
		}
		st := s.stats[r.Project]
		if st == nil {
			st = &egressStats{}
			s.stats[r.Project] = st
		}
		s.mu.Unlock()
		if r.Decision == egress.Deny {
			st.Refused.Add(1)
		} else {
			st.Allowed.Add(1)
		}
	}
	sink := t.sink
	if sink == nil {
		return
	}
	why := r.Rule
	msg := r.Reason
	if msg == "" {
		msg = r.Error
	}
	sink.Record(&audit.Record{
		Time: r.Time, Sandbox: r.Sandbox, Cap: audit.CapEgress, Op: r.Proto,
		Dest: r.Name, Addr: r.Addr, Port: r.Port, Command: r.Command, Injected: r.Injected,
		Decision: r.Decision, Why: why, Error: msg,
		Micros: r.Micros, In: int(r.BytesUp), Out: int(r.BytesDown),
	})
}

// EgressCounts returns, per project, the connections the gateway allowed and refused
// (serve's metrics).
func (t *Toolhost) EgressCounts() map[string][2]int64 {
	s := &t.egress
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string][2]int64, len(s.stats))
	for p, st := range s.stats {
		out[p] = [2]int64{st.Allowed.Load(), st.Refused.Load()}
	}
	return out
}

// sessionEgress makes a session's side of the gateway: the host's policy narrowed by the
// session's (never widened), the session's budget, and what the provider is handed.
func (t *Toolhost) sessionEgress(project string, narrow *EgressPolicy) (*sandbox.Egress, error) {
	if t.cfg.Sandbox.Network != NetworkEgress {
		if narrow != nil {
			return nil, fmt.Errorf("a session egress policy needs sandbox.network egress (it is %s)", t.cfg.Sandbox.Network)
		}
		return nil, nil
	}
	gs, err := t.gateway()
	if err != nil {
		return nil, err
	}
	p := gs.host
	spec := sandbox.EgressPolicy{Preset: gs.host.Preset(), Allow: slices.Clone(t.cfg.Sandbox.Egress.Allow), Deny: slices.Clone(t.cfg.Sandbox.Egress.Deny), Ports: gs.host.Ports()}
	if narrow != nil {
		if p, err = p.Narrow(narrow.spec()); err != nil {
			return nil, fmt.Errorf("the session's egress policy: %w", err)
		}
		spec = narrowedSpec(spec, *narrow)
	}
	cfg := &t.cfg.Sandbox.Egress
	var budget *egress.Budget
	if cfg.MaxBytes > 0 {
		budget = egress.NewBudget(cfg.MaxBytes)
	}
	sess := gs.g.Session(egress.SessionConfig{
		Project: project, Policy: p, Budget: budget,
		Limits: egress.Limits{MaxConns: cfg.MaxConns, IdleTimeout: cfg.IdleTimeout},
		Inject: gs.inject,
	})
	return &sandbox.Egress{Policy: spec, Gateway: sess, Trust: slices.Clone(gs.trust)}, nil
}

// narrowedSpec is the flat policy a provider that enforces the network itself (E2B) gets
// for a narrowed session: the session's allow list when it has one (each entry still
// decided by the host's policy at the gateway, where there is one), both deny lists, the
// session's ports when it names some.
func narrowedSpec(host sandbox.EgressPolicy, s EgressPolicy) sandbox.EgressPolicy {
	out := host
	if s.Preset != "" || len(s.Allow) > 0 {
		out.Preset, out.Allow = s.Preset, slices.Clone(s.Allow)
		if out.Preset == "" {
			out.Preset = egress.PresetNone
		}
	}
	out.Deny = append(slices.Clone(host.Deny), s.Deny...)
	if len(s.Ports) > 0 {
		var ports []int
		for _, p := range s.Ports {
			if slices.Contains(host.Ports, p) {
				ports = append(ports, p)
			}
		}
		out.Ports = ports
	}
	return out
}

// CheckEgress decides a destination ("name:port", or an address) by the host's policy,
// narrowed by narrow when it is not nil, resolving the name as the gateway would.
func (t *Toolhost) CheckEgress(ctx context.Context, dest string, narrow *EgressPolicy) (EgressDecision, error) {
	return decideEgress(ctx, t, dest, narrow, true)
}

// EgressDecision is what the egress policy says of one destination.
type EgressDecision struct {
	Allowed bool
	// Rule is the rule that decided ("allow registry.npmjs.org (preset registries)",
	// "always refused: loopback address"); Reason, for a refusal, what the model reads.
	Rule, Reason string
	// Resolved lists the addresses the name resolved to (with resolve).
	Resolved []string
}

// DecideEgress decides a destination by cfg's egress policy (narrowed by narrow when it
// is not nil), without a sandbox: `toolhost policy test` asks it. With resolve the name
// is resolved through sandbox.egress.resolver and every address checked, as the gateway
// does at connect time; without, a name is decided by the rules that name it.
func DecideEgress(ctx context.Context, cfg Config, dest string, narrow *EgressPolicy, resolve bool, opts ...Option) (EgressDecision, error) {
	if err := cfg.Validate(); err != nil {
		return EgressDecision{}, err
	}
	t := &Toolhost{cfg: cloneConfig(cfg), opts: newOptions(opts)}
	return decideEgress(ctx, t, dest, narrow, resolve)
}

func decideEgress(ctx context.Context, t *Toolhost, dest string, narrow *EgressPolicy, resolve bool) (EgressDecision, error) {
	gs, err := t.gateway()
	if err != nil {
		return EgressDecision{}, err
	}
	p := gs.host
	if narrow != nil {
		if p, err = p.Narrow(narrow.spec()); err != nil {
			return EgressDecision{}, fmt.Errorf("the narrowing egress policy: %w", err)
		}
	}
	if !resolve {
		v := egress.Decide(p, dest)
		return EgressDecision{Allowed: v.Allowed, Rule: v.Rule, Reason: v.Reason}, nil
	}
	v, addrs := gs.g.Check(ctx, p, dest)
	d := EgressDecision{Allowed: v.Allowed, Rule: v.Rule, Reason: v.Reason}
	for _, a := range addrs {
		d.Resolved = append(d.Resolved, a.String())
	}
	return d, nil
}

// withEgressNet gives the gateway another network than this machine's (tests: their own
// internet).
func withEgressNet(dial func(ctx context.Context, network, addr string) (net.Conn, error), hostAddrs *egress.HostAddrs) Option {
	return func(o *options) { o.egressNet = &egressNet{dial: dial, hostAddrs: hostAddrs} }
}
