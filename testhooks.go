package toolhost

import (
	"context"
	"net"

	"github.com/toolhost/toolhost/internal/egress"
	"github.com/toolhost/toolhost/internal/testhooks"
)

// Tests in other packages reach withEgressNet through testhooks.
func init() {
	testhooks.EgressNet = func(dial func(ctx context.Context, network, addr string) (net.Conn, error), hostAddrs *egress.HostAddrs) any {
		return withEgressNet(dial, hostAddrs)
	}
}
