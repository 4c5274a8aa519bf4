package e2b

import (
	"fmt"
	"slices"
	"strings"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/egress"
)

// The egress policy on E2B. An E2B sandbox runs on E2B's fleet, out of reach of this
// host's gateway, so the policy is compiled to what E2B enforces itself (its OpenAPI,
// newest read 2026-08: create's allow_internet_access and network.allowOut / denyOut,
// PUT /sandboxes/{id}/network at run time):
//
//   - allowOut takes CIDRs, addresses and domains (*.domain too); denyOut CIDRs and
//     addresses only; an allowOut entry wins over a denyOut one. So the policy becomes
//     allowOut = its names and CIDRs, denyOut = 0.0.0.0/0 (everything else).
//   - E2B matches domains only on port 80 (the Host header) and 443 (the TLS server name);
//     a CIDR it allows on every port.
//
// What E2B cannot enforce as the gateway does is left out (narrower, never wider) where
// that is possible, and said once in the log either way: a name on another port, a CIDR
// limited to ports, a domain in the deny list, an address check after resolution (E2B
// decides a name by the name).

// e2bNetwork is a compiled policy.
type e2bNetwork struct {
	internet bool
	allowOut []string
	denyOut  []string
	// gaps say what E2B does not enforce as the gateway would, one sentence each.
	gaps []string
}

// denyAll is the CIDR that makes allowOut the only way out.
const denyAll = "0.0.0.0/0"

// compileNetwork compiles a sandbox's egress policy to E2B's network options.
func compileNetwork(pol sandbox.EgressPolicy) (e2bNetwork, error) {
	p, err := egress.Compile(egress.Spec{Preset: pol.Preset, Allow: pol.Allow, Deny: pol.Deny, Ports: pol.Ports})
	if err != nil {
		return e2bNetwork{}, fmt.Errorf("the egress policy: %w", err)
	}
	allow, deny := p.Entries()
	ports := p.Ports()
	var n e2bNetwork
	gap := func(format string, args ...any) { n.gaps = append(n.gaps, fmt.Sprintf(format, args...)) }
	webOnly := !slices.ContainsFunc(ports, func(port int) bool { return port != 80 && port != 443 })
	anyName := false
	for _, e := range allow {
		switch {
		case e.Any:
			anyName = true
		case e.Prefix.IsValid() && e.Port == egress.AnyPort:
			n.allowOut = append(n.allowOut, e.Prefix.String())
		case e.Prefix.IsValid():
			gap("%s is left out: E2B allows a CIDR on every port, and this entry is limited to %s", e.Text, portsOf(e, ports))
		case e.Port == 80 || e.Port == 443:
			n.allowOut = append(n.allowOut, nameOf(e))
			gap("%s is allowed on both 80 and 443: E2B matches names on those two ports alike", e.Text)
		case e.Port != 0:
			gap("%s is left out: E2B matches names only on ports 80 and 443", e.Text)
		default:
			n.allowOut = append(n.allowOut, nameOf(e))
		}
	}
	if !webOnly {
		gap("names are allowed on ports 80 and 443 only (E2B matches names nowhere else), not on %s", intsText(ports))
	}
	for _, e := range deny {
		switch {
		case e.Prefix.IsValid():
			n.denyOut = append(n.denyOut, e.Prefix.String())
			if slices.ContainsFunc(allow, func(a egress.Entry) bool { return a.Any || a.Prefix.IsValid() && a.Prefix.Overlaps(e.Prefix) }) {
				gap("the deny entry %s does not win on E2B over an allowed name or CIDR that reaches it (E2B's allowOut wins)", e.Text)
			}
		case coveredBy(e, allow):
			gap("the deny entry %s is not refused on E2B (E2B takes no domain in its deny list, and an allow entry covers it)", e.Text)
		}
	}
	switch {
	case anyName:
		// Every name: the internet, with E2B's own limits; deny CIDRs still apply.
		n.internet, n.allowOut = true, nil
		gap("* (every name) lets an E2B sandbox reach IP addresses too, and names are not checked against the addresses they resolve to")
	case len(n.allowOut) > 0:
		n.internet = true
		n.denyOut = append(n.denyOut, denyAll)
		gap("E2B decides a name by the name: a name that resolves to a private or metadata address is not refused there as the gateway refuses it")
	default:
		n.internet, n.denyOut = false, nil
	}
	slices.Sort(n.denyOut)
	n.denyOut = slices.Compact(n.denyOut)
	return n, nil
}

func nameOf(e egress.Entry) string {
	if e.Wild {
		return "*." + e.Name
	}
	return e.Name
}

func portsOf(e egress.Entry, ports []int) string {
	if e.Port > 0 {
		return fmt.Sprint(e.Port)
	}
	return intsText(ports)
}

func intsText(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ", ")
}

// coveredBy reports whether a name deny entry lies under an allow entry (so allowOut would
// let it through on E2B).
func coveredBy(d egress.Entry, allow []egress.Entry) bool {
	for _, a := range allow {
		switch {
		case a.Any:
			return true
		case a.Prefix.IsValid() || a.Name == "":
		case a.Wild && (d.Name == a.Name && d.Wild || strings.HasSuffix(d.Name, "."+a.Name)):
			return true
		case !a.Wild && !d.Wild && a.Name == d.Name:
			return true
		}
	}
	return false
}
