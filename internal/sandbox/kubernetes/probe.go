package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
)

// Whether the cluster enforces NetworkPolicy cannot be read from its API: a NetworkPolicy
// is accepted and stored whether or not a network plugin enforces it. So doctor tries:
// it opens a listener on this host, at the address pods reach the egress relay at, on a
// port of its own that no policy allows, makes a sandbox with network none (its policy
// allows no egress at all), and has it connect there directly. If the connection arrives,
// nothing enforces the policy: sandboxes of network none and egress reach whatever the
// pod network does, the egress gateway bypassed.

// probeConnect bounds the sandbox's attempt to connect.
const probeConnect = 5 * time.Second

// ProbeNetworkPolicy makes a sandbox with network none and has it connect directly to a
// listener of this host that no policy allows. It says whether the cluster kept the
// connection out (the NetworkPolicy is enforced), and what it found, in one line.
func (p *Provider) ProbeNetworkPolicy(ctx context.Context) (enforced bool, detail string) {
	host, err := p.probeHost()
	if err != nil {
		return false, "whether the cluster enforces NetworkPolicy was not probed: " + err.Error()
	}
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return false, fmt.Sprintf("whether the cluster enforces NetworkPolicy was not probed: listen on %s: %v", host, err)
	}
	defer l.Close()
	arrived := make(chan string, 1)
	go func() { // ends when l is closed (deferred above)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			select {
			case arrived <- c.RemoteAddr().String():
			default:
			}
			c.Close()
		}
	}()
	target := l.Addr().String()
	sb, err := p.Create(ctx, sandbox.CreateOptions{Network: sandbox.NetworkNone, Timeout: p.cfg.ReadyTimeout + time.Minute,
		Labels: map[string]string{"purpose": "doctor-network-probe"}})
	if err != nil {
		return false, "whether the cluster enforces NetworkPolicy was not probed: making a sandbox with network none: " + err.Error()
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*p.cfg.RequestTimeout)
		defer cancel()
		_ = sb.Close(cctx)
	}()
	tcp := l.Addr().(*net.TCPAddr)
	script := "exec 3<>/dev/tcp/" + tcp.IP.String() + "/" + strconv.Itoa(tcp.Port) + " && echo connected"
	ectx, cancel := context.WithTimeout(ctx, probeConnect+30*time.Second)
	res, err := sb.Exec(ectx, sandbox.ExecRequest{Argv: []string{"timeout", strconv.Itoa(int(probeConnect / time.Second)), "bash", "-c", script}})
	cancel()
	if err != nil {
		return false, "whether the cluster enforces NetworkPolicy was not probed: running the probe in sandbox " + sb.ID() + ": " + err.Error()
	}
	// The listener's word, not the sandbox's: the connection arrived or it did not.
	select {
	case from := <-arrived:
		return false, fmt.Sprintf("the cluster does not enforce NetworkPolicy: a sandbox pod with network none (its policy allows no egress) connected to this host at %s (from %s). Sandboxes of network none and egress reach whatever the pod network does, the egress gateway bypassed: install a network plugin that enforces NetworkPolicy (Calico, Cilium, ...), or use sandbox.network: host knowingly (docs/NETWORK.md#on-kubernetes)", target, from)
	case <-time.After(time.Second):
	}
	if res.ExitCode == 0 {
		return false, fmt.Sprintf("the probe is inconclusive: the sandbox reports a connection to %s that never arrived here (something between answers for this host)", target)
	}
	return true, fmt.Sprintf("the cluster enforces NetworkPolicy: a sandbox pod with network none could not connect to this host at %s; sandboxes reach the network only as their policy allows (the egress relay, for network egress)", target)
}

// probeHost is the address of this host the probe's sandbox connects to: that of the
// egress relay as pods dial it.
func (p *Provider) probeHost() (string, error) {
	addr := p.cfg.EgressAddress
	if addr == "" {
		addr = p.cfg.EgressListen
	}
	if addr == "" {
		return "", errors.New("kubernetes.egress_listen is empty, so no address of this host that pods reach is known (set it to probe)")
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("kubernetes.egress_address %q: %w", addr, err)
	}
	ip := net.ParseIP(host)
	if ip == nil || ip.IsUnspecified() || ip.IsLoopback() {
		return "", fmt.Errorf("the egress relay's address %q is not an IP address of this host that pods reach (set kubernetes.egress_address to one)", addr)
	}
	return host, nil
}
