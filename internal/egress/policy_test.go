package egress

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
)

func TestParseHost(t *testing.T) {
	for _, c := range []struct {
		in, name, addr string
	}{
		{in: "registry.npmjs.org", name: "registry.npmjs.org"},
		{in: "REGISTRY.NPMJS.ORG.", name: "registry.npmjs.org"},
		{in: "Bücher.example", name: "xn--bcher-kva.example"},
		{in: "xn--bcher-kva.example", name: "xn--bcher-kva.example"},
		{in: "ｒｅｇｉｓｔｒｙ.npmjs.org", name: "registry.npmjs.org"}, // full-width folds
		{in: "r3---sn-abc.googlevideo.com", name: "r3---sn-abc.googlevideo.com"},
		{in: "127.0.0.1", addr: "127.0.0.1"},
		{in: "127.1", addr: "127.0.0.1"},
		{in: "2130706433", addr: "127.0.0.1"},
		{in: "017700000001", addr: "127.0.0.1"},
		{in: "0x7f000001", addr: "127.0.0.1"},
		{in: "0x7f.1", addr: "127.0.0.1"},
		{in: "0177.0.0.01", addr: "127.0.0.1"},
		{in: "127.0.0.1.", addr: "127.0.0.1"},
		{in: "0", addr: "0.0.0.0"},
		{in: "[::1]", addr: "::1"},
		{in: "::1", addr: "::1"},
		{in: "[::ffff:127.0.0.1]", addr: "127.0.0.1"},
		{in: "[::ffff:7f00:1]", addr: "127.0.0.1"},
		{in: "169.254.169.254", addr: "169.254.169.254"},
		{in: "0xa9.0xfe.0xa9.0xfe", addr: "169.254.169.254"},
		{in: "2852039166", addr: "169.254.169.254"},
	} {
		h, err := parseHost(c.in)
		if err != nil {
			t.Errorf("parseHost(%q): %v", c.in, err)
			continue
		}
		if h.name != c.name || (c.addr != "") != h.isAddr() || h.isAddr() && h.addr.String() != c.addr {
			t.Errorf("parseHost(%q) = name %q addr %v; want name %q addr %q", c.in, h.name, h.addr, c.name, c.addr)
		}
	}
	for _, bad := range []string{
		"", "localhost", "metadata", "a..b", "-a.example", "a-.example", "a_b.example", "exa mple.com",
		"1.2.3.4.5", "256.1.1.1", "0x100000000", "08.1.1.1", "example.123", "[::1", "[fe80::1%eth0]",
		"a\x00.example", strings.Repeat("a", 64) + ".example", strings.Repeat("a.", 130) + "com",
		"example.com..", "evil.example\r\nHost: x",
	} {
		if h, err := parseHost(bad); err == nil {
			t.Errorf("parseHost(%q) = %+v; want an error", bad, h)
		}
	}
}

func TestClassify(t *testing.T) {
	for _, c := range []struct {
		addr  string
		class addrClass
	}{
		{"203.0.113.7", classPublic},
		{"8.8.8.8", classPublic},
		{"2606:4700::1111", classPublic},
		{"127.0.0.1", classLoopback},
		{"127.255.255.254", classLoopback},
		{"::1", classLoopback},
		{"10.0.0.1", classPrivate},
		{"172.16.0.1", classPrivate},
		{"172.31.255.255", classPrivate},
		{"192.168.1.1", classPrivate},
		{"100.64.0.1", classCGNAT},
		{"100.127.255.255", classCGNAT},
		{"fd00::1", classULA},
		{"fc00::1", classULA},
		{"169.254.1.1", classLinkLocal},
		{"fe80::1", classLinkLocal},
		{"169.254.169.254", classMetadata},
		{"fd00:ec2::254", classMetadata},
		{"100.100.100.200", classMetadata},
		{"224.0.0.1", classMulticast},
		{"ff02::1", classMulticast},
		{"0.0.0.0", classUnspecified},
		{"0.1.2.3", classUnspecified},
		{"::", classUnspecified},
		{"255.255.255.255", classBroadcast},
		{"240.0.0.1", classReserved},
		{"::ffff:127.0.0.1", classLoopback},
		{"::ffff:10.1.2.3", classPrivate},
		{"::127.0.0.1", classLoopback},            // IPv4-compatible
		{"64:ff9b::7f00:1", classLoopback},        // NAT64 of 127.0.0.1
		{"64:ff9b::a9fe:a9fe", classMetadata},     // NAT64 of 169.254.169.254
		{"64:ff9b::cb00:7107", classPublic},       // NAT64 of 203.0.113.7
		{"2002:7f00:1::", classLoopback},          // 6to4 of 127.0.0.1
		{"2002:a00:1::1", classPrivate},           // 6to4 of 10.0.0.1
		{"64:ff9b:1:7f00:0:100::", classLoopback}, // RFC 8215 local NAT64 /48
		{"2001::1", classReserved},                // Teredo
	} {
		if got := classify(netip.MustParseAddr(c.addr)); got != c.class {
			t.Errorf("classify(%s) = %q; want %q", c.addr, got, c.class)
		}
	}
}

func mustCompile(t *testing.T, s Spec) *Policy {
	t.Helper()
	p, err := Compile(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// decide runs both steps with the addresses a fake resolver gives.
func decideWith(p *Policy, dest string, dns map[string][]string, own ...string) Verdict {
	hs, port, err := splitHostPort(dest, 0)
	if err != nil {
		return Verdict{Rule: "malformed"}
	}
	h, err := parseHost(hs)
	if err != nil {
		return refuse("not a name", err.Error())
	}
	pd := p.checkHost(h, port)
	if pd.decided {
		return pd.v
	}
	var addrs []netip.Addr
	if h.isAddr() {
		addrs = []netip.Addr{h.addr}
	} else {
		for _, a := range dns[h.name] {
			addrs = append(addrs, netip.MustParseAddr(a))
		}
	}
	isOwn := func(a netip.Addr) (bool, error) {
		for _, o := range own {
			if netip.MustParseAddr(o) == a {
				return true, nil
			}
		}
		return false, nil
	}
	return p.checkAddrs(h, port, pd, addrs, isOwn)
}

func TestPolicyDecisions(t *testing.T) {
	p := mustCompile(t, Spec{
		Preset: PresetRegistries,
		Allow:  []string{"*.allowed.test", "git.example.test:22", "198.51.100.0/24", "10.9.0.0/16:8080", "[2001:db8:5::]/48", "Bücher.example", "mirror.corp.test:8080", "stray.corp.test:8080", "lan.corp.test:8080"},
		Deny:   []string{"blocked.allowed.test", "198.51.100.66", "*.npmjs.org:80"},
	})
	dns := map[string][]string{
		"registry.npmjs.org":        {"203.0.113.10"},
		"a.allowed.test":            {"203.0.113.11", "2001:db8:200::11"},
		"x.y.allowed.test":          {"203.0.113.12"},
		"evil-allowed.test":         {"203.0.113.13"},
		"allowed.test":              {"203.0.113.14"},
		"allowed.test.evil.test":    {"203.0.113.15"},
		"lo.allowed.test":           {"127.0.0.1"},
		"lo6.allowed.test":          {"::1"},
		"ten.allowed.test":          {"10.0.0.1"},
		"meta.allowed.test":         {"169.254.169.254"},
		"meta6.allowed.test":        {"fd00:ec2::254"},
		"ula.allowed.test":          {"fd00::1"},
		"cgnat.allowed.test":        {"100.64.0.1"},
		"own.allowed.test":          {"192.0.2.10"},
		"mixed.allowed.test":        {"203.0.113.16", "127.0.0.1"},
		"mapped.allowed.test":       {"::ffff:127.0.0.1"},
		"inrange.example.test":      {"198.51.100.7"},
		"denied-range.allowed.test": {"198.51.100.66"},
		"mirror.corp.test":          {"10.9.1.1"},
		"stray.corp.test":           {"10.10.0.1"},
		"lan.corp.test":             {"10.9.7.7"},
		"git.example.test":          {"203.0.113.17"},
		"xn--bcher-kva.example":     {"203.0.113.18"},
		"blocked.allowed.test":      {"203.0.113.19"},
	}
	for _, c := range []struct {
		dest    string
		allowed bool
		rule    string // a substring of Verdict.Rule
		reason  string // a substring of Verdict.Reason, for refusals
	}{
		{"registry.npmjs.org:443", true, "allow registry.npmjs.org (preset registries)", ""},
		{"REGISTRY.NPMJS.ORG.:443", true, "allow registry.npmjs.org", ""},
		{"registry.npmjs.org:80", false, "deny *.npmjs.org:80", "refused by the rule"},
		{"registry.npmjs.org:22", false, "port not allowed: allow registry.npmjs.org", "port 22 of registry.npmjs.org is not allowed (allowed ports: 80, 443)"},
		{"a.allowed.test:443", true, "allow *.allowed.test", ""},
		{"x.y.allowed.test:80", true, "allow *.allowed.test", ""},
		{"allowed.test:443", false, "no rule allows allowed.test", "is not an allowed domain"},
		{"evil-allowed.test:443", false, "no rule allows evil-allowed.test", "ask the operator"},
		{"allowed.test.evil.test:443", false, "no rule allows", ""},
		{"blocked.allowed.test:443", false, "deny blocked.allowed.test", ""},
		{"BLOCKED.Allowed.Test.:443", false, "deny blocked.allowed.test", ""},
		{"git.example.test:22", true, "allow git.example.test:22", ""},
		{"git.example.test:443", false, "port not allowed: allow git.example.test:22", "(allowed ports: 22)"},
		{"bücher.example:443", true, "allow xn--bcher-kva.example", ""},
		{"xn--bcher-kva.example:443", true, "allow xn--bcher-kva.example", ""},
		{"lo.allowed.test:80", false, "always refused: loopback", "resolves to 127.0.0.1, a loopback address"},
		{"lo6.allowed.test:80", false, "always refused: loopback", ""},
		{"ten.allowed.test:80", false, "always refused: private", ""},
		{"meta.allowed.test:80", false, "always refused: a cloud metadata service", "metadata"},
		{"meta6.allowed.test:80", false, "always refused: a cloud metadata service", ""},
		{"ula.allowed.test:80", false, "always refused: private (IPv6 unique local)", ""},
		{"cgnat.allowed.test:80", false, "always refused: private (carrier-grade NAT", ""},
		{"own.allowed.test:80", false, "always refused: this host's own", "this host's own addresses"},
		{"mixed.allowed.test:80", false, "always refused: loopback", ""},
		{"mapped.allowed.test:80", false, "always refused: loopback", ""},
		{"127.0.0.1:80", false, "always refused: loopback", ""},
		{"2130706433:80", false, "always refused: loopback", "2130706433 (the address 127.0.0.1 written another way)"},
		{"017700000001:80", false, "always refused: loopback", ""},
		{"0x7f.1:80", false, "always refused: loopback", ""},
		{"[::ffff:127.0.0.1]:80", false, "always refused: loopback", ""},
		{"[::1]:80", false, "always refused: loopback", ""},
		{"169.254.169.254:80", false, "always refused: a cloud metadata service", ""},
		{"0xa9fea9fe:80", false, "always refused: a cloud metadata service", ""},
		{"[fd00:ec2::254]:80", false, "always refused", ""},
		{"203.0.113.10:443", false, "IP literal: no CIDR allows 203.0.113.10", "is an IP address outside the allowed ranges"},
		{"inrange.example.test:443", false, "no rule allows inrange.example.test", ""}, // a CIDR opens literals, not names
		{"198.51.100.7:443", true, "allow 198.51.100.0/24", ""},

		{"198.51.100.66:443", false, "deny 198.51.100.66/32", ""},
		{"denied-range.allowed.test:443", false, "deny 198.51.100.66/32", ""},
		{"198.51.100.7:22", false, "IP literal: no CIDR allows 198.51.100.7 on port 22", ""},
		{"[2001:db8:5::9]:443", true, "allow 2001:db8:5::/48", ""},
		{"own.allowed.test:80", false, "this host's own", ""},
		{"192.0.2.10:443", false, "always refused: this host's own", ""},
		// A private range opens only to an allow CIDR inside it, on its port.
		{"mirror.allowed.test:8080", false, "port not allowed: allow *.allowed.test", ""}, // *.allowed.test is on 80 and 443
		{"mirror.corp.test:8080", true, "allow mirror.corp.test:8080", ""},
		{"stray.corp.test:8080", false, "always refused: private", "resolves to 10.10.0.1"},
		{"10.9.1.1:8080", true, "allow 10.9.0.0/16:8080", ""},
		{"10.9.1.1:443", false, "always refused: private", ""},
		{"10.10.0.1:8080", false, "always refused: private", ""},
		// ... and never to this host's own address inside it.
		{"10.9.7.7:8080", false, "always refused: this host's own", "10.9.7.7 is one of this host's own addresses"},
		{"[::ffff:10.9.7.7]:8080", false, "always refused: this host's own", ""},
		{"lan.corp.test:8080", false, "always refused: this host's own", "lan.corp.test resolves to 10.9.7.7, one of this host's own addresses"},
		{"registrу.npmjs.org:443", false, "no rule allows xn--registr-", ""}, // Cyrillic у
		{"nowhere.test:443", false, "no rule allows nowhere.test", ""},
	} {
		v := decideWith(p, c.dest, dns, "192.0.2.10", "10.9.7.7")
		if v.Allowed != c.allowed || !strings.Contains(v.Rule, c.rule) || !strings.Contains(v.Reason, c.reason) {
			t.Errorf("%s: allowed %v, rule %q, reason %q; want allowed %v, rule ~%q, reason ~%q",
				c.dest, v.Allowed, v.Rule, v.Reason, c.allowed, c.rule, c.reason)
		}
		if !v.Allowed && !strings.HasPrefix(v.Reason, "egress: ") {
			t.Errorf("%s: reason %q does not start with egress:", c.dest, v.Reason)
		}
	}
}

func TestPolicyCIDRDoesNotOpenPrivate(t *testing.T) {
	p := mustCompile(t, Spec{Allow: []string{"0.0.0.0/0", "::/0"}})
	for _, a := range []string{"10.0.0.1:443", "127.0.0.1:443", "169.254.169.254:80", "[fd00::1]:443", "100.64.0.1:443"} {
		if v := decideWith(p, a, nil); v.Allowed {
			t.Errorf("%s allowed by %s", a, v.Rule)
		}
	}
	if v := decideWith(p, "203.0.113.5:443", nil); !v.Allowed {
		t.Errorf("203.0.113.5 refused: %s", v.Rule)
	}
	// Not even an explicit private CIDR opens loopback or metadata.
	p = mustCompile(t, Spec{Allow: []string{"127.0.0.0/8", "169.254.169.254/32", "100.100.100.200/32", "100.64.0.0/10"}})
	for _, a := range []string{"127.0.0.1:443", "169.254.169.254:443", "100.100.100.200:443"} {
		if v := decideWith(p, a, nil); v.Allowed {
			t.Errorf("%s allowed by %s", a, v.Rule)
		}
	}
	if v := decideWith(p, "100.64.0.1:443", nil); !v.Allowed {
		t.Errorf("100.64.0.1 refused under an explicit CGNAT CIDR: %s", v.Rule)
	}
}

func TestNarrow(t *testing.T) {
	host := mustCompile(t, Spec{Preset: PresetRegistries, Allow: []string{"*.allowed.test"}})
	dns := map[string][]string{"registry.npmjs.org": {"203.0.113.1"}, "a.allowed.test": {"203.0.113.2"}, "other.test": {"203.0.113.3"}}
	// A session that names only npm: the rest of the host's list is gone.
	s, err := host.Narrow(Spec{Allow: []string{"registry.npmjs.org", "other.test"}})
	if err != nil {
		t.Fatal(err)
	}
	if v := decideWith(s, "registry.npmjs.org:443", dns); !v.Allowed {
		t.Errorf("npm refused in the narrowed policy: %s", v.Rule)
	}
	if v := decideWith(s, "a.allowed.test:443", dns); v.Allowed || !strings.Contains(v.Rule, "no rule allows a.allowed.test") {
		t.Errorf("a.allowed.test under the narrowed policy: %+v", v)
	}
	// ... and it cannot widen: other.test is not the host's.
	if v := decideWith(s, "other.test:443", dns); v.Allowed {
		t.Errorf("the session widened the host's policy: %+v", v)
	}
	// Nor a port.
	s2, err := host.Narrow(Spec{Allow: []string{"registry.npmjs.org:8443"}})
	if err != nil {
		t.Fatal(err)
	}
	if v := decideWith(s2, "registry.npmjs.org:8443", dns); v.Allowed {
		t.Errorf("the session opened a port: %+v", v)
	}
	// Deny only.
	s3, err := host.Narrow(Spec{Deny: []string{"*.allowed.test"}})
	if err != nil {
		t.Fatal(err)
	}
	if v := decideWith(s3, "a.allowed.test:443", dns); v.Allowed || !strings.Contains(v.Rule, "deny *.allowed.test") {
		t.Errorf("deny-only narrowing: %+v", v)
	}
	if v := decideWith(s3, "registry.npmjs.org:443", dns); !v.Allowed {
		t.Errorf("deny-only narrowing refused npm: %+v", v)
	}
	// The preset none in a session: nothing.
	s4, err := host.Narrow(Spec{Preset: PresetNone})
	if err != nil {
		t.Fatal(err)
	}
	if v := decideWith(s4, "registry.npmjs.org:443", dns); v.Allowed {
		t.Errorf("preset none allowed npm: %+v", v)
	}
	if s4.Preset() != PresetRegistries {
		t.Errorf("Preset() = %q; want the host's", s4.Preset())
	}
}

func TestCompileErrors(t *testing.T) {
	for _, c := range []struct {
		spec Spec
		want string
	}{
		{Spec{Preset: "everything"}, `unknown preset "everything"`},
		{Spec{Allow: []string{"*.*.example"}}, `allow entry "*.*.example"`},
		{Spec{Allow: []string{"10.0.0.0/33"}}, "not a CIDR"},
		{Spec{Allow: []string{"example.com:0"}}, `allow entry "example.com:0"`},
		{Spec{Allow: []string{"example.com:99999"}}, `allow entry "example.com:99999"`},
		{Spec{Allow: []string{"*.10.0.0.1"}}, "wildcard over an address"},
		{Spec{Allow: []string{""}}, "empty"},
		{Spec{Deny: []string{"*"}}, "denies everything"},
		{Spec{Ports: []int{0}}, "not a port"},
		{Spec{Allow: []string{"http://example.com"}}, `allow entry "http://example.com"`},
	} {
		_, err := Compile(c.spec)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Compile(%+v) = %v; want ~%q", c.spec, err, c.want)
		}
	}
}

func TestAnyName(t *testing.T) {
	p := mustCompile(t, Spec{Allow: []string{"*"}})
	dns := map[string][]string{"anything.test": {"203.0.113.1"}, "lo.test": {"127.0.0.1"}}
	if v := decideWith(p, "anything.test:443", dns); !v.Allowed {
		t.Errorf("* refused a public name: %+v", v)
	}
	if v := decideWith(p, "lo.test:443", dns); v.Allowed {
		t.Errorf("* allowed loopback: %+v", v)
	}
	if v := decideWith(p, "203.0.113.1:443", dns); v.Allowed {
		t.Errorf("* allowed an IP literal: %+v", v)
	}
}

func TestNote(t *testing.T) {
	if Note(nil) != "" {
		t.Fatal("a note with nothing refused")
	}
	n := Note([]Refusal{
		{Dest: "example.com:443", Reason: "egress: example.com is not an allowed domain (allowed: a); ask the operator to add it"},
		{Dest: "127.0.0.1:80", Reason: "egress: 127.0.0.1 is a loopback address, which a sandbox may never reach"},
	})
	want := "[egress refused 2 destinations: example.com is not an allowed domain (allowed: a); ask the operator to add it; 127.0.0.1 is a loopback address, which a sandbox may never reach]"
	if n != want {
		t.Errorf("Note = %q\nwant %q", n, want)
	}
	var r refusals
	for range 3 {
		r.add("c1", "example.com:443", "egress: x")
	}
	r.add("c2", "other:443", "egress: y")
	if got := r.take("c1"); len(got) != 1 {
		t.Errorf("refusals of c1 = %v; want one", got)
	}
	if got := r.take("c1"); got != nil {
		t.Errorf("refusals of c1 taken twice: %v", got)
	}
	if got := r.take("c2"); len(got) != 1 {
		t.Errorf("refusals of c2 = %v", got)
	}
}

func TestBudget(t *testing.T) {
	b := NewBudget(100)
	if got := b.take(60); got != 60 {
		t.Fatalf("take 60 = %d", got)
	}
	if got := b.take(60); got != 40 {
		t.Fatalf("take 60 more = %d; want 40", got)
	}
	if got := b.take(1); got != 0 {
		t.Fatalf("take past the end = %d", got)
	}
	var unlimited *Budget
	if unlimited.take(1<<40) != 1<<40 || unlimited.left() != -1 {
		t.Fatal("a nil budget limits")
	}
}

func TestAnyPortEntry(t *testing.T) {
	p := mustCompile(t, Spec{Allow: []string{"git.example.test:*", "198.51.100.0/24:*"}, Deny: []string{"git.example.test:25"}})
	dns := map[string][]string{"git.example.test": {"203.0.113.9"}}
	for _, c := range []struct {
		dest    string
		allowed bool
	}{
		{"git.example.test:22", true}, {"git.example.test:443", true}, {"git.example.test:25", false},
		{"198.51.100.9:5432", true}, {"198.51.100.9:80", true},
	} {
		if v := decideWith(p, c.dest, dns); v.Allowed != c.allowed {
			t.Errorf("%s: %+v", c.dest, v)
		}
	}
	allow, deny := p.Entries()
	if len(allow) != 2 || allow[0].Port != AnyPort || allow[0].Text != "git.example.test:*" || allow[1].Text != "198.51.100.0/24:*" || len(deny) != 1 || deny[0].Port != 25 {
		t.Errorf("Entries: %+v %+v", allow, deny)
	}
}

// docs/NETWORK.md's presets table is the presets, row for row.
func TestPresetsInDocs(t *testing.T) {
	b, err := os.ReadFile("../../docs/NETWORK.md")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, line := range strings.Split(string(b), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			continue
		}
		preset := strings.TrimSpace(cells[1])
		if _, ok := presets[preset]; !ok {
			continue
		}
		got[preset] = append(got[preset], strings.Trim(strings.TrimSpace(cells[2]), "`"))
	}
	for name, want := range presets {
		if len(want) == 0 {
			continue
		}
		if !slices.Equal(got[name], want) {
			t.Errorf("docs/NETWORK.md lists preset %s as\n%v\nthe code has\n%v", name, got[name], want)
		}
	}
	// README's Network section has the default preset's table, one row per ecosystem.
	b, err = os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n## Network\n")
	sec, _, _ = strings.Cut(sec, "\n## ")
	var readme []string
	for _, line := range strings.Split(sec, "\n") {
		cells := strings.Split(line, "|")
		if !ok || len(cells) < 4 {
			continue
		}
		for _, f := range strings.Fields(cells[2]) {
			if strings.HasPrefix(f, "`") {
				readme = append(readme, strings.Trim(f, "`"))
			}
		}
	}
	if !slices.Equal(readme, presets[PresetRegistries]) {
		t.Errorf("README.md's Network section lists the registries preset as\n%v\nthe code has\n%v", readme, presets[PresetRegistries])
	}
}

// When this host's addresses cannot be read, an address that would have been checked
// against them is refused, saying so; one refused by its class is refused as before.
func TestHostAddrsUnknownRefuses(t *testing.T) {
	p := mustCompile(t, Spec{Allow: []string{"10.9.0.0/16", "203.0.113.0/24"}})
	unknown := func(netip.Addr) (bool, error) { return false, errors.New("netlink: unavailable") }
	for _, c := range []struct{ dest, rule, reason string }{
		{"10.9.1.1:443", "host addresses unknown", "egress: 10.9.1.1 port 443 could not be checked against this host's own addresses"},
		{"203.0.113.5:443", "host addresses unknown", "which the gateway could not read; try again"},
		{"127.0.0.1:443", "always refused: loopback", "a loopback address"},
	} {
		hs, port, _ := splitHostPort(c.dest, 0)
		h, err := parseHost(hs)
		if err != nil {
			t.Fatal(err)
		}
		v := p.checkAddrs(h, port, p.checkHost(h, port), []netip.Addr{h.addr}, unknown)
		if v.Allowed || !strings.HasPrefix(v.Rule, c.rule) || !strings.Contains(v.Reason, c.reason) {
			t.Errorf("%s: %+v; want refused by %q saying %q", c.dest, v, c.rule, c.reason)
		}
	}
}

// Compile's errors say which field of the Spec is at fault (the configuration names its key
// from it), as a *SpecError, not in their text.
func TestCompileErrorNamesTheField(t *testing.T) {
	for _, c := range []struct {
		spec  Spec
		field string
	}{
		{Spec{Preset: "nope"}, "preset"},
		{Spec{Allow: []string{"bad host!"}}, "allow"},
		{Spec{Deny: []string{"bad host!"}}, "deny"},
		{Spec{Deny: []string{"*"}}, "deny"},
		{Spec{Ports: []int{70000}}, "ports"},
	} {
		_, err := Compile(c.spec)
		se, ok := errors.AsType[*SpecError](err)
		if !ok || se.Field != c.field {
			t.Errorf("%+v: %v (%T), want a *SpecError of field %s", c.spec, err, err, c.field)
		}
	}
}

// An allowed destination with no route to it says so, whether the host or its network is
// unreachable (the errnos, not their texts: EHOSTUNREACH's says "no route to host").
func TestDialFailureNoRoute(t *testing.T) {
	h, err := parseHost("registry.test")
	if err != nil {
		t.Fatal(err)
	}
	for _, errno := range []syscall.Errno{syscall.EHOSTUNREACH, syscall.ENETUNREACH} {
		err := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", errno)}
		v := dialFailure(decision{h: h, port: 443}, fmt.Errorf("dial: %w", err))
		if !strings.HasSuffix(v.Reason, "there is no route to it") {
			t.Errorf("%v: %q", errno, v.Reason)
		}
	}
}
