// Package testhooks carries test-only options of the root package to tests in other
// packages (mcpserve's), which cannot name the root's unexported ones. Nothing but tests
// calls these.
package testhooks

import (
	"context"
	"net"

	"github.com/toolhost/toolhost/internal/egress"
)

// EgressNet, set by package toolhost, returns its test option (a toolhost.Option) that
// gives the egress gateway, the sandboxes' and web_fetch's, another network than this
// machine's: a test's own internet (internal/testnet).
var EgressNet func(dial func(ctx context.Context, network, addr string) (net.Conn, error), hostAddrs *egress.HostAddrs) any
