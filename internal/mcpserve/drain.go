package mcpserve

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// drainBound bounds how long the end of input waits for the answers still owed: the
// longest command a tool may run, and then some.
const drainBound = 15 * time.Minute

// drainAtEOF wraps a stream transport (stdio) so that the end of its input is reported
// only once every request read from it has been answered. Without it the SDK closes the
// connection at end of input and drops the answers of requests still running, so
// `printf 'initialize\ntools/list\n' | toolhost mcp` printed nothing.
func drainAtEOF(t mcp.Transport, log *slog.Logger) mcp.Transport {
	return &drainingTransport{t: t, log: log}
}

type drainingTransport struct {
	t   mcp.Transport
	log *slog.Logger
}

func (d *drainingTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := d.t.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &drainingConn{Connection: c, log: d.log, owed: map[any]int{}, settled: make(chan struct{}, 1)}, nil
}

// drainingConn counts the calls read and the answers written.
type drainingConn struct {
	mcp.Connection
	log *slog.Logger

	mu      sync.Mutex
	owed    map[any]int   // request id -> calls with it not yet answered
	settled chan struct{} // a token when an answer was written
}

func (c *drainingConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	if err == nil {
		if req, ok := msg.(*jsonrpc.Request); ok && req.IsCall() {
			c.mu.Lock()
			c.owed[req.ID.Raw()]++
			c.mu.Unlock()
		}
		return msg, nil
	}
	// The input ended (or failed): wait for the answers owed, then say so.
	bound := time.NewTimer(drainBound)
	defer bound.Stop()
	for {
		c.mu.Lock()
		n := len(c.owed)
		c.mu.Unlock()
		if n == 0 {
			return nil, err
		}
		select {
		case <-c.settled:
		case <-ctx.Done():
			return nil, err
		case <-bound.C:
			c.log.Warn("mcp: the input ended and answers are still owed after the bound; closing", "owed", n, "bound", drainBound)
			return nil, err
		}
	}
}

func (c *drainingConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	err := c.Connection.Write(ctx, msg)
	if resp, ok := msg.(*jsonrpc.Response); ok {
		c.mu.Lock()
		id := resp.ID.Raw()
		if c.owed[id] > 1 {
			c.owed[id]--
		} else {
			delete(c.owed, id)
		}
		c.mu.Unlock()
		select {
		case c.settled <- struct{}{}:
		default:
		}
	}
	return err
}
