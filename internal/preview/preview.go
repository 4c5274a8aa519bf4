// Package preview maps a port inside a sandbox to a listener on the host's loopback whose
// connections go through the sandbox's agent (envd's port dial): what the local and the
// kubernetes providers' PreviewURL serve. A preview needs nothing of the sandbox's
// network, reaches only a port that a process of the sandbox listens on, and each
// connection is checked again by the agent. The listeners and their connections end with
// the sandbox (Forwarders.Close).
package preview

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/envd"
	"github.com/toolhost/toolhost/internal/splice"
)

// dialTimeout bounds reaching the sandbox's port for one accepted connection.
const dialTimeout = 10 * time.Second

// Sandbox is what the forwarders of one sandbox need of it.
type Sandbox struct {
	// ID names the sandbox in errors.
	ID string
	// Ports lists the ports its processes listen on (sandbox.PortLister).
	Ports func(ctx context.Context) ([]envd.ListeningPort, error)
	// Dial reaches a port inside it through its agent.
	Dial func(ctx context.Context, port int) (net.Conn, error)
	// Refused is why it takes no more calls, or nil (then a closed sandbox's preview is
	// sandbox.ErrClosed).
	Refused func() error
	Log     *slog.Logger
}

// Forwarders are the host-side forwarders of one sandbox; the zero value is ready. Every
// goroutine they start ends once Close has run.
type Forwarders struct {
	mu     sync.Mutex
	closed bool
	byPort map[int]*forwarder
	conns  map[net.Conn]struct{} // accepted and dialed connections alive
	wg     sync.WaitGroup
	// ctx ends with Close; set with the first forwarder, before any goroutine starts.
	ctx    context.Context
	cancel context.CancelFunc
}

type forwarder struct {
	port int
	l    net.Listener
	url  *url.URL
}

// URL maps port inside sb to http://127.0.0.1:HOSTPORT/ on the host: a listener on the
// host's loopback, started on the first call for the port and reused after. A port no
// process of sb listens on, or one it listens on only on an address the agent cannot dial,
// is an error wrapping sandbox.ErrPortClosed.
func (p *Forwarders) URL(ctx context.Context, sb Sandbox, port int) (*url.URL, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("preview of port %d in sandbox %s: not a port (1..65535)", port, sb.ID)
	}
	ports, err := sb.Ports(ctx)
	if err != nil {
		return nil, fmt.Errorf("preview of port %d: %w", port, err)
	}
	i := slices.IndexFunc(ports, func(p envd.ListeningPort) bool { return p.Port == port })
	if i < 0 {
		return nil, fmt.Errorf("preview of port %d in sandbox %s: no process in the sandbox listens on port %d (listening: %s): %w",
			port, sb.ID, port, portList(ports), sandbox.ErrPortClosed)
	}
	if ports[i].Dial == "" {
		return nil, fmt.Errorf("preview of port %d in sandbox %s: %s (pid %d) listens on port %d only on %v, not on 127.0.0.1 or ::1 alone: %w",
			port, sb.ID, ports[i].Cmd, ports[i].PID, port, ports[i].Addrs, sandbox.ErrPortClosed)
	}
	u, err := p.url(sb, port)
	if err != nil {
		return nil, fmt.Errorf("preview of port %d in sandbox %s: %w", port, sb.ID, err)
	}
	return u, nil
}

func portList(ps []envd.ListeningPort) string {
	if len(ps) == 0 {
		return "none"
	}
	var b []byte
	for i, p := range ps {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = strconv.AppendInt(b, int64(p.Port), 10)
		b = append(b, " ("...)
		b = append(b, p.Cmd...)
		b = append(b, ')')
	}
	return string(b)
}

// url returns the forwarder of port, starting it if needed.
func (p *Forwarders) url(sb Sandbox, port int) (*url.URL, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		if sb.Refused != nil {
			if err := sb.Refused(); err != nil {
				return nil, err
			}
		}
		return nil, sandbox.ErrClosed
	}
	if f := p.byPort[port]; f != nil {
		return f.url, nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen on the host's loopback: %w", err)
	}
	f := &forwarder{port: port, l: l, url: &url.URL{Scheme: "http", Host: l.Addr().String(), Path: "/"}}
	if p.byPort == nil {
		p.byPort = map[int]*forwarder{}
		p.conns = map[net.Conn]struct{}{}
		p.ctx, p.cancel = context.WithCancel(context.Background())
	}
	p.byPort[port] = f
	p.wg.Add(1)
	go func() { // owned by p: Close closes the listener and waits
		defer p.wg.Done()
		p.accept(sb, f)
	}()
	sb.Log.Info("preview listening", "port", port, "url", f.url.String())
	return f.url, nil
}

// accept serves one forwarder's listener until it is closed.
func (p *Forwarders) accept(sb Sandbox, f *forwarder) {
	backoff := 5 * time.Millisecond
	for {
		c, err := f.l.Accept()
		if err != nil {
			if p.isClosed() || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors and the like: wait a little rather than spin.
			sb.Log.Warn("preview accept", "port", f.port, "err", err)
			time.Sleep(backoff)
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		if !p.track(c) {
			return
		}
		go func() { // counted by track; Close closes c and waits
			defer p.wg.Done()
			p.forward(sb, f.port, c)
		}()
	}
}

// forward joins one accepted connection to the port in the sandbox. A failed dial
// closes the accepted connection at once: its client sees the connection end.
func (p *Forwarders) forward(sb Sandbox, port int, c net.Conn) {
	defer p.untrack(c)
	// Close cancels p.ctx, and with it a dial under way.
	ctx, cancel := context.WithTimeout(p.ctx, dialTimeout)
	up, err := sb.Dial(ctx, port)
	cancel()
	if err != nil {
		sb.Log.Debug("preview connection refused", "port", port, "from", c.RemoteAddr().String(), "err", err)
		c.Close()
		return
	}
	if !p.track(up) {
		c.Close()
		return
	}
	defer p.wg.Done()
	defer p.untrack(up)
	in, out := splice.Splice(c, up)
	sb.Log.Debug("preview connection closed", "port", port, "bytes_in", in, "bytes_out", out)
}

func (p *Forwarders) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// track registers a connection and counts one wg for whoever serves it; false (with c
// closed) once Close has begun.
func (p *Forwarders) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	p.wg.Add(1)
	return true
}

func (p *Forwarders) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// Close stops every listener and connection and waits for their goroutines.
func (p *Forwarders) Close() {
	p.mu.Lock()
	p.closed = true
	if p.cancel != nil {
		p.cancel()
	}
	for _, f := range p.byPort {
		_ = f.l.Close()
	}
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
