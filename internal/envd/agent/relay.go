//go:build linux

package agent

// The egress relay (EgressConfig.Relay): a sandbox on another machine than the host's
// gateway carries each connection to its egress port over TCP to the gateway's relay
// address, opened by an envd.EgressHello that names the sandbox by the key of its access
// token. The gateway decides every destination as for a local sandbox; the agent only
// carries bytes.

import (
	"context"
	"net"
	"time"

	"github.com/toolhost/toolhost/internal/envd"
	"github.com/toolhost/toolhost/internal/splice"
)

// maxRelays bounds the relayed connections open at once (the gateway bounds each
// sandbox's far lower, sandbox.egress.max_conns); one more is closed.
const maxRelays = 1024

// relayDialTimeout bounds the connection to the relay address.
const relayDialTimeout = 10 * time.Second

// relay carries c to the gateway's relay address in a goroutine of its own (counted in
// s.wg, its two ends in s.tunnels, so Close ends it); it closes c.
func (s *Server) relay(c *net.TCPConn, msg EgressMessage) {
	e := s.egress
	select {
	case e.relays <- struct{}{}:
	default:
		s.log.Debug("egress relay: too many connections open", "max", maxRelays)
		c.Close()
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		<-e.relays
		c.Close()
		return
	}
	s.tunnels[c] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() { // counted in s.wg: Close closes both ends
		defer s.wg.Done()
		defer func() { <-e.relays }()
		defer s.dropConn(c)
		ctx, cancel := context.WithTimeout(context.Background(), relayDialTimeout)
		up, err := (&net.Dialer{}).DialContext(ctx, "tcp", e.relay)
		cancel()
		if err != nil {
			s.log.Debug("egress relay: dial", "addr", e.relay, "err", err)
			c.Close()
			return
		}
		if !s.holdConn(up) {
			up.Close()
			c.Close()
			return
		}
		defer s.dropConn(up)
		_ = up.SetWriteDeadline(time.Now().Add(relayDialTimeout))
		if err := envd.WriteEgressHello(up, envd.EgressHello{Key: envd.EgressKey(*s.token.Load()), Command: msg.Command}); err != nil {
			s.log.Debug("egress relay: hello", "err", err)
			up.Close()
			c.Close()
			return
		}
		_ = up.SetWriteDeadline(time.Time{})
		splice.Splice(c, up)
	}()
}

// holdConn adds a connection to those Close ends; false once the server is closed.
func (s *Server) holdConn(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.tunnels[c] = struct{}{}
	return true
}

// dropConn removes a connection from those Close ends.
func (s *Server) dropConn(c net.Conn) {
	s.mu.Lock()
	delete(s.tunnels, c)
	s.mu.Unlock()
}
