package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"golang.org/x/net/idna"
)

// A destination arrives as text the sandbox wrote: a CONNECT target, a URL's host, a
// SOCKS5 name. Before any rule sees it, it is brought to one form, so that no spelling
// of a name or an address reaches a rule the canonical form would not: names in lower
// case ASCII (IDNA's lookup mapping, so a Unicode name and its punycode are one name),
// without the trailing dot; addresses as netip.Addr, whichever of the spellings
// inet_aton(3) accepts was used (127.1, 2130706433, 0x7f.1, 017700000001), IPv4-mapped
// IPv6 unmapped.

// host is a destination's host part, normalized: either a name or an address.
type host struct {
	name string     // lower-case ASCII, no trailing dot; "" for an address
	addr netip.Addr // valid for an IP literal
	// raw is the text as the sandbox wrote it (bounded), for messages about an address
	// written in an unusual spelling.
	raw string
}

func (h host) isAddr() bool { return h.addr.IsValid() }

// String is the canonical form: the name, or the address.
func (h host) String() string {
	if h.isAddr() {
		return h.addr.String()
	}
	return h.name
}

// lookupProfile is IDNA's lookup mapping (case and width folded, Unicode to punycode)
// with label validation, but without UTS 46's CheckHyphens, which would refuse real names
// with "--" in the third and fourth places; the ASCII result is checked by validName.
var lookupProfile = idna.New(idna.MapForLookup(), idna.BidiRule(), idna.Transitional(false),
	idna.CheckHyphens(false), idna.CheckJoiners(true), idna.VerifyDNSLength(true))

// errNotName is why a host is neither a name nor an address.
var errNotName = errors.New("not a valid domain name or IP address")

// maxHostLen bounds the text a host may be; DNS names are at most 253 characters.
const maxHostLen = 255

// parseHost normalizes a host as the sandbox wrote it (no port; brackets around an IPv6
// literal allowed).
func parseHost(s string) (host, error) {
	raw := s
	if len(raw) > maxHostLen {
		raw = raw[:maxHostLen]
		return host{raw: raw}, fmt.Errorf("%w: longer than %d characters", errNotName, maxHostLen)
	}
	if s == "" {
		return host{raw: raw}, fmt.Errorf("%w: empty", errNotName)
	}
	if strings.HasPrefix(s, "[") {
		if !strings.HasSuffix(s, "]") {
			return host{raw: raw}, fmt.Errorf("%w: unbalanced [", errNotName)
		}
		a, err := netip.ParseAddr(s[1 : len(s)-1])
		if err != nil || !a.Is6() || a.Zone() != "" {
			return host{raw: raw}, fmt.Errorf("%w: [%s] is not an IPv6 address", errNotName, s[1:len(s)-1])
		}
		return host{addr: a.Unmap(), raw: raw}, nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		if a.Zone() != "" {
			return host{raw: raw}, fmt.Errorf("%w: an address with a zone", errNotName)
		}
		return host{addr: a.Unmap(), raw: raw}, nil
	}
	// A trailing dot makes a name absolute; it names the same host. Only one.
	t := strings.TrimSuffix(s, ".")
	if a, ok := parseInetAton(t); ok {
		return host{addr: a, raw: raw}, nil
	}
	name, err := lookupProfile.ToASCII(t)
	if err != nil {
		return host{raw: raw}, fmt.Errorf("%w: %v", errNotName, err)
	}
	name = strings.ToLower(name)
	if err := validName(name); err != nil {
		return host{raw: raw}, err
	}
	return host{name: name, raw: raw}, nil
}

// validName checks an ASCII name: labels of letters, digits and hyphens, 1 to 63 long,
// not starting or ending with a hyphen, at most 253 in all, at least two labels, and a
// last label that is not all digits (which something downstream could read as an
// address).
func validName(n string) error {
	if n == "" || len(n) > 253 {
		return fmt.Errorf("%w: %d characters", errNotName, len(n))
	}
	labels := strings.Split(n, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return fmt.Errorf("%w: empty or over-long label in %q", errNotName, n)
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("%w: label %q starts or ends with a hyphen", errNotName, l)
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return fmt.Errorf("%w: %q holds %q", errNotName, n, c)
			}
		}
	}
	if len(labels) < 2 {
		return fmt.Errorf("%w: %q is a single label (a name on the internet has a dot)", errNotName, n)
	}
	last := labels[len(labels)-1]
	if strings.Trim(last, "0123456789") == "" {
		return fmt.Errorf("%w: %q ends in a number", errNotName, n)
	}
	return nil
}

// parseInetAton reads the IPv4 spellings inet_aton(3) accepts, which getaddrinfo, curl
// and browsers accept too: one to four parts separated by dots, each decimal, octal
// (leading 0) or hex (leading 0x), the last part filling the remaining bytes (127.1 is
// 127.0.0.1, 2130706433 is 127.0.0.1). Anything a resolver could turn into an address
// without DNS is an address here.
func parseInetAton(s string) (netip.Addr, bool) {
	parts := strings.Split(s, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	vals := make([]uint64, len(parts))
	for i, p := range parts {
		v, ok := parseAtonPart(p)
		if !ok {
			return netip.Addr{}, false
		}
		vals[i] = v
	}
	var ip uint64
	n := len(vals)
	for i := 0; i < n-1; i++ {
		if vals[i] > 0xff {
			return netip.Addr{}, false
		}
		ip |= vals[i] << (8 * (3 - i))
	}
	last := vals[n-1]
	if last >= 1<<(8*(5-n)) {
		return netip.Addr{}, false
	}
	ip |= last
	return netip.AddrFrom4([4]byte{byte(ip >> 24), byte(ip >> 16), byte(ip >> 8), byte(ip)}), true
}

func parseAtonPart(p string) (uint64, bool) {
	if p == "" {
		return 0, false
	}
	base := 10
	digits := p
	switch {
	case len(p) > 1 && (p[:2] == "0x" || p[:2] == "0X"):
		base, digits = 16, p[2:]
		if digits == "" {
			return 0, true // "0x" is 0 to inet_aton
		}
	case len(p) > 1 && p[0] == '0':
		base, digits = 8, p[1:]
	}
	v, err := strconv.ParseUint(digits, base, 32)
	if err != nil {
		return 0, false
	}
	return v, true
}

// splitHostPort splits "host:port" as a CONNECT target or a URL's host writes it, the
// host possibly a bracketed IPv6 literal. A missing port takes def (0: required).
func splitHostPort(s string, def int) (string, int, error) {
	h, p := s, ""
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return "", 0, fmt.Errorf("%q: unbalanced [", s)
		}
		h, p = s[:end+1], s[end+1:]
		if p != "" {
			if p[0] != ':' {
				return "", 0, fmt.Errorf("%q: text after ]", s)
			}
			p = p[1:]
		} else if def == 0 {
			return "", 0, fmt.Errorf("%q: no port", s)
		}
	} else if i := strings.LastIndexByte(s, ':'); i >= 0 {
		if strings.Count(s, ":") > 1 {
			return "", 0, fmt.Errorf("%q: an IPv6 address must be in brackets", s)
		}
		h, p = s[:i], s[i+1:]
	} else if def == 0 {
		return "", 0, fmt.Errorf("%q: no port", s)
	}
	if p == "" {
		if def == 0 {
			return "", 0, fmt.Errorf("%q: empty port", s)
		}
		return h, def, nil
	}
	port, err := strconv.ParseUint(p, 10, 16)
	if err != nil || port == 0 {
		return "", 0, fmt.Errorf("%q: bad port %q", s, p)
	}
	return h, int(port), nil
}
