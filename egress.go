package toolhost

import (
	"context"
	"fmt"
	"net"
	"slices"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/egress"
)

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
