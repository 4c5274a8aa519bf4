//go:build linux

package e2bfake

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/toolhost/toolhost/internal/egress"
)

// The fake's sandboxes never use the host's network: each reaches what its E2B network
// options allow through the egress gateway (Config.Egress), which enforces them with
// E2B's meaning, compiled here: allow_internet_access false is denyOut 0.0.0.0/0; allowOut
// takes domains (*.domain too), addresses and CIDRs, and wins over denyOut; denyOut takes
// addresses and CIDRs only; domains are matched on ports 80 and 443 (Host and SNI), CIDRs
// on every port. PUT /sandboxes/{id}/network replaces the rules of a running sandbox.
//
// Where the gateway is stricter than E2B it stays so: private, link-local and metadata
// addresses are refused whatever the rules say, and a denyOut CIDR does not refuse a name
// that allowOut names.

// netRules are a sandbox's E2B network options.
type netRules struct {
	Internet bool
	AllowOut []string
	DenyOut  []string
}

// spec compiles E2B rules to the gateway's policy; a bad entry is the API's 400.
func (n netRules) spec() (egress.Spec, error) {
	closed := !n.Internet
	var deny []netip.Prefix
	for _, d := range n.DenyOut {
		p, err := parsePrefix(d)
		if err != nil {
			return egress.Spec{}, fmt.Errorf("invalid denyOut entry %q: domain names are not supported for deny rules; use a CIDR block or an IP address", d)
		}
		if p.Bits() == 0 && p.Addr().Is4() {
			closed = true
		}
		deny = append(deny, p)
	}
	spec := egress.Spec{Preset: egress.PresetNone, Ports: []int{80, 443}}
	var allowed []netip.Prefix
	for _, a := range n.AllowOut {
		if p, err := parsePrefix(a); err == nil {
			allowed = append(allowed, p)
			spec.Allow = append(spec.Allow, p.String()+":*")
			continue
		}
		if strings.ContainsAny(a, "/: ") || a == "" {
			return egress.Spec{}, fmt.Errorf("invalid allowOut entry %q", a)
		}
		spec.Allow = append(spec.Allow, a)
	}
	if !closed {
		spec.Allow = append([]string{"*", "0.0.0.0/0:*", "::/0:*"}, spec.Allow...)
		for _, d := range deny {
			// An allowed CIDR wins over a denied one that holds it: leave such a deny out.
			if !slices.ContainsFunc(allowed, func(a netip.Prefix) bool { return a.Overlaps(d) }) && d.Bits() > 0 {
				spec.Deny = append(spec.Deny, d.String())
			}
		}
	}
	if _, err := egress.Compile(spec); err != nil {
		return egress.Spec{}, err
	}
	return spec, nil
}

func parsePrefix(s string) (netip.Prefix, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	return netip.ParsePrefix(s)
}

// updateNetwork is PUT /sandboxes/{id}/network: the new rules replace the old, for new
// connections.
func (s *Server) updateNetwork(w http.ResponseWriter, r *http.Request, id string) {
	var in struct {
		AllowOut            []string `json:"allowOut"`
		DenyOut             []string `json:"denyOut"`
		AllowInternetAccess *bool    `json:"allow_internet_access"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&in); err != nil {
		apiError(w, http.StatusBadRequest, "Error when parsing request: "+err.Error())
		return
	}
	sb := s.lookup(id)
	if sb == nil {
		notFound(w, id)
		return
	}
	rules := netRules{Internet: in.AllowInternetAccess == nil || *in.AllowInternetAccess, AllowOut: in.AllowOut, DenyOut: in.DenyOut}
	spec, err := rules.spec()
	if err != nil {
		apiError(w, http.StatusBadRequest, err.Error())
		return
	}
	p, _ := egress.Compile(spec)
	sb.mu.Lock()
	sb.net = rules
	sess := sb.egress
	sb.mu.Unlock()
	if sess != nil {
		sess.SetPolicy(p)
	}
	w.WriteHeader(http.StatusNoContent)
}
