package egress

import (
	"net"
	"net/netip"
	"sync"
	"time"
)

// Addresses a sandbox must never reach, whatever name led there: the gateway resolves
// every name itself and checks each address it got just before it connects, so DNS
// rebinding (a name that answers a public address to one lookup and 127.0.0.1 to the
// next) gains nothing.

// addrClass says why an address is refused, or "" for a public one.
type addrClass string

const (
	classPublic      addrClass = ""
	classLoopback    addrClass = "loopback"
	classPrivate     addrClass = "private"
	classCGNAT       addrClass = "private (carrier-grade NAT, RFC 6598)"
	classULA         addrClass = "private (IPv6 unique local)"
	classLinkLocal   addrClass = "link-local"
	classMetadata    addrClass = "a cloud metadata service"
	classMulticast   addrClass = "multicast"
	classUnspecified addrClass = "unspecified"
	classBroadcast   addrClass = "broadcast"
	classReserved    addrClass = "reserved"
	classHost        addrClass = "this host's own"
)

// privateClass reports whether a class may be allowed by an explicit allow CIDR inside
// its range (an operator's mirror on 10.1.2.3): the private ranges only. Loopback,
// link-local (metadata), multicast, unspecified, broadcast, reserved and the host's own
// addresses are refused always.
func (c addrClass) private() bool {
	return c == classPrivate || c == classCGNAT || c == classULA
}

type classRange struct {
	p     netip.Prefix
	class addrClass
}

var (
	metadataAddrs = []netip.Addr{
		netip.MustParseAddr("169.254.169.254"), // AWS, GCP, Azure, DigitalOcean, OpenStack...
		netip.MustParseAddr("169.254.170.2"),   // AWS ECS task metadata
		netip.MustParseAddr("fd00:ec2::254"),   // AWS over IPv6
		netip.MustParseAddr("100.100.100.200"), // Alibaba Cloud
	}
	// v4Ranges are checked in order; the first match decides.
	v4Ranges = []classRange{
		{netip.MustParsePrefix("0.0.0.0/8"), classUnspecified}, // "this network"
		{netip.MustParsePrefix("127.0.0.0/8"), classLoopback},
		{netip.MustParsePrefix("10.0.0.0/8"), classPrivate},
		{netip.MustParsePrefix("172.16.0.0/12"), classPrivate},
		{netip.MustParsePrefix("192.168.0.0/16"), classPrivate},
		{netip.MustParsePrefix("100.64.0.0/10"), classCGNAT},
		{netip.MustParsePrefix("169.254.0.0/16"), classLinkLocal},
		{netip.MustParsePrefix("192.0.0.0/24"), classReserved},  // IETF protocol assignments
		{netip.MustParsePrefix("198.18.0.0/15"), classReserved}, // benchmarking
		{netip.MustParsePrefix("224.0.0.0/4"), classMulticast},
		{netip.MustParsePrefix("255.255.255.255/32"), classBroadcast},
		{netip.MustParsePrefix("240.0.0.0/4"), classReserved},
	}
	v6Ranges = []classRange{
		{netip.MustParsePrefix("::/128"), classUnspecified},
		{netip.MustParsePrefix("::1/128"), classLoopback},
		{netip.MustParsePrefix("fc00::/7"), classULA},
		{netip.MustParsePrefix("fe80::/10"), classLinkLocal},
		{netip.MustParsePrefix("fec0::/10"), classReserved}, // site-local, deprecated
		{netip.MustParsePrefix("ff00::/8"), classMulticast},
		{netip.MustParsePrefix("100::/64"), classReserved},     // discard
		{netip.MustParsePrefix("2001::/32"), classReserved},    // Teredo: a tunnel to anywhere
		{netip.MustParsePrefix("2001:10::/28"), classReserved}, // ORCHID
	}
	// v6Embedding are IPv6 forms that carry an IPv4 address a translator reaches: each is
	// judged by the IPv4 address inside.
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	nat64Loc  = netip.MustParsePrefix("64:ff9b:1::/48")
	v4compat  = netip.MustParsePrefix("::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
)

// classify says why a is refused regardless of policy, or classPublic. It does not know
// the host's own addresses (see hostAddrs).
func classify(a netip.Addr) addrClass {
	a = a.Unmap()
	for _, m := range metadataAddrs {
		if a == m {
			return classMetadata
		}
	}
	if a.Is4() {
		for _, r := range v4Ranges {
			if r.p.Contains(a) {
				return r.class
			}
		}
		return classPublic
	}
	if a.Zone() != "" {
		return classLinkLocal
	}
	b := a.As16()
	switch {
	case nat64.Contains(a), v4compat.Contains(a) && a != netip.IPv6Unspecified() && a != netip.IPv6Loopback():
		return embedded(b[12:16])
	case nat64Loc.Contains(a):
		// RFC 6052 with a /48 prefix: the IPv4 address sits in bytes 6..8 and 9..10
		// (byte 8 is the reserved "u" octet).
		return embedded([]byte{b[6], b[7], b[9], b[10]})
	case sixToFour.Contains(a):
		return embedded(b[2:6])
	}
	for _, r := range v6Ranges {
		if r.p.Contains(a) {
			return r.class
		}
	}
	return classPublic
}

// embedded judges an IPv4 address carried inside an IPv6 one; a public one is still
// reached through a translator, which is as good as the IPv4 address itself.
func embedded(v4 []byte) addrClass {
	c := classify(netip.AddrFrom4([4]byte(v4)))
	return c
}

// hostAddrs knows the addresses of this host's own interfaces (a service listening on
// 0.0.0.0 is reachable through any of them), refreshed at most every hostAddrsTTL.
type hostAddrs struct {
	list func() ([]netip.Addr, error)

	mu    sync.Mutex
	set   map[netip.Addr]bool
	taken time.Time
}

const hostAddrsTTL = 5 * time.Second

// interfaceAddrs lists the addresses of this network namespace's interfaces.
func interfaceAddrs() ([]netip.Addr, error) {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(as))
	for _, a := range as {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}

// has reports whether a is one of this host's addresses. When the list cannot be read,
// the last one known stays in use (and at first, nothing is known: the classes above
// still refuse loopback and private addresses).
func (h *hostAddrs) has(a netip.Addr) bool {
	a = a.Unmap().WithZone("")
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.set == nil || time.Since(h.taken) > hostAddrsTTL {
		if list, err := h.list(); err == nil {
			h.set = make(map[netip.Addr]bool, len(list))
			for _, x := range list {
				h.set[x.Unmap().WithZone("")] = true
			}
		}
		h.taken = time.Now()
	}
	return h.set[a]
}
