//go:build linux

package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/envd"
	"github.com/toolhost/toolhost/internal/envd/procnet"
	"github.com/toolhost/toolhost/internal/splice"
)

// dialTimeout bounds the agent's connect to a port inside the sandbox.
const dialTimeout = 5 * time.Second

// Loopback addresses the dial extension may connect to; nothing else is ever dialed.
var (
	loop4 = netip.AddrFrom4([4]byte{127, 0, 0, 1})
	loop6 = netip.IPv6Loopback()
)

// portScan is one look at the listeners: all of them, and the owners of those a sandbox
// process holds.
type portScan struct {
	socks  []procnet.Socket
	owners map[uint64]procnet.Owner
}

// scanPorts reads the listeners on port (0: every port) and their owners.
func (s *Server) scanPorts(port int) (portScan, error) {
	socks, err := procnet.ReadListenSockets(s.cfg.ProcDir)
	if err != nil {
		return portScan{}, err
	}
	if port != 0 {
		socks = slices.DeleteFunc(socks, func(l procnet.Socket) bool { return l.Port != port })
	}
	want := make(map[uint64]bool, len(socks))
	for _, l := range socks {
		want[l.Inode] = true
	}
	return portScan{socks: socks, owners: procnet.SocketOwners(s.cfg.ProcDir, want)}, nil
}

// targets are the addresses the agent may dial for port, best first: loopback addresses
// that a sandbox socket accepts and no socket outside the sandbox does. The reason says
// why there is none.
func (ps portScan) targets(port int) ([]netip.AddrPort, string) {
	var mine, foreign []procnet.Socket
	for _, l := range ps.socks {
		if l.Port != port {
			continue
		}
		if _, ok := ps.owners[l.Inode]; ok {
			mine = append(mine, l)
		} else {
			foreign = append(foreign, l)
		}
	}
	if len(mine) == 0 {
		return nil, fmt.Sprintf("no process in the sandbox listens on port %d", port)
	}
	order := []netip.Addr{loop6, loop4}
	for _, l := range mine {
		if !l.V6 || l.Addr.Is4In6() {
			order = []netip.Addr{loop4, loop6}
			break
		}
	}
	var out []netip.AddrPort
	shared := false
	for _, t := range order {
		if !slices.ContainsFunc(mine, func(l procnet.Socket) bool { return l.Accepts(t) }) {
			continue
		}
		if slices.ContainsFunc(foreign, func(l procnet.Socket) bool { return l.Accepts(t) }) {
			shared = true
			continue
		}
		out = append(out, netip.AddrPortFrom(t, uint16(port)))
	}
	switch {
	case len(out) > 0:
		return out, ""
	case shared:
		return nil, fmt.Sprintf("port %d is also listened on outside the sandbox; refusing to connect to it", port)
	default:
		return nil, fmt.Sprintf("port %d is listened on only on addresses other than 127.0.0.1 and ::1", port)
	}
}

// list groups the sandbox's listeners by port, sorted by port.
func (ps portScan) list() []envd.ListeningPort {
	byPort := map[int]*envd.ListeningPort{}
	for _, l := range ps.socks {
		o, ok := ps.owners[l.Inode]
		if !ok {
			continue
		}
		lp := byPort[l.Port]
		if lp == nil {
			lp = &envd.ListeningPort{Port: l.Port, PID: o.PID, Cmd: o.Cmd}
			byPort[l.Port] = lp
		}
		if o.PID < lp.PID {
			lp.PID, lp.Cmd = o.PID, o.Cmd
		}
		if a := l.Addr.String(); !slices.Contains(lp.Addrs, a) {
			lp.Addrs = append(lp.Addrs, a)
		}
	}
	out := make([]envd.ListeningPort, 0, len(byPort))
	for _, lp := range byPort {
		slices.Sort(lp.Addrs)
		if ts, _ := ps.targets(lp.Port); len(ts) > 0 {
			lp.Dial = ts[0].String()
		}
		out = append(out, *lp)
	}
	slices.SortFunc(out, func(a, b envd.ListeningPort) int { return a.Port - b.Port })
	return out
}

func (s *Server) handlePorts(w http.ResponseWriter, _ *http.Request) {
	ps, err := s.scanPorts(0)
	if err != nil {
		writeUnaryError(w, envd.CodeInternal, "list listening ports: "+err.Error(), "")
		return
	}
	ports := ps.list()
	if s.egress != nil { // the agent's own port to the gateway is no program's
		ports = slices.DeleteFunc(ports, func(p envd.ListeningPort) bool { return p.Port == s.egress.port })
	}
	b, err := json.Marshal(envd.PortsResponse{Ports: ports})
	if err != nil {
		writeUnaryError(w, envd.CodeInternal, "encode ports: "+err.Error(), "")
		return
	}
	w.Header().Set("Content-Type", envd.ContentJSON)
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(b)
}

// parsePort reads a port in 1..65535 written in plain decimal.
func parsePort(v string) (int, error) {
	if v == "" || len(v) > 5 || strings.Trim(v, "0123456789") != "" {
		return 0, envd.BadArg("port %q is not a number in 1..65535", v)
	}
	n, _ := strconv.Atoi(v)
	if n < 1 || n > 65535 {
		return 0, envd.BadArg("port %d is not in 1..65535", n)
	}
	return n, nil
}

// headerHas reports whether a comma-separated header lists token (case-insensitively).
func headerHas(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// handleDial connects to a port a sandbox process listens on and turns the request's
// connection into a raw tunnel to it.
func (s *Server) handleDial(w http.ResponseWriter, r *http.Request) {
	port, err := parsePort(r.URL.Query().Get(envd.QueryPort))
	if err != nil {
		writeUnaryError(w, envd.CodeInvalidArgument, err.Error(), "")
		return
	}
	if !headerHas(r.Header, "Connection", "upgrade") || !headerHas(r.Header, "Upgrade", envd.UpgradeTCP) {
		w.Header().Set("Upgrade", envd.UpgradeTCP)
		w.Header().Set("Connection", "Upgrade")
		writeUnaryError(w, envd.CodeInvalidArgument, "dial needs Connection: Upgrade and Upgrade: "+envd.UpgradeTCP, "")
		return
	}
	if s.egress != nil && port == s.egress.port {
		writeUnaryError(w, envd.CodeInvalidArgument, fmt.Sprintf("port %d is the sandbox's egress proxy, not a program's", port), "")
		return
	}
	up, target, err := s.dialPort(r, port)
	if err != nil {
		code, kind := envd.Classify(err)
		writeUnaryError(w, code, err.Error(), kind)
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		up.Close()
		writeUnaryError(w, envd.CodeInternal, "take over the connection: "+err.Error(), "")
		return
	}
	_ = conn.SetDeadline(time.Time{})
	// Bytes the client sent after its request (it should wait for the 101) go first.
	if n := brw.Reader.Buffered(); n > 0 {
		early, _ := brw.Reader.Peek(n)
		if _, err := up.Write(early); err != nil {
			up.Close()
			conn.Close()
			return
		}
	}
	_, _ = brw.Writer.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + envd.UpgradeTCP + "\r\n\r\n")
	if err := brw.Writer.Flush(); err != nil {
		up.Close()
		conn.Close()
		return
	}
	if !s.addTunnel(conn, up) {
		return // shutting down: addTunnel closed both
	}
	s.log.Debug("port tunnel opened", "port", port, "target", target)
	go func() { // owned by the server: Close closes both ends and waits
		defer s.wg.Done()
		in, out := splice.Splice(conn, up)
		s.dropTunnel(conn, up)
		s.log.Debug("port tunnel closed", "port", port, "bytes_in", in, "bytes_out", out)
	}()
}

// dialPort connects to port from inside the sandbox, on loopback only, when a sandbox
// process listens there; the listeners are read again once connected, so that a port
// that changed hands meanwhile is refused.
func (s *Server) dialPort(r *http.Request, port int) (net.Conn, netip.AddrPort, error) {
	ps, err := s.scanPorts(port)
	if err != nil {
		return nil, netip.AddrPort{}, fmt.Errorf("read listening ports: %w", err)
	}
	targets, why := ps.targets(port)
	if len(targets) == 0 {
		return nil, netip.AddrPort{}, fmt.Errorf("%s: %w", why, sandbox.ErrPortClosed)
	}
	d := net.Dialer{Timeout: dialTimeout}
	var errs []error
	for _, t := range targets {
		c, err := d.DialContext(r.Context(), "tcp", t.String())
		if err != nil {
			errs = append(errs, err)
			if errors.Is(err, syscall.ECONNREFUSED) {
				continue
			}
			break
		}
		again, err := s.scanPorts(port)
		if err == nil {
			if ts, _ := again.targets(port); slices.Contains(ts, t) {
				return c, t, nil
			}
		}
		c.Close()
		return nil, netip.AddrPort{}, fmt.Errorf("port %d changed hands while connecting: %w", port, sandbox.ErrPortClosed)
	}
	err = errors.Join(errs...)
	if errors.Is(err, syscall.ECONNREFUSED) {
		return nil, netip.AddrPort{}, fmt.Errorf("connect to port %d: %w: %w", port, err, sandbox.ErrPortClosed)
	}
	return nil, netip.AddrPort{}, fmt.Errorf("connect to port %d: %w", port, err)
}

// addTunnel registers the two ends of a tunnel with the server (and one count of wg for
// its goroutine); false, with both closed, once the server is closing.
func (s *Server) addTunnel(a, b net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		a.Close()
		b.Close()
		return false
	}
	s.tunnels[a] = struct{}{}
	s.tunnels[b] = struct{}{}
	s.wg.Add(1)
	return true
}

func (s *Server) dropTunnel(a, b net.Conn) {
	s.mu.Lock()
	delete(s.tunnels, a)
	delete(s.tunnels, b)
	s.mu.Unlock()
}
