package egress

import (
	"net/netip"
	"slices"
	"testing"
)

// The watch of this process's namespace reads what the standard library reads, answers
// every spelling of an address, and fails once closed.
func TestHostAddrsOfThisNamespace(t *testing.T) {
	h, err := WatchHostAddrs(nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := h.src.list()
	if err != nil {
		t.Fatal(err)
	}
	want, err := interfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	norm := func(as []netip.Addr) []netip.Addr {
		out := make([]netip.Addr, 0, len(as))
		for _, a := range as {
			out = append(out, a.Unmap().WithZone(""))
		}
		slices.SortFunc(out, netip.Addr.Compare)
		return slices.Compact(out)
	}
	if g, w := norm(got), norm(want); !slices.Equal(g, w) {
		t.Errorf("the kernel's list through netlink %v; net.InterfaceAddrs %v", g, w)
	}
	for _, c := range []struct {
		addr string
		own  bool
	}{
		{"127.0.0.1", true},
		{"::ffff:127.0.0.1", true},
		{"203.0.113.254", false}, // TEST-NET-3: never a test machine's
	} {
		if own, err := h.Has(netip.MustParseAddr(c.addr)); err != nil || own != c.own {
			t.Errorf("Has(%s) = %v, %v; want %v", c.addr, own, err, c.own)
		}
	}
	for _, a := range want {
		if own, err := h.Has(a); err != nil || !own {
			t.Errorf("Has(%s), an address of an interface here, = %v, %v", a, own, err)
		}
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Has(netip.MustParseAddr("127.0.0.1")); err == nil {
		t.Error("Has answered after Close")
	}
}

// A check costs a drain of the notifications, when nothing changed.
func BenchmarkHostAddrsHas(b *testing.B) {
	h, err := WatchHostAddrs(nil)
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	a := netip.MustParseAddr("203.0.113.254")
	for b.Loop() {
		if _, err := h.Has(a); err != nil {
			b.Fatal(err)
		}
	}
}

// What a change costs (and what reading the list at every connection would).
func BenchmarkHostAddrsList(b *testing.B) {
	h, err := WatchHostAddrs(nil)
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	for b.Loop() {
		if _, err := h.src.list(); err != nil {
			b.Fatal(err)
		}
	}
}

// The standard library's reading of the same list, for comparison.
func BenchmarkInterfaceAddrs(b *testing.B) {
	for b.Loop() {
		if _, err := interfaceAddrs(); err != nil {
			b.Fatal(err)
		}
	}
}
