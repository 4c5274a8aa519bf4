package egress

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Presets name lists of destinations. Their exact contents are docs/NETWORK.md's table;
// keep the two in step (TestPresetsInDocs).
const (
	// PresetRegistries: the package registries a coding agent needs, the default.
	PresetRegistries = "registries"
	// PresetNone: nothing (only what sandbox.egress.allow names).
	PresetNone = "none"
)

// presets are the entries each preset adds to the allow list.
var presets = map[string][]string{
	PresetRegistries: {
		// npm and yarn
		"registry.npmjs.org", "registry.yarnpkg.com", "repo.yarnpkg.com",
		// PyPI and its files host
		"pypi.org", "files.pythonhosted.org",
		// the Go module proxy and checksum database
		"proxy.golang.org", "sum.golang.org",
		// crates.io, its sparse index and its static host
		"crates.io", "index.crates.io", "static.crates.io",
		// RubyGems
		"rubygems.org", "index.rubygems.org",
		// Maven Central
		"repo.maven.apache.org", "repo1.maven.org",
		// GitHub's clone and archive hosts
		"github.com", "codeload.github.com",
	},
	PresetNone: nil,
}

// PresetNames lists the presets, sorted.
func PresetNames() []string {
	names := make([]string, 0, len(presets))
	for n := range presets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Preset returns the destinations a preset allows, or false for an unknown preset.
func Preset(name string) ([]string, bool) {
	p, ok := presets[name]
	return slices.Clone(p), ok
}

// DefaultPorts are the ports a destination without its own port may be reached on.
var DefaultPorts = []int{80, 443}

// Spec is a policy as configured: sandbox.egress.{preset,allow,deny,ports}.
//
// An entry of Allow or Deny is one of:
//
//	example.com            that name exactly (any case, a trailing dot, or its Unicode
//	                       form: names are compared in their IDNA ASCII form)
//	*.example.com          every name below example.com (a.example.com, a.b.example.com),
//	                       not example.com itself and never evil-example.com
//	*                      every name (addresses still checked; Allow only)
//	example.com:8443       the name on that port only (also *.example.com:8443)
//	example.com:*          the name on every port
//	203.0.113.0/24         addresses in the CIDR, written as an IP literal or reached by
//	                       name; 203.0.113.7 and [2001:db8::7] are single addresses
//	203.0.113.0/24:5432    the CIDR on that port only (2001:db8::/32:443 for IPv6)
//
// An entry without a port applies on Ports (DefaultPorts when empty) in Allow, and on every
// port in Deny. Deny wins over Allow.
type Spec struct {
	Preset string
	Allow  []string
	Deny   []string
	Ports  []int
}

// Policy decides which destinations a sandbox may reach. It is immutable; Narrow makes a
// policy that allows only what it and another allow.
type Policy struct {
	preset string
	allow  []rule
	deny   []rule
	ports  []int
	// open: this layer allows every destination its deny list does not refuse (a narrowing
	// that names no allow list); the host's policy is never open.
	open bool
	// parent must allow what this layer allows (Narrow).
	parent *Policy
}

// rule is one compiled entry.
type rule struct {
	text   string // canonical, as messages show it
	source string // where it came from: "allow", "deny", "preset registries"
	any    bool   // "*"
	name   string // the exact name, or the suffix after "*." of a wildcard
	wild   bool
	prefix netip.Prefix // a CIDR entry
	port   int          // 0: the policy's ports (Allow) or every port (Deny); anyPort: every port
}

// anyPort is the port of an entry written with ":*".
const anyPort = -1

// allowsPort: an allow rule of layer l covers port.
func (r rule) allowsPort(l *Policy, port int) bool {
	return r.port == anyPort || r.port == port || r.port == 0 && l.portOK(port)
}

// deniesPort: a deny rule covers port.
func (r rule) deniesPort(port int) bool {
	return r.port == 0 || r.port == anyPort || r.port == port
}

func portText(p int) string {
	if p == anyPort {
		return "*"
	}
	return strconv.Itoa(p)
}

func (r rule) isCIDR() bool { return r.prefix.IsValid() }

// matchName reports whether a name rule covers name.
func (r rule) matchName(name string) bool {
	switch {
	case r.isCIDR():
		return false
	case r.any:
		return true
	case r.wild:
		return len(name) > len(r.name)+1 && strings.HasSuffix(name, r.name) && name[len(name)-len(r.name)-1] == '.'
	default:
		return name == r.name
	}
}

// describe is how a decision names the rule: "allow *.npmjs.org (preset registries)".
func (r rule) describe(verb string) string {
	if r.source == "" || r.source == verb {
		return verb + " " + r.text
	}
	return verb + " " + r.text + " (" + r.source + ")"
}

// SpecError is Compile's error: Field is the Spec's field at fault, by its configuration
// name ("preset", "allow", "deny" or "ports"), and the text names the entry and what is
// wrong with it.
type SpecError struct {
	Field string
	err   error
}

func specError(field string, err error) *SpecError { return &SpecError{Field: field, err: err} }

func (e *SpecError) Error() string { return e.err.Error() }
func (e *SpecError) Unwrap() error { return e.err }

// Compile checks a Spec and makes its Policy. Errors are *SpecError.
func Compile(s Spec) (*Policy, error) {
	p := &Policy{preset: s.Preset}
	if s.Preset != "" {
		entries, ok := presets[s.Preset]
		if !ok {
			return nil, specError("preset", fmt.Errorf("unknown preset %q (known: %s)", s.Preset, strings.Join(PresetNames(), ", ")))
		}
		for _, e := range entries {
			r, err := parseRule(e, "preset "+s.Preset)
			if err != nil {
				panic(fmt.Sprintf("egress: preset %s entry %q: %v", s.Preset, e, err))
			}
			p.allow = append(p.allow, r)
		}
	}
	for _, e := range s.Allow {
		r, err := parseRule(e, "allow")
		if err != nil {
			return nil, specError("allow", fmt.Errorf("allow entry %q: %w", e, err))
		}
		p.allow = append(p.allow, r)
	}
	for _, e := range s.Deny {
		r, err := parseRule(e, "deny")
		if err != nil {
			return nil, specError("deny", fmt.Errorf("deny entry %q: %w", e, err))
		}
		if r.any {
			return nil, specError("deny", fmt.Errorf("deny entry %q: * denies everything; use the preset none and no allow entries instead", e))
		}
		p.deny = append(p.deny, r)
	}
	ports := s.Ports
	if len(ports) == 0 {
		ports = DefaultPorts
	}
	for _, port := range ports {
		if port < 1 || port > 65535 {
			return nil, specError("ports", fmt.Errorf("port %d: not a port (1..65535)", port))
		}
	}
	p.ports = slices.Clone(ports)
	slices.Sort(p.ports)
	p.ports = slices.Compact(p.ports)
	return p, nil
}

// parseRule reads one Allow or Deny entry.
func parseRule(e, source string) (rule, error) {
	r := rule{source: source}
	s := strings.TrimSpace(e)
	if s == "" {
		return r, fmt.Errorf("empty")
	}
	if s == "*" {
		r.any, r.text = true, "*"
		return r, nil
	}
	// CIDR: "addr/bits" or "addr/bits:port".
	if a, rest, ok := strings.Cut(s, "/"); ok {
		bits, port := rest, ""
		if i := strings.IndexByte(rest, ':'); i >= 0 {
			bits, port = rest[:i], rest[i+1:]
		}
		pfx, err := netip.ParsePrefix(strings.Trim(a, "[]") + "/" + bits)
		if err != nil {
			return r, fmt.Errorf("not a CIDR: %v", err)
		}
		if pfx.Addr().Zone() != "" {
			return r, fmt.Errorf("a CIDR with a zone")
		}
		if pfx.Addr().Is4In6() {
			if pfx.Bits() < 96 {
				return r, fmt.Errorf("an IPv4-mapped CIDR shorter than /96")
			}
			pfx = netip.PrefixFrom(pfx.Addr().Unmap(), pfx.Bits()-96)
		}
		r.prefix = pfx.Masked()
		if port != "" {
			if r.port, err = parsePortText(port); err != nil {
				return r, err
			}
		}
		r.text = r.prefix.String()
		if r.port != 0 {
			r.text += ":" + portText(r.port)
		}
		return r, nil
	}
	hostText, port := s, 0
	if t, ok := strings.CutSuffix(s, ":*"); ok {
		hostText, port = t, anyPort
	} else if h, p, err := splitHostPort(s, -1); err == nil {
		hostText = h
		if p > 0 {
			port = p
		}
	} else if !strings.Contains(s, ":") || strings.HasPrefix(s, "[") {
		return r, err
	}
	r.port = port
	wild := strings.HasPrefix(hostText, "*.")
	if wild {
		hostText = hostText[2:]
	}
	h, err := parseHost(hostText)
	if err != nil {
		return r, err
	}
	switch {
	case h.isAddr() && wild:
		return r, fmt.Errorf("a wildcard over an address")
	case h.isAddr():
		r.prefix = netip.PrefixFrom(h.addr, h.addr.BitLen())
		r.text = r.prefix.String()
	default:
		r.name, r.wild = h.name, wild
		r.text = h.name
		if wild {
			r.text = "*." + h.name
		}
	}
	if r.port != 0 {
		r.text += ":" + portText(r.port)
	}
	return r, nil
}

func parsePortText(s string) (int, error) {
	if s == "*" {
		return anyPort, nil
	}
	p, err := strconv.ParseUint(s, 10, 16)
	if err != nil || p == 0 {
		return 0, fmt.Errorf("bad port %q", s)
	}
	return int(p), nil
}

// Narrow returns a policy that allows only what p allows and s allows too: a session's
// policy under the host's, which can take away and never add. A Spec with no preset and
// no allow entries narrows by its deny list and ports only.
func (p *Policy) Narrow(s Spec) (*Policy, error) {
	q, err := Compile(s)
	if err != nil {
		return nil, err
	}
	if len(s.Ports) == 0 {
		q.ports = nil // every port the parent allows
	}
	q.open = s.Preset == "" && len(s.Allow) == 0
	q.parent = p
	return q, nil
}

// Preset is the preset of the host's policy (the root of a narrowed one).
func (p *Policy) Preset() string {
	for p.parent != nil {
		p = p.parent
	}
	return p.preset
}

// Ports are the ports the host's policy allows entries without a port on.
func (p *Policy) Ports() []int {
	for p.parent != nil {
		p = p.parent
	}
	return slices.Clone(p.ports)
}

// Allowed lists the allow entries of the host's policy, as messages show them.
func (p *Policy) Allowed() []string {
	for p.parent != nil {
		p = p.parent
	}
	return ruleTexts(p.allow)
}

func ruleTexts(rs []rule) []string {
	out := make([]string, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.text)
	}
	return out
}

// Entry is one compiled entry of a policy, for a provider that enforces a policy itself
// (E2B compiles these to its own rules).
type Entry struct {
	Text   string       // canonical: "registry.npmjs.org", "*.example.com", "10.0.0.0/8:5432"
	Source string       // "allow", "deny", "preset registries"
	Name   string       // the name, or a wildcard's suffix; "" for a CIDR or "*"
	Wild   bool         // *.Name
	Any    bool         // "*": every name
	Prefix netip.Prefix // a CIDR (single addresses are /32 and /128)
	// Port is the entry's own port, 0 when it takes the policy's ports (allow) or every
	// port (deny), AnyPort for ":*".
	Port int
}

// AnyPort is Entry.Port of an entry written with ":*".
const AnyPort = anyPort

// Entries returns the allow and deny entries of the policy (the host's: a narrowing's own
// layer is not in them; E2B gets the narrowed Spec compiled on its own).
func (p *Policy) Entries() (allow, deny []Entry) {
	for p.parent != nil {
		p = p.parent
	}
	conv := func(rs []rule) []Entry {
		out := make([]Entry, 0, len(rs))
		for _, r := range rs {
			out = append(out, Entry{Text: r.text, Source: r.source, Name: r.name, Wild: r.wild, Any: r.any, Prefix: r.prefix, Port: r.port})
		}
		return out
	}
	return conv(p.allow), conv(p.deny)
}

// layers lists the root (the host's policy) first.
func (p *Policy) layers() []*Policy {
	var ls []*Policy
	for q := p; q != nil; q = q.parent {
		ls = append(ls, q)
	}
	slices.Reverse(ls)
	return ls
}

// Verdict is a decision about a destination.
type Verdict struct {
	Allowed bool
	// Rule is the rule that decided, for the audit: "allow registry.npmjs.org (preset
	// registries)", "deny *.example.com", "always refused: loopback address".
	Rule string
	// Reason, when refused, is the sentence the model reads (the 403's body, the bash
	// note): what was refused, why, and what to do.
	Reason string
	// Status is the HTTP status a refusal answers with: 403 for policy, 502 when the
	// destination could not be resolved or reached, 400 for a request that is not one.
	Status int
}

func refuse(rule, reason string) Verdict {
	return Verdict{Rule: rule, Reason: "egress: " + reason, Status: 403}
}

// pending is the first step's answer for a name: allowed by a name rule (addresses still
// to be checked), or to be allowed by CIDR rules once its addresses are known.
type pending struct {
	v       Verdict
	byName  []bool // per layer: a name rule allowed it (else, for an IP literal, a CIDR must)
	decided bool   // v is final (a refusal)
}

// checkHost is the first step, before any lookup: the name or literal and the port
// against every layer's rules. An address passes through checkAddrs too.
func (p *Policy) checkHost(h host, port int) pending {
	ls := p.layers()
	pd := pending{byName: make([]bool, len(ls))}
	var first Verdict
	for i, l := range ls {
		v, byName := l.checkHostLayer(h, port)
		if !v.Allowed && v.Rule != "" {
			return pending{v: v, decided: true}
		}
		pd.byName[i] = byName
		if i == 0 {
			first = v
		}
	}
	pd.v = first
	return pd
}

// checkHostLayer: a refusal (Rule set), or allowed by name (true), or, for an IP
// literal, left to the CIDR rules (false, with an empty Verdict).
func (l *Policy) checkHostLayer(h host, port int) (Verdict, bool) {
	for _, r := range l.deny {
		if r.deniesPort(port) && (h.isAddr() && r.isCIDR() && r.prefix.Contains(h.addr) || !h.isAddr() && r.matchName(h.name)) {
			return refuse(r.describe("deny"), fmt.Sprintf("%s is refused by the rule %q", dest(h, port), r.text)), false
		}
	}
	if l.open {
		if !l.portOK(port) {
			return refuse("port not allowed", fmt.Sprintf("port %d is not allowed in this session (allowed ports: %s)", port, intList(l.ports))), false
		}
		return Verdict{Allowed: true, Rule: "allow (session narrows by deny only)"}, true
	}
	if h.isAddr() {
		return Verdict{}, false // CIDR rules decide, in checkAddrs
	}
	var portMiss *rule
	for _, r := range l.allow {
		if !r.matchName(h.name) {
			continue
		}
		if r.allowsPort(l, port) {
			return Verdict{Allowed: true, Rule: r.describe("allow")}, true
		}
		portMiss = &r
	}
	if portMiss != nil {
		return refuse("port not allowed: "+portMiss.describe("allow"),
			fmt.Sprintf("port %d of %s is not allowed (allowed ports: %s); ask the operator to allow %s:%d in sandbox.egress.allow",
				port, h.name, l.portsOf(*portMiss), h.name, port)), false
	}
	return refuse("no rule allows "+h.name, l.notAllowed(h.name)), false
}

// portOK: an entry without a port may be used on port (a narrowing without ports leaves
// them to its parent).
func (l *Policy) portOK(port int) bool {
	return l.ports == nil || slices.Contains(l.ports, port)
}

// cidrTexts lists the layer's allow CIDRs.
func (l *Policy) cidrTexts() []string {
	var out []string
	for _, r := range l.allow {
		if r.isCIDR() {
			out = append(out, r.text)
		}
	}
	return out
}

func (l *Policy) portsOf(r rule) string {
	if r.port != 0 {
		return portText(r.port)
	}
	return intList(l.ports)
}

// notAllowed is the reason for a name no rule allows.
func (l *Policy) notAllowed(name string) string {
	return fmt.Sprintf("%s is not an allowed domain (allowed: %s); ask the operator to add it to sandbox.egress.allow", name, l.allowedList())
}

// allowedList is the allow list as a model reads it: the first few entries.
func (l *Policy) allowedList() string {
	const show = 6
	ts := ruleTexts(l.allow)
	switch {
	case len(ts) == 0:
		return "nothing"
	case len(ts) <= show:
		return strings.Join(ts, ", ")
	default:
		return strings.Join(ts[:show], ", ") + fmt.Sprintf(", … %d more", len(ts)-show)
	}
}

// checkAddrs is the second step: every address a destination resolved to (or its literal)
// must be one the sandbox may reach. own says whether an address is one of this host's
// (nil: not known, for Decide); one is refused whatever the policy says, inside an
// allowed private range too.
func (p *Policy) checkAddrs(h host, port int, pd pending, addrs []netip.Addr, own func(netip.Addr) (bool, error)) Verdict {
	ls := p.layers()
	for _, a := range addrs {
		a = a.Unmap()
		c := classify(a)
		if c != classPublic && !(c.private() && p.privateAllowed(a, port)) {
			return refuse("always refused: "+string(c)+" address", addrReason(h, a, c))
		}
		if own != nil {
			mine, err := own(a)
			if err != nil {
				return Verdict{Rule: "host addresses unknown: " + err.Error(), Status: 502,
					Reason: fmt.Sprintf("egress: %s could not be checked against this host's own addresses, which the gateway could not read; try again, and if it keeps failing tell the operator", dest(h, port))}
			}
			if mine {
				return refuse("always refused: "+string(classHost)+" address", addrReason(h, a, classHost))
			}
		}
		for i, l := range ls {
			for _, r := range l.deny {
				if r.isCIDR() && r.prefix.Contains(a) && r.deniesPort(port) {
					return refuse(r.describe("deny"), fmt.Sprintf("%s is refused by the rule %q", destAddr(h, a, port), r.text))
				}
			}
			if pd.byName[i] || l.open {
				continue
			}
			if r, ok := l.cidrAllowing(a, port); ok {
				if i == 0 && pd.v.Rule == "" {
					pd.v = Verdict{Allowed: true, Rule: r.describe("allow")}
				}
				continue
			}
			// Only an IP literal gets here: a name no name rule allowed was refused
			// before any lookup (no DNS query leaves for a name the policy does not name).
			if cidrs := l.cidrTexts(); len(cidrs) > 0 {
				return refuse("IP literal: no CIDR allows "+a.String()+" on port "+strconv.Itoa(port), fmt.Sprintf("%s is an IP address outside the allowed ranges (%s) on port %d; use the domain name, or ask the operator to allow it in sandbox.egress.allow", litText(h), strings.Join(cidrs, ", "), port))
			}
			return refuse("IP literal: no CIDR allows "+a.String(), fmt.Sprintf("%s is an IP address, and no rule allows addresses; use the domain name, or ask the operator to allow a CIDR in sandbox.egress.allow", litText(h)))
		}
	}
	if len(addrs) == 0 {
		return Verdict{Rule: "no address", Reason: fmt.Sprintf("egress: %s has no address", h), Status: 502}
	}
	return pd.v
}

// cidrAllowing finds an allow CIDR of this layer that covers a on port.
func (l *Policy) cidrAllowing(a netip.Addr, port int) (rule, bool) {
	for _, r := range l.allow {
		if r.isCIDR() && r.prefix.Contains(a) && r.allowsPort(l, port) {
			return r, true
		}
	}
	return rule{}, false
}

// privateAllowed: the host's policy opens a private address only with an allow CIDR that
// lies inside a private range (10.1.2.0/24 opens 10.1.2.7; 0.0.0.0/0 opens nothing
// private).
func (p *Policy) privateAllowed(a netip.Addr, port int) bool {
	root := p.layers()[0]
	for _, r := range root.allow {
		if !r.isCIDR() || !r.prefix.Contains(a) || !r.allowsPort(root, port) {
			continue
		}
		if classify(r.prefix.Addr()).private() && classify(lastAddr(r.prefix)).private() && sameRange(r.prefix) {
			return true
		}
	}
	return false
}

// sameRange: the whole prefix lies inside one private range.
func sameRange(p netip.Prefix) bool {
	for _, rs := range [][]classRange{v4Ranges, v6Ranges} {
		for _, r := range rs {
			if r.class.private() && r.p.Bits() <= p.Bits() && r.p.Contains(p.Addr()) {
				return true
			}
		}
	}
	return false
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// addrReason explains an always-refused address.
func addrReason(h host, a netip.Addr, c addrClass) string {
	what := "a " + string(c) + " address"
	switch c {
	case classMetadata:
		what = "the address of " + string(c)
	case classHost:
		what = "one of this host's own addresses"
	}
	if h.isAddr() {
		return fmt.Sprintf("%s is %s, which a sandbox may never reach", litText(h), what)
	}
	return fmt.Sprintf("%s resolves to %s, %s, which a sandbox may never reach", h.name, a, what)
}

// litText names an IP literal, saying so when it was written in an unusual spelling.
func litText(h host) string {
	raw := strings.Trim(h.raw, "[]")
	if raw == "" || raw == h.addr.String() {
		return h.addr.String()
	}
	return fmt.Sprintf("%s (the address %s written another way)", raw, h.addr)
}

func dest(h host, port int) string {
	if h.isAddr() {
		return litText(h) + " port " + strconv.Itoa(port)
	}
	return h.name + ":" + strconv.Itoa(port)
}

func destAddr(h host, a netip.Addr, port int) string {
	if h.isAddr() {
		return dest(h, port)
	}
	return fmt.Sprintf("%s:%d (%s)", h.name, port, a)
}

func intList(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}
