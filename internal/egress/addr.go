package egress

import (
	"errors"
	"fmt"
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

// HostAddrs knows this host's own addresses: every address of every interface of one
// network namespace (the one the gateway dials from), both families. A service of the
// host listening on 0.0.0.0 or [::] answers on each of them, so the gateway refuses them
// all, whatever the policy allows: inside an allowed private range too.
//
// It is kept current. On Linux the kernel tells it of every change (a netlink socket
// subscribed to address changes, drained before each check): a check costs one
// non-blocking read, and the list is read again only after a change (or when the kernel
// dropped notifications), from a socket of the same namespace, so it may be asked from
// any thread. An IPv4 address is announced before the call that added it returns, so it
// is refused from then on; an IPv6 one when it becomes usable. Elsewhere the list is read
// again at most every second.
//
// When the list cannot be read (at first, or after a change), Has fails and the gateway
// refuses what it would have had to check against it.
type HostAddrs struct {
	mu     sync.Mutex
	src    addrSource
	set    map[netip.Addr]struct{}
	stale  bool // set is not the kernel's list: read it before the next answer
	closed bool
}

// addrSource reads a namespace's addresses and says when they may have changed.
type addrSource interface {
	// changed reports whether the addresses may have changed since the last call.
	changed() bool
	list() ([]netip.Addr, error)
	close() error
}

// WatchHostAddrs watches the addresses of the calling thread's network namespace; with in
// (a function that runs its argument on a thread inside another namespace, as
// internal/testnet's), of that namespace. Close releases it.
func WatchHostAddrs(in func(func()) error) (*HostAddrs, error) {
	var src addrSource
	var err error
	open := func() { src, err = openAddrSource() }
	if in != nil {
		if ierr := in(open); ierr != nil {
			return nil, fmt.Errorf("watch the host's addresses: %w", ierr)
		}
	} else {
		open()
	}
	if err != nil {
		return nil, fmt.Errorf("watch the host's addresses: %w", err)
	}
	return &HostAddrs{src: src, stale: true}, nil
}

// pollHostAddrs reads the addresses list gives again at most every interval: where the
// kernel cannot tell of changes.
func pollHostAddrs(list func() ([]netip.Addr, error), interval time.Duration) *HostAddrs {
	return &HostAddrs{src: &pollSource{read: list, every: interval}, stale: true}
}

// processHostAddrs is the watch of the process's own network namespace that every
// gateway made without Config.HostAddrs shares; it lives as long as the process.
var processHostAddrs = sync.OnceValues(func() (*HostAddrs, error) { return WatchHostAddrs(nil) })

// Has reports whether a, in any spelling (IPv4-mapped, with a zone), is one of this
// host's addresses. It fails when the list could not be read.
func (h *HostAddrs) Has(a netip.Addr) (bool, error) {
	a = a.Unmap().WithZone("")
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false, errors.New("the watch of this host's addresses is closed")
	}
	// Drained before the list is read: a change after the drain is either in the list
	// or announced to the next check.
	if h.src.changed() || h.stale {
		list, err := h.src.list()
		if err != nil {
			h.stale = true
			return false, fmt.Errorf("read this host's addresses: %w", err)
		}
		h.set = make(map[netip.Addr]struct{}, len(list))
		for _, x := range list {
			h.set[x.Unmap().WithZone("")] = struct{}{}
		}
		h.stale = false
	}
	_, ok := h.set[a]
	return ok, nil
}

// Close releases the watch; Has fails after it.
func (h *HostAddrs) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil
	}
	h.closed = true
	return h.src.close()
}

// pollSource re-reads a list at most every interval.
type pollSource struct {
	read  func() ([]netip.Addr, error)
	every time.Duration
	taken time.Time
}

func (p *pollSource) changed() bool { return time.Since(p.taken) > p.every }

func (p *pollSource) list() ([]netip.Addr, error) {
	as, err := p.read()
	if err == nil {
		p.taken = time.Now()
	}
	return as, err
}

func (p *pollSource) close() error { return nil }

// interfaceAddrs lists the addresses of this network namespace's interfaces (the
// standard library's reading).
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
