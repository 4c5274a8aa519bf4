package toolhost

import (
	"context"
	"net"
	"net/netip"

	"github.com/toolhost/toolhost/internal/testhooks"
)

// Tests in other packages reach withEgressNet through testhooks.
func init() {
	testhooks.EgressNet = func(dial func(ctx context.Context, network, addr string) (net.Conn, error), hostAddrs func() ([]netip.Addr, error)) any {
		return withEgressNet(dial, hostAddrs)
	}
}
