package envd

// The agent's side of the port extensions (GET /toolhost/ports and /toolhost/dial; see
// the package documentation): which TCP ports the sandbox's processes listen on, read
// from /proc, and a tunnel to one of them.

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
)

// dialTimeout bounds the agent's connect to a port inside the sandbox.
const dialTimeout = 5 * time.Second

// tcpListen is the state column of /proc/net/tcp for LISTEN.
const tcpListen = "0A"

// Loopback addresses the dial extension may connect to; nothing else is ever dialed.
var (
	loop4 = netip.AddrFrom4([4]byte{127, 0, 0, 1})
	loop6 = netip.IPv6Loopback()
)

// listenSocket is one LISTEN row of /proc/net/tcp or /proc/net/tcp6.
type listenSocket struct {
	addr  netip.Addr // 4 bytes from tcp, 16 from tcp6 (v4-mapped included)
	port  int
	inode uint64
	v6    bool // from tcp6
}

// owner is a process holding a socket open.
type owner struct {
	pid int
	cmd string
}

// readListenSockets reads the LISTEN sockets of the agent's network namespace. With the
// host network that includes every listener of the host.
func readListenSockets(procDir string) ([]listenSocket, error) {
	var out []listenSocket
	for _, t := range []struct {
		name string
		v6   bool
	}{{"tcp", false}, {"tcp6", true}} {
		p := filepath.Join(procDir, "net", t.name)
		b, err := os.ReadFile(p)
		if err != nil {
			if t.v6 && errors.Is(err, fs.ErrNotExist) {
				continue // IPv6 disabled
			}
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
		socks, err := parseTCPTable(b, t.v6)
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", p, err)
		}
		out = append(out, socks...)
	}
	return out, nil
}

// parseTCPTable picks the LISTEN rows of a /proc/net/tcp{,6} table:
//
//	sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode ...
//	0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000 1000 0 12345 ...
func parseTCPTable(b []byte, v6 bool) ([]listenSocket, error) {
	var out []listenSocket
	for i, line := range bytes.Split(b, []byte("\n")) {
		f := strings.Fields(string(line))
		if i == 0 || len(f) < 10 || f[3] != tcpListen {
			continue
		}
		host, portHex, ok := strings.Cut(f[1], ":")
		if !ok {
			return nil, fmt.Errorf("line %d: local address %q", i+1, f[1])
		}
		port, err := strconv.ParseUint(portHex, 16, 16)
		if err != nil {
			return nil, fmt.Errorf("line %d: port %q: %w", i+1, portHex, err)
		}
		addr, err := parseHexAddr(host)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", i+1, err)
		}
		inode, err := strconv.ParseUint(f[9], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("line %d: inode %q: %w", i+1, f[9], err)
		}
		if inode == 0 {
			continue // no socket file behind it: nobody can hold it
		}
		out = append(out, listenSocket{addr: addr, port: int(port), inode: inode, v6: v6})
	}
	return out, nil
}

// parseHexAddr decodes the kernel's address column: the address's 32-bit words, each
// printed as a native-endian integer in hex.
func parseHexAddr(h string) (netip.Addr, error) {
	if len(h) != 8 && len(h) != 32 {
		return netip.Addr{}, fmt.Errorf("address %q: want 8 or 32 hex digits", h)
	}
	raw, err := hex.DecodeString(h)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("address %q: %w", h, err)
	}
	var b [16]byte
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(b[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	if len(raw) == 4 {
		return netip.AddrFrom4([4]byte(b[:4])), nil
	}
	return netip.AddrFrom16(b), nil
}

// socketInode reads "socket:[12345]", the link text of a socket descriptor.
func socketInode(link string) (uint64, bool) {
	s, ok := strings.CutPrefix(link, "socket:[")
	if !ok || !strings.HasSuffix(s, "]") {
		return 0, false
	}
	n, err := strconv.ParseUint(s[:len(s)-1], 10, 64)
	return n, err == nil
}

// socketOwners finds, for each inode in want, the lowest pid that holds it open among the
// processes visible in procDir. Inside a sandbox /proc is the sandbox's own pid namespace,
// so a socket no sandbox process holds (the host's, with the host network) is never found.
// Processes that vanish or hide their descriptors (not dumpable) are skipped.
func socketOwners(procDir string, want map[uint64]bool) map[uint64]owner {
	found := map[uint64]owner{}
	if len(want) == 0 {
		return found
	}
	d, err := os.Open(procDir)
	if err != nil {
		return found
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil || pid <= 0 {
			continue
		}
		fdDir := filepath.Join(procDir, name, "fd")
		fd, err := os.Open(fdDir)
		if err != nil {
			continue
		}
		fds, _ := fd.Readdirnames(-1)
		fd.Close()
		for _, n := range fds {
			link, err := os.Readlink(filepath.Join(fdDir, n))
			if err != nil {
				continue
			}
			inode, ok := socketInode(link)
			if !ok || !want[inode] {
				continue
			}
			if o, seen := found[inode]; !seen || pid < o.pid {
				found[inode] = owner{pid: pid}
			}
		}
	}
	for inode, o := range found {
		comm, _ := os.ReadFile(filepath.Join(procDir, strconv.Itoa(o.pid), "comm"))
		o.cmd = strings.TrimSpace(string(comm))
		found[inode] = o
	}
	return found
}

// portScan is one look at the listeners: all of them, and the owners of those a sandbox
// process holds.
type portScan struct {
	socks  []listenSocket
	owners map[uint64]owner
}

// scanPorts reads the listeners on port (0: every port) and their owners.
func (s *Server) scanPorts(port int) (portScan, error) {
	socks, err := readListenSockets(s.cfg.ProcDir)
	if err != nil {
		return portScan{}, err
	}
	if port != 0 {
		socks = slices.DeleteFunc(socks, func(l listenSocket) bool { return l.port != port })
	}
	want := make(map[uint64]bool, len(socks))
	for _, l := range socks {
		want[l.inode] = true
	}
	return portScan{socks: socks, owners: socketOwners(s.cfg.ProcDir, want)}, nil
}

// accepts reports whether a listener would take a connection to target (127.0.0.1 or
// ::1) on its port. A tcp6 socket bound to :: is taken to be dual-stack: for a socket
// outside the sandbox that is the safe guess (it counts as a conflict); for one inside, a
// wrong guess only means a refused connect, and the next target is tried.
func (l listenSocket) accepts(target netip.Addr) bool {
	a := l.addr
	if target.Is4() {
		if l.v6 && !a.Is4In6() {
			return a.IsUnspecified()
		}
		a = a.Unmap()
	} else if !l.v6 || a.Is4In6() {
		return false
	}
	return a == target || a.IsUnspecified()
}

// targets are the addresses the agent may dial for port, best first: loopback addresses
// that a sandbox socket accepts and no socket outside the sandbox does. The reason says
// why there is none.
func (ps portScan) targets(port int) ([]netip.AddrPort, string) {
	var mine, foreign []listenSocket
	for _, l := range ps.socks {
		if l.port != port {
			continue
		}
		if _, ok := ps.owners[l.inode]; ok {
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
		if !l.v6 || l.addr.Is4In6() {
			order = []netip.Addr{loop4, loop6}
			break
		}
	}
	var out []netip.AddrPort
	shared := false
	for _, t := range order {
		if !slices.ContainsFunc(mine, func(l listenSocket) bool { return l.accepts(t) }) {
			continue
		}
		if slices.ContainsFunc(foreign, func(l listenSocket) bool { return l.accepts(t) }) {
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
func (ps portScan) list() []ListeningPort {
	byPort := map[int]*ListeningPort{}
	for _, l := range ps.socks {
		o, ok := ps.owners[l.inode]
		if !ok {
			continue
		}
		lp := byPort[l.port]
		if lp == nil {
			lp = &ListeningPort{Port: l.port, PID: o.pid, Cmd: o.cmd}
			byPort[l.port] = lp
		}
		if o.pid < lp.PID {
			lp.PID, lp.Cmd = o.pid, o.cmd
		}
		if a := l.addr.String(); !slices.Contains(lp.Addrs, a) {
			lp.Addrs = append(lp.Addrs, a)
		}
	}
	out := make([]ListeningPort, 0, len(byPort))
	for _, lp := range byPort {
		slices.Sort(lp.Addrs)
		if ts, _ := ps.targets(lp.Port); len(ts) > 0 {
			lp.Dial = ts[0].String()
		}
		out = append(out, *lp)
	}
	slices.SortFunc(out, func(a, b ListeningPort) int { return a.Port - b.Port })
	return out
}

func (s *Server) handlePorts(w http.ResponseWriter, _ *http.Request) {
	ps, err := s.scanPorts(0)
	if err != nil {
		writeUnaryError(w, CodeInternal, "list listening ports: "+err.Error(), "")
		return
	}
	b, err := json.Marshal(PortsResponse{Ports: ps.list()})
	if err != nil {
		writeUnaryError(w, CodeInternal, "encode ports: "+err.Error(), "")
		return
	}
	w.Header().Set("Content-Type", contentJSON)
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(b)
}

// parsePort reads a port in 1..65535 written in plain decimal.
func parsePort(v string) (int, error) {
	if v == "" || len(v) > 5 || strings.Trim(v, "0123456789") != "" {
		return 0, badArg("port %q is not a number in 1..65535", v)
	}
	n, _ := strconv.Atoi(v)
	if n < 1 || n > 65535 {
		return 0, badArg("port %d is not in 1..65535", n)
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
	port, err := parsePort(r.URL.Query().Get(QueryPort))
	if err != nil {
		writeUnaryError(w, CodeInvalidArgument, err.Error(), "")
		return
	}
	if !headerHas(r.Header, "Connection", "upgrade") || !headerHas(r.Header, "Upgrade", UpgradeTCP) {
		w.Header().Set("Upgrade", UpgradeTCP)
		w.Header().Set("Connection", "Upgrade")
		writeUnaryError(w, CodeInvalidArgument, "dial needs Connection: Upgrade and Upgrade: "+UpgradeTCP, "")
		return
	}
	up, target, err := s.dialPort(r, port)
	if err != nil {
		code, kind := classify(err)
		writeUnaryError(w, code, err.Error(), kind)
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		up.Close()
		writeUnaryError(w, CodeInternal, "take over the connection: "+err.Error(), "")
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
	_, _ = brw.Writer.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + UpgradeTCP + "\r\n\r\n")
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
		in, out := Splice(conn, up)
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

// closeWriter is a connection that can end its write half (TCP, unix sockets).
type closeWriter interface{ CloseWrite() error }

// Splice copies between a and b in both directions until both have ended, then closes
// both. When one side ends its stream, the end is passed on to the other with CloseWrite
// (a half-close), so request-then-response protocols finish; a failure on either side, or
// a side that cannot half-close, ends both directions. Closing a or b from elsewhere stops
// it. It returns the bytes copied each way.
func Splice(a, b net.Conn) (aToB, bToA int64) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // owned by Splice, which waits for it
		defer wg.Done()
		bToA = pipe(a, b)
	}()
	aToB = pipe(b, a)
	wg.Wait()
	a.Close()
	b.Close()
	return aToB, bToA
}

func pipe(dst, src net.Conn) int64 {
	n, err := io.Copy(dst, src)
	if err == nil {
		if cw, ok := dst.(closeWriter); ok && cw.CloseWrite() == nil {
			return n
		}
	}
	dst.Close()
	src.Close()
	return n
}
