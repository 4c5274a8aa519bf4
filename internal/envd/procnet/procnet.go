package procnet

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
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
		b, err := os.ReadFile(p)
		if err != nil {
			if t.v6 && errors.Is(err, fs.ErrNotExist) {
				continue // IPv6 disabled
			}
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
		socks, err := ParseTCPTable(b, t.v6)
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
func ParseTCPTable(b []byte, v6 bool) ([]Socket, error) {
	var out []Socket
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
		out = append(out, Socket{Addr: addr, Port: int(port), Inode: inode, V6: v6})
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
