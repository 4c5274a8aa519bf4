package egress

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// Resolver finds the addresses of a name for the gateway. The sandbox never resolves
// names itself (it has no resolver and no route): the gateway does, and every address it
// gets is checked before it connects.
type Resolver interface {
	// LookupNetIP returns the IPv4 and IPv6 addresses of name, a normalized absolute name
	// without its trailing dot.
	LookupNetIP(ctx context.Context, name string) ([]netip.Addr, error)
}

// Dialer connects to an address; net.Dialer is one. The gateway dials upstream and asks
// its DNS server through it.
type Dialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// ErrNoSuchHost: the resolver says the name does not exist (or has no address).
var ErrNoSuchHost = errors.New("no such host")

// SystemResolver resolves through the host's own resolver (resolv.conf), never the
// sandbox's. The name is looked up as absolute (with its trailing dot), so no search
// domain of the host is appended to it.
type SystemResolver struct{}

// LookupNetIP implements Resolver.
func (SystemResolver) LookupNetIP(ctx context.Context, name string) ([]netip.Addr, error) {
	as, err := net.DefaultResolver.LookupNetIP(ctx, "ip", name+".")
	if err != nil {
		var de *net.DNSError
		if errors.As(err, &de) && de.IsNotFound {
			return nil, fmt.Errorf("%s: %w", name, ErrNoSuchHost)
		}
		return nil, err
	}
	return as, nil
}

// DNSResolver asks one DNS server (sandbox.egress.resolver) for A and AAAA records, over
// UDP and, when an answer is truncated, over TCP. It reads no file of the host: no
// hosts file, no search domains.
type DNSResolver struct {
	Server netip.AddrPort
	// Dialer reaches the server; nil is a net.Dialer.
	Dialer Dialer
	// Timeout bounds one query; 0 is 2 s. A query is tried twice over UDP.
	Timeout time.Duration
}

// LookupNetIP implements Resolver.
func (r *DNSResolver) LookupNetIP(ctx context.Context, name string) ([]netip.Addr, error) {
	type result struct {
		addrs []netip.Addr
		err   error
	}
	types := []dnsmessage.Type{dnsmessage.TypeA, dnsmessage.TypeAAAA}
	results := make(chan result, len(types))
	for _, t := range types {
		go func() { // owned by this call: each ends within the query's timeouts
			as, err := r.query(ctx, name, t)
			results <- result{as, err}
		}()
	}
	var addrs []netip.Addr
	var errs []error
	notFound := 0
	for range types {
		res := <-results
		switch {
		case errors.Is(res.err, ErrNoSuchHost):
			notFound++
		case res.err != nil:
			errs = append(errs, res.err)
		}
		addrs = append(addrs, res.addrs...)
	}
	if len(addrs) > 0 {
		slices.SortStableFunc(addrs, func(a, b netip.Addr) int { // IPv4 first
			switch {
			case a.Is4() && !b.Is4():
				return -1
			case !a.Is4() && b.Is4():
				return 1
			}
			return 0
		})
		return addrs, nil
	}
	if notFound == len(types) || len(errs) == 0 {
		return nil, fmt.Errorf("%s: %w", name, ErrNoSuchHost)
	}
	return nil, fmt.Errorf("resolve %s with %s: %w", name, r.Server, errors.Join(errs...))
}

func (r *DNSResolver) dialer() Dialer {
	if r.Dialer != nil {
		return r.Dialer
	}
	return &net.Dialer{}
}

// query asks for one record type, following CNAMEs within the answer.
func (r *DNSResolver) query(ctx context.Context, name string, t dnsmessage.Type) ([]netip.Addr, error) {
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	q, err := dnsmessage.NewName(name + ".")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	var id [2]byte
	_, _ = rand.Read(id[:])
	msg := dnsmessage.Message{
		Header:    dnsmessage.Header{ID: binary.BigEndian.Uint16(id[:]), RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: q, Type: t, Class: dnsmessage.ClassINET}},
	}
	packed, err := msg.Pack()
	if err != nil {
		return nil, err
	}
	var ans dnsmessage.Message
	var lastErr error
	for attempt := 0; attempt < 2; attempt++ {
		ans, lastErr = r.exchange(ctx, "udp", packed, msg.ID, timeout)
		if lastErr == nil || ctx.Err() != nil {
			break
		}
	}
	if lastErr == nil && ans.Truncated {
		ans, lastErr = r.exchange(ctx, "tcp", packed, msg.ID, timeout)
	}
	if lastErr != nil {
		return nil, lastErr
	}
	switch ans.RCode {
	case dnsmessage.RCodeSuccess:
	case dnsmessage.RCodeNameError:
		return nil, fmt.Errorf("%s: %w", name, ErrNoSuchHost)
	default:
		return nil, fmt.Errorf("%s: the DNS server answered %s", name, ans.RCode)
	}
	if len(ans.Questions) != 1 || ans.Questions[0].Name != q || ans.Questions[0].Type != t {
		return nil, fmt.Errorf("%s: the DNS server answered another question", name)
	}
	target := q
	var out []netip.Addr
	for hops := 0; hops < 8; hops++ {
		next := target
		for _, rr := range ans.Answers {
			if !equalNames(rr.Header.Name, target) {
				continue
			}
			switch b := rr.Body.(type) {
			case *dnsmessage.AResource:
				if t == dnsmessage.TypeA {
					out = append(out, netip.AddrFrom4(b.A))
				}
			case *dnsmessage.AAAAResource:
				if t == dnsmessage.TypeAAAA {
					out = append(out, netip.AddrFrom16(b.AAAA).Unmap())
				}
			case *dnsmessage.CNAMEResource:
				next = b.CNAME
			}
		}
		if len(out) > 0 || next == target {
			break
		}
		target = next
	}
	return out, nil
}

func equalNames(a, b dnsmessage.Name) bool {
	x, y := a.Data[:a.Length], b.Data[:b.Length]
	if len(x) != len(y) {
		return false
	}
	for i := range x {
		c, d := x[i], y[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if 'A' <= d && d <= 'Z' {
			d += 'a' - 'A'
		}
		if c != d {
			return false
		}
	}
	return true
}

// exchange sends one query and reads the answer with the same id.
func (r *DNSResolver) exchange(ctx context.Context, network string, q []byte, id uint16, timeout time.Duration) (dnsmessage.Message, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := r.dialer().DialContext(ctx, network, r.Server.String())
	if err != nil {
		return dnsmessage.Message{}, fmt.Errorf("reach the DNS server %s: %w", r.Server, err)
	}
	defer c.Close()
	if d, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(d)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	var ans dnsmessage.Message
	if network == "tcp" {
		b := make([]byte, 2+len(q))
		binary.BigEndian.PutUint16(b, uint16(len(q)))
		copy(b[2:], q)
		if _, err := c.Write(b); err != nil {
			return ans, fmt.Errorf("ask the DNS server %s: %w", r.Server, err)
		}
		var l [2]byte
		if _, err := io.ReadFull(c, l[:]); err != nil {
			return ans, fmt.Errorf("read the DNS server %s: %w", r.Server, err)
		}
		buf := make([]byte, binary.BigEndian.Uint16(l[:]))
		if _, err := io.ReadFull(c, buf); err != nil {
			return ans, fmt.Errorf("read the DNS server %s: %w", r.Server, err)
		}
		if err := ans.Unpack(buf); err != nil || ans.ID != id || !ans.Response {
			return ans, fmt.Errorf("the DNS server %s answered nonsense", r.Server)
		}
		return ans, nil
	}
	if _, err := c.Write(q); err != nil {
		return ans, fmt.Errorf("ask the DNS server %s: %w", r.Server, err)
	}
	buf := make([]byte, 1232)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return ans, fmt.Errorf("read the DNS server %s: %w", r.Server, err)
		}
		// A stray or forged datagram with another id is skipped, not believed.
		if err := ans.Unpack(buf[:n]); err == nil && ans.ID == id && ans.Response {
			return ans, nil
		}
	}
}

// cachingResolver keeps answers for a short while: a package install opens many
// connections to the same few hosts. What it keeps are addresses, checked again at every
// connect, so a cache changes nothing about what may be reached.
type cachingResolver struct {
	r   Resolver
	ttl time.Duration

	mu      sync.Mutex
	entries map[string]cacheEntry
}

type cacheEntry struct {
	addrs []netip.Addr
	until time.Time
}

const maxCacheEntries = 1024

func (c *cachingResolver) LookupNetIP(ctx context.Context, name string) ([]netip.Addr, error) {
	now := time.Now()
	c.mu.Lock()
	e, ok := c.entries[name]
	c.mu.Unlock()
	if ok && now.Before(e.until) {
		return slices.Clone(e.addrs), nil
	}
	as, err := c.r.LookupNetIP(ctx, name)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.entries == nil || len(c.entries) >= maxCacheEntries {
		c.entries = map[string]cacheEntry{}
	}
	c.entries[name] = cacheEntry{slices.Clone(as), now.Add(c.ttl)}
	c.mu.Unlock()
	return as, nil
}
