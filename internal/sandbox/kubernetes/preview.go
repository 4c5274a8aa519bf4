package kubernetes

import (
	"context"
	"errors"
	"fmt"
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

// previewDialTimeout bounds reaching the sandbox's port for one accepted connection.
const previewDialTimeout = 10 * time.Second

// PreviewURL maps port inside the sandbox to http://127.0.0.1:HOSTPORT/ on the host: a
// listener on the host's loopback, started on the first call for the port and reused
// after, whose connections go through the agent (client.Client.DialPort, with the access
// token), as the local provider's do. So a preview needs nothing of the pod but its
// agent's port, reaches only a port that a process of the sandbox listens on, and each
// connection is checked again by the agent. The listener and its connections end with the
// sandbox.
func (s *Sandbox) PreviewURL(ctx context.Context, port int) (*url.URL, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("preview of port %d in sandbox %s: not a port (1..65535)", port, s.id)
	}
	ports, err := s.Ports(ctx)
	if err != nil {
		return nil, fmt.Errorf("preview of port %d: %w", port, err)
	}
	i := slices.IndexFunc(ports, func(p envd.ListeningPort) bool { return p.Port == port })
	if i < 0 {
		return nil, fmt.Errorf("preview of port %d in sandbox %s: no process in the sandbox listens on port %d (listening: %s): %w",
			port, s.id, port, portList(ports), sandbox.ErrPortClosed)
	}
	if ports[i].Dial == "" {
		return nil, fmt.Errorf("preview of port %d in sandbox %s: %s (pid %d) listens on port %d only on %v, not on 127.0.0.1 or ::1 alone: %w",
			port, s.id, ports[i].Cmd, ports[i].PID, port, ports[i].Addrs, sandbox.ErrPortClosed)
	}
	u, err := s.previews.url(s, port)
	if err != nil {
		return nil, fmt.Errorf("preview of port %d in sandbox %s: %w", port, s.id, err)
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

// previews are the host-side forwarders of one sandbox. Every goroutine they start is
// counted in wg and ends once close has run.
type previews struct {
	mu     sync.Mutex
	closed bool
	byPort map[int]*forwarder
	conns  map[net.Conn]struct{} // accepted and dialed connections alive
	wg     sync.WaitGroup
	// ctx ends with close; set with the first forwarder, before any goroutine starts.
	ctx    context.Context
	cancel context.CancelFunc
}

type forwarder struct {
	port int
	l    net.Listener
	url  *url.URL
}

// url returns the forwarder of port, starting it if needed.
func (p *previews) url(s *Sandbox, port int) (*url.URL, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		if err := s.refused(); err != nil {
			return nil, err
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
	go func() { // owned by previews: close closes the listener and waits
		defer p.wg.Done()
		p.accept(s, f)
	}()
	s.log.Info("preview listening", "port", port, "url", f.url.String())
	return f.url, nil
}

// accept serves one forwarder's listener until it is closed.
func (p *previews) accept(s *Sandbox, f *forwarder) {
	backoff := 5 * time.Millisecond
	for {
		c, err := f.l.Accept()
		if err != nil {
			if p.isClosed() || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors and the like: wait a little rather than spin.
			s.log.Warn("preview accept", "port", f.port, "err", err)
			time.Sleep(backoff)
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		if !p.track(c) {
			return
		}
		go func() { // counted by track; close closes c and waits
			defer p.wg.Done()
			p.forward(s, f.port, c)
		}()
	}
}

// forward joins one accepted connection to the port in the sandbox. A failed dial
// closes the accepted connection at once: its client sees the connection end.
func (p *previews) forward(s *Sandbox, port int, c net.Conn) {
	defer p.untrack(c)
	// close cancels p.ctx, and with it a dial under way.
	ctx, cancel := context.WithTimeout(p.ctx, previewDialTimeout)
	up, err := s.client.DialPort(ctx, port)
	cancel()
	if err != nil {
		s.log.Debug("preview connection refused", "port", port, "from", c.RemoteAddr().String(), "err", err)
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
	s.log.Debug("preview connection closed", "port", port, "bytes_in", in, "bytes_out", out)
}

func (p *previews) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// track registers a connection and counts one wg for whoever serves it; false (with c
// closed) once close has begun.
func (p *previews) track(c net.Conn) bool {
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

func (p *previews) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// close stops every listener and connection and waits for their goroutines.
func (p *previews) close() {
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
