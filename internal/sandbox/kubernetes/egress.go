package kubernetes

// sandbox.network egress on Kubernetes. A pod runs on another machine than the host's
// egress gateway, so no socket can be handed over as the local provider does. Instead the
// pod's agent listens on 127.0.0.1:sandbox.EgressPort (every command gets
// sandbox.EgressEnv, as in a local sandbox) and carries each connection over TCP to this
// relay, which the provider listens on at kubernetes.egress_listen and which pods reach at
// kubernetes.egress_address. Each relayed connection opens with an envd.EgressHello naming
// its sandbox by envd.EgressKey of the sandbox's access token; the relay serves the rest
// through that sandbox's door of the gateway, with its policy, budget and audit. A
// connection whose key names no sandbox of this provider is closed.
//
// What keeps the pod from going around the relay is the namespace's NetworkPolicy
// (deploy/kubernetes-sandboxes/networkpolicy-egress.yaml: egress only to the relay's
// address), which only a network plugin that enforces NetworkPolicy makes true: toolhost
// requires kubernetes.network_policy, and doctor probes whether the cluster enforces it
// (probe.go).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/envd"
)

// envRelay gives the agent the relay's address (cmd/toolhost-agent).
const envRelay = "TOOLHOST_AGENT_EGRESS_RELAY"

// helloTimeout bounds the wait for a relayed connection's hello; maxHellos the connections
// that have not sent theirs yet (one more is closed), so that whatever reaches the relay
// address cannot hold its descriptors.
const (
	helloTimeout = 10 * time.Second
	maxHellos    = 256
)

// relay is the provider's egress relay: one listener for every sandbox with network
// egress, made with the first.
type relay struct {
	l      net.Listener
	addr   string // what pods dial
	log    *slog.Logger
	hellos chan struct{}

	mu    sync.Mutex
	doors map[string]sandbox.EgressDoor // by envd.EgressKey
	wg    sync.WaitGroup                // the accept loop and every connection
}

// relayAddr is the address pods reach the relay at: kubernetes.egress_address, else the
// listen address when it names a host (its port as bound).
func relayAddr(advertise string, bound net.Addr) (string, error) {
	if advertise != "" {
		return advertise, nil
	}
	tcp, ok := bound.(*net.TCPAddr)
	if !ok || tcp.IP.IsUnspecified() || tcp.IP.IsLoopback() {
		return "", fmt.Errorf("the egress relay listens on %s, which pods cannot reach by that address: set kubernetes.egress_address to an address of this host they reach", bound)
	}
	return bound.String(), nil
}

// egressRelay starts the relay once and returns it.
func (p *Provider) egressRelay() (*relay, error) {
	p.relayMu.Lock()
	defer p.relayMu.Unlock()
	if p.relayClosed {
		return nil, fmt.Errorf("the kubernetes provider is closed: %w", sandbox.ErrUnavailable)
	}
	if p.relay != nil {
		return p.relay, nil
	}
	if p.cfg.EgressListen == "" {
		return nil, fmt.Errorf("network %q: set kubernetes.egress_listen (and kubernetes.egress_address) so that sandbox pods reach this host's egress gateway (docs/KUBERNETES.md#network): %w",
			sandbox.NetworkEgress, sandbox.ErrUnsupported)
	}
	l, err := net.Listen("tcp", p.cfg.EgressListen)
	if err != nil {
		return nil, fmt.Errorf("egress relay: listen on %s (kubernetes.egress_listen): %w", p.cfg.EgressListen, err)
	}
	addr, err := relayAddr(p.cfg.EgressAddress, l.Addr())
	if err != nil {
		l.Close()
		return nil, err
	}
	r := &relay{l: l, addr: addr, log: p.log.With("component", "egress relay"), hellos: make(chan struct{}, maxHellos),
		doors: map[string]sandbox.EgressDoor{}}
	r.wg.Add(1)
	go r.serve() // counted in r.wg: close closes the listener
	p.relay = r
	p.log.Info("egress relay listening", "listen", l.Addr().String(), "pods_dial", addr)
	return r, nil
}

// serve accepts until the listener is closed.
func (r *relay) serve() {
	defer r.wg.Done()
	for {
		c, err := r.l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			r.log.Debug("accept", "err", err)
			time.Sleep(10 * time.Millisecond) // EMFILE and the like: do not spin
			continue
		}
		select {
		case r.hellos <- struct{}{}:
		default:
			c.Close() // too many waiting for their hello
			continue
		}
		r.wg.Add(1)
		go r.serveConn(c) // counted in r.wg; close ends its door, and the door the connection
	}
}

// serveConn reads a connection's hello and hands the rest to its sandbox's door.
func (r *relay) serveConn(c net.Conn) {
	defer r.wg.Done()
	_ = c.SetReadDeadline(time.Now().Add(helloTimeout))
	h, err := envd.ReadEgressHello(c)
	<-r.hellos
	if err != nil {
		r.log.Debug("a relayed connection without a valid hello", "remote", c.RemoteAddr().String(), "err", err)
		c.Close()
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	r.mu.Lock()
	door := r.doors[h.Key]
	r.mu.Unlock()
	if door == nil {
		r.log.Debug("a relayed connection for no sandbox of this host", "remote", c.RemoteAddr().String())
		c.Close()
		return
	}
	door.ServeConn(c, commandLabel(h.Command))
}

// add makes key's connections go to door.
func (r *relay) add(key string, door sandbox.EgressDoor) {
	r.mu.Lock()
	r.doors[key] = door
	r.mu.Unlock()
}

// remove forgets key and closes its door (and every connection it serves).
func (r *relay) remove(key string) {
	r.mu.Lock()
	door := r.doors[key]
	delete(r.doors, key)
	r.mu.Unlock()
	if door != nil {
		door.Close()
	}
}

// close stops the relay: no more connections; every door left is closed.
func (r *relay) close() {
	r.l.Close()
	r.mu.Lock()
	doors := r.doors
	r.doors = map[string]sandbox.EgressDoor{}
	r.mu.Unlock()
	for _, d := range doors {
		d.Close()
	}
	r.wg.Wait()
}

// commandLabel keeps a command tag the agent sent if it looks like one (the sandbox's
// word: a label in the audit at most).
func commandLabel(s string) string {
	if len(s) > 64 || strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != "" {
		return ""
	}
	return s
}

// egressLink is a sandbox's place in the relay.
type egressLink struct {
	r    *relay
	key  string
	door sandbox.EgressDoor
	// trust is the PEM certificates the sandbox trusts besides its image's: Egress.Trust
	// and the door's CA.
	trust []byte
}

// openEgress opens the sandbox's door of the gateway and registers it under the key of
// token, before the pod exists (its agent may relay from its first command). nil without
// network egress.
func (p *Provider) openEgress(opts sandbox.CreateOptions, name, token string) (*egressLink, error) {
	if opts.Network != sandbox.NetworkEgress {
		return nil, nil
	}
	return p.openDoor(opts.Egress, name, envd.EgressKey(token))
}

// openDoor opens the sandbox's door of eg's gateway and registers it in the relay under
// key.
func (p *Provider) openDoor(eg *sandbox.Egress, name, key string) (*egressLink, error) {
	if eg == nil || eg.Gateway == nil {
		return nil, fmt.Errorf("network %q needs the host's egress gateway", sandbox.NetworkEgress)
	}
	r, err := p.egressRelay()
	if err != nil {
		return nil, err
	}
	door, err := eg.Gateway.Open(name)
	if err != nil {
		return nil, fmt.Errorf("open the egress gateway for the sandbox: %w", err)
	}
	r.add(key, door)
	trust := append(append([]byte(nil), eg.Trust...), door.CACert()...)
	return &egressLink{r: r, key: key, door: door, trust: trust}, nil
}

// env is the environment of a new sandbox's commands: env, and with certificates to trust
// the variables that point TLS clients at them (env's own win).
func (e *egressLink) env(env map[string]string) map[string]string {
	if e == nil || len(bytes.TrimSpace(e.trust)) == 0 {
		return env
	}
	out := envd.TrustEnv()
	maps.Copy(out, env)
	return out
}

// giveTrust gives sb's agent the certificates its TLS clients must trust besides the
// image's (sandbox.egress.ca_file, and the gateway's CA for sandbox.egress.inject), as a
// local sandbox is given them by a bind mount; nothing without a link or certificates.
func (e *egressLink) giveTrust(ctx context.Context, sb *Sandbox, timeout time.Duration) error {
	if e == nil || len(bytes.TrimSpace(e.trust)) == 0 {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := sb.client.SetTrust(cctx, e.trust); err != nil {
		return fmt.Errorf("install the certificates it trusts (sandbox.egress.ca_file, inject): %w", err)
	}
	return nil
}

// takeEgress moves the egress of a reconnected sandbox (sb, made by another process) to
// this provider's relay and eg's gateway: its door registered under a fresh key, then the
// agent told the relay's address and that key over its authenticated channel. From then
// on the process that held the sandbox before gets none of its connections.
func (p *Provider) takeEgress(ctx context.Context, sb *Sandbox, eg *sandbox.Egress) error {
	if eg == nil || eg.Gateway == nil {
		return fmt.Errorf("it has network %q, and this process was given no egress gateway to serve it with (its egress would stay with the process that held it): %w",
			sandbox.NetworkEgress, sandbox.ErrUnsupported)
	}
	link, err := p.openDoor(eg, sb.id, randomHex(32))
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, p.cfg.RequestTimeout)
	err = sb.client.SetEgressRelay(cctx, envd.EgressRelayRequest{Relay: link.addr(), Key: link.key})
	cancel()
	if err == nil {
		// This host's gateway injects with a CA of its own.
		err = link.giveTrust(ctx, sb, p.cfg.RequestTimeout)
	}
	if err != nil {
		link.close()
		return fmt.Errorf("give its agent this host's egress relay: %w", err)
	}
	sb.egress = link
	return nil
}

// addr is the relay's address for the pod; "" without a link.
func (e *egressLink) addr() string {
	if e == nil {
		return ""
	}
	return e.r.addr
}

// close ends the sandbox's connections through the gateway.
func (e *egressLink) close() {
	if e != nil {
		e.r.remove(e.key)
	}
}

var _ sandbox.EgressReporter = (*Sandbox)(nil)

// EgressRefused is what the gateway refused to command, once; nil without a gateway.
func (s *Sandbox) EgressRefused(command string) []string {
	if s.egress == nil {
		return nil
	}
	return s.egress.door.Refused(command)
}

// Close stops the egress relay (sandbox.Closer); the provider makes no sandbox with
// network egress after it.
func (p *Provider) Close(ctx context.Context) error {
	p.relayMu.Lock()
	r := p.relay
	p.relay, p.relayClosed = nil, true
	p.relayMu.Unlock()
	if r == nil {
		return nil
	}
	done := make(chan struct{})
	go func() { // ends when the relay's connections have
		r.close()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close the kubernetes provider's egress relay: %w", ctx.Err())
	}
}
