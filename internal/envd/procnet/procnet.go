package procnet

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/toolhost/toolhost/internal/envd"
)

// tcpListen is the state column of /proc/net/tcp for LISTEN.
const tcpListen = "0A"

// ListeningPorts parses the kernel's TCP tables (the text of /proc/net/tcp and
// /proc/net/tcp6, as read inside a sandbox) and returns the ports in LISTEN state, sorted,
// with the addresses they are bound on. owner, when not nil, names the process holding a
// socket (by its inode); PID and Cmd are the lowest-numbered owner's. Dial is left empty.
func ListeningPorts(tcp, tcp6 []byte, Owner func(inode uint64) (pid int, cmd string)) ([]envd.ListeningPort, error) {
	var all []Socket
	for i, b := range [][]byte{tcp, tcp6} {
		if len(b) == 0 {
			continue
		}
		socks, err := ParseTCPTable(b, i == 1)
		if err != nil {
			return nil, err
		}
		all = append(all, socks...)
	}
	byPort := map[int]*envd.ListeningPort{}
	for _, s := range all {
		lp := byPort[s.Port]
		if lp == nil {
			lp = &envd.ListeningPort{Port: s.Port}
			byPort[s.Port] = lp
		}
		if a := s.Addr.String(); !slices.Contains(lp.Addrs, a) {
			lp.Addrs = append(lp.Addrs, a)
		}
		if Owner != nil {
			if pid, cmd := Owner(s.Inode); pid > 0 && (lp.PID == 0 || pid < lp.PID) {
				lp.PID, lp.Cmd = pid, cmd
			}
		}
	}
	out := make([]envd.ListeningPort, 0, len(byPort))
	for _, lp := range byPort {
		slices.Sort(lp.Addrs)
		out = append(out, *lp)
	}
	slices.SortFunc(out, func(a, b envd.ListeningPort) int { return a.Port - b.Port })
	return out, nil
}

// listenSocket is one LISTEN row of /proc/net/tcp or /proc/net/tcp6.
type Socket struct {
	Addr  netip.Addr // 4 bytes from tcp, 16 from tcp6 (v4-mapped included)
	Port  int
	Inode uint64
	V6    bool // from tcp6
}

// Owner is a process holding a socket open.
type Owner struct {
	PID int
	Cmd string
}

// ReadListenSockets reads the LISTEN sockets of the agent's network namespace. With the
// host network that includes every listener of the host.
func ReadListenSockets(procDir string) ([]Socket, error) {
	var out []Socket
	for _, t := range []struct {
		name string
		v6   bool
	}{{"tcp", false}, {"tcp6", true}} {
		p := filepath.Join(procDir, "net", t.name)
		f, err := os.Open(p)
		if err != nil {
			if t.v6 && errors.Is(err, fs.ErrNotExist) {
				continue // IPv6 disabled
			}
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
		err = ScanTCPTable(f, func(r Row) bool {
			out = r.appendListen(out, t.v6)
			return true
		})
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", p, err)
		}
	}
	return out, nil
}

// ParseTCPTable picks the LISTEN rows of a /proc/net/tcp{,6} table (see ScanTCPTable),
// leaving out those without a socket file (inode 0: nobody can hold them).
func ParseTCPTable(b []byte, v6 bool) ([]Socket, error) {
	var out []Socket
	err := ScanTCPTable(bytes.NewReader(b), func(r Row) bool {
		out = r.appendListen(out, v6)
		return true
	})
	return out, err
}

// Row is one row of a /proc/net/tcp{,6} table.
type Row struct {
	Local, Remote netip.AddrPort // 4-byte addresses from tcp, 16 from tcp6
	State         string         // the state column, "0A" for LISTEN
	// RxQueue is the bytes waiting to be read, or for a listener the connections
	// waiting to be accepted.
	RxQueue int
	Inode   uint64
}

// Listen reports whether the row is a listening socket.
func (r Row) Listen() bool { return r.State == tcpListen }

// appendListen appends the row to out if it is a listener with a socket file (inode 0 has
// none: nobody can hold it).
func (r Row) appendListen(out []Socket, v6 bool) []Socket {
	if !r.Listen() || r.Inode == 0 {
		return out
	}
	return append(out, Socket{Addr: r.Local.Addr(), Port: int(r.Local.Port()), Inode: r.Inode, V6: v6})
}

// maxTCPLine bounds one line of a TCP table (the kernel's are under 200 bytes).
const maxTCPLine = 1 << 10

// ScanTCPTable reads a /proc/net/tcp{,6} table line by line, with one line's memory
// however long the table, and calls fn with each row until fn returns false:
//
//	sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode ...
//	0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000 1000 0 12345 ...
//
// The header line and lines of fewer than 10 fields are skipped; a row it cannot read is
// an error.
func ScanTCPTable(r io.Reader, fn func(Row) bool) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 512), maxTCPLine)
	var f [10][]byte
	for i := 1; sc.Scan(); i++ {
		n := fields(sc.Bytes(), f[:])
		if i == 1 || n < len(f) {
			continue
		}
		var row Row
		var err error
		if row.Local, err = parseHexAddrPort(f[1]); err != nil {
			return fmt.Errorf("line %d: local address: %w", i, err)
		}
		if row.Remote, err = parseHexAddrPort(f[2]); err != nil {
			return fmt.Errorf("line %d: remote address: %w", i, err)
		}
		row.State = string(f[3])
		if _, rx, ok := bytes.Cut(f[4], []byte(":")); ok {
			q, err := strconv.ParseUint(string(rx), 16, 31)
			if err != nil {
				return fmt.Errorf("line %d: rx_queue %q: %w", i, rx, err)
			}
			row.RxQueue = int(q)
		}
		if row.Inode, err = strconv.ParseUint(string(f[9]), 10, 64); err != nil {
			return fmt.Errorf("line %d: inode %q: %w", i, f[9], err)
		}
		if !fn(row) {
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read the TCP table: %w", err)
	}
	return nil
}

// fields splits line at runs of spaces into f (as many as fit) and returns how many
// fields it found, up to len(f).
func fields(line []byte, f [][]byte) int {
	n := 0
	for n < len(f) {
		line = bytes.TrimLeft(line, " \t")
		if len(line) == 0 {
			break
		}
		end := bytes.IndexAny(line, " \t")
		if end < 0 {
			end = len(line)
		}
		f[n], line = line[:end], line[end:]
		n++
	}
	return n
}

// parseHexAddrPort decodes "0100007F:1F90", an address and port column.
func parseHexAddrPort(b []byte) (netip.AddrPort, error) {
	host, portHex, ok := bytes.Cut(b, []byte(":"))
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("%q: no port", b)
	}
	port, err := strconv.ParseUint(string(portHex), 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("port %q: %w", portHex, err)
	}
	addr, err := parseHexAddr(string(host))
	if err != nil {
		return netip.AddrPort{}, err
	}
	return netip.AddrPortFrom(addr, uint16(port)), nil
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
func SocketInode(link string) (uint64, bool) {
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
func SocketOwners(procDir string, want map[uint64]bool) map[uint64]Owner {
	found := map[uint64]Owner{}
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
			inode, ok := SocketInode(link)
			if !ok || !want[inode] {
				continue
			}
			if o, seen := found[inode]; !seen || pid < o.PID {
				found[inode] = Owner{PID: pid}
			}
		}
	}
	for inode, o := range found {
		comm, _ := os.ReadFile(filepath.Join(procDir, strconv.Itoa(o.PID), "comm"))
		o.Cmd = strings.TrimSpace(string(comm))
		found[inode] = o
	}
	return found
}

// Accepts reports whether a listener would take a connection to target (127.0.0.1 or
// ::1) on its port. A tcp6 socket bound to :: is taken to be dual-stack: for a socket
// outside the sandbox that is the safe guess (it counts as a conflict); for one inside, a
// wrong guess only means a refused connect, and the next target is tried.
func (l Socket) Accepts(target netip.Addr) bool {
	a := l.Addr
	if target.Is4() {
		if l.V6 && !a.Is4In6() {
			return a.IsUnspecified()
		}
		a = a.Unmap()
	} else if !l.V6 || a.Is4In6() {
		return false
	}
	return a == target || a.IsUnspecified()
}
