//go:build linux

package agent

// The egress relay (EgressConfig.Relay): a sandbox on another machine than the host's
// gateway carries each connection to its egress port over TCP to the gateway's relay
// address, opened by an envd.EgressHello that names the sandbox by the key of its access
// token. The gateway decides every destination as for a local sandbox; the agent only
// carries bytes.

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/toolhost/toolhost/internal/envd"
	"github.com/toolhost/toolhost/internal/splice"
)

// maxRelays bounds the relayed connections open at once (the gateway bounds each
// sandbox's far lower, sandbox.egress.max_conns); one more is closed.
const maxRelays = 1024

// relayDialTimeout bounds the connection to the relay address.
const relayDialTimeout = 10 * time.Second

// relayTarget is a host's relay: its address, and the key that names the sandbox there
// ("" : envd.EgressKey of the agent's access token, the key of the host that created it).
type relayTarget struct {
	addr, key string
}

// relay carries c to t, the relay of the host that holds the sandbox, in a goroutine of
// its own (counted in s.wg, its two ends in s.tunnels, so Close ends it); it closes c.
func (s *Server) relay(c *net.TCPConn, msg EgressMessage, t *relayTarget) {
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
		up, err := (&net.Dialer{}).DialContext(ctx, "tcp", t.addr)
		cancel()
		if err != nil {
			s.log.Debug("egress relay: dial", "addr", t.addr, "err", err)
			c.Close()
			return
		}
		if !s.holdRelayed(up, t) {
			up.Close()
			c.Close()
			return
		}
		defer s.dropConn(up)
		key := t.key
		if key == "" {
			key = envd.EgressKey(*s.token.Load())
		}
		_ = up.SetWriteDeadline(time.Now().Add(relayDialTimeout))
		if err := envd.WriteEgressHello(up, envd.EgressHello{Key: key, Command: msg.Command}); err != nil {
			s.log.Debug("egress relay: hello", "err", err)
			up.Close()
			c.Close()
			return
		}
		_ = up.SetWriteDeadline(time.Time{})
		splice.Splice(c, up)
	}()
}

// holdRelayed adds a connection to t to those Close ends and a move of the relay ends;
// false once the server is closed or the relay has moved from t.
func (s *Server) holdRelayed(c net.Conn, t *relayTarget) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.egress.relay.Load() != t {
		return false
	}
	s.tunnels[c] = struct{}{}
	s.egress.relayed[c] = t
	return true
}

// dropConn removes a connection from those Close ends.
func (s *Server) dropConn(c net.Conn) {
	s.mu.Lock()
	delete(s.tunnels, c)
	if s.egress != nil {
		delete(s.egress.relayed, c)
	}
	s.mu.Unlock()
}

// handleEgressRelay moves the egress relay (envd.PathEgressRelay): the host that takes the
// sandbox over gives its own relay's address and the key that names the sandbox there.
// ServeHTTP let it through with the sandbox's access token only, which no process in the
// sandbox can read, so no process in it can carry its egress elsewhere. The connections
// carried to the earlier relay end: the earlier host serves the sandbox no more.
func (s *Server) handleEgressRelay(w http.ResponseWriter, r *http.Request) {
	e := s.egress
	switch {
	case e == nil || e.relay.Load() == nil:
		http.Error(w, "this agent does not relay its egress", http.StatusConflict)
		return
	case *s.token.Load() == "":
		// Whoever reaches an agent without a token is trusted: none may move its relay.
		http.Error(w, "this agent has no access token: its relay cannot be moved", http.StatusForbidden)
		return
	}
	var req envd.EgressRelayRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 4<<10)).Decode(&req); err != nil {
		http.Error(w, "bad egress relay: "+err.Error(), http.StatusBadRequest)
		return
	}
	if err := req.Check(); err != nil {
		http.Error(w, "bad egress relay: "+err.Error(), http.StatusBadRequest)
		return
	}
	t := &relayTarget{addr: req.Relay, key: req.Key}
	s.mu.Lock()
	e.relay.Store(t)
	var ended []net.Conn
	for c, to := range e.relayed {
		if to != t {
			ended = append(ended, c)
		}
	}
	s.mu.Unlock()
	for _, c := range ended {
		c.Close() // its splice ends, and closes the sandbox's end
	}
	s.log.Info("egress relay moved", "relay", req.Relay, "connections_ended", len(ended))
	w.WriteHeader(http.StatusNoContent)
}
