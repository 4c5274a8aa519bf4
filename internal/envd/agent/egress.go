//go:build linux

package agent

// The agent's side of the egress gateway (sandbox.NetworkEgress). The sandbox has no
// route anywhere; its only way out is 127.0.0.1:EgressConfig.Port, which the agent listens
// on before any command runs (so no command can take the port first). For each connection
// it finds the command that made it (the socket's owner in /proc, then the command the
// agent started that the owner belongs to) and hands the connection's descriptor, with
// that command's tag, to the host over the control socket it inherited: a unix socket pair
// with no path anywhere, which nothing else in the sandbox holds (the agent is not
// dumpable, so its descriptors cannot be taken). The host's gateway serves the connection
// from there; the agent keeps no copy.

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/toolhost/toolhost/internal/envd/procnet"
)

// EgressConfig turns on the agent's side of the egress gateway.
type EgressConfig struct {
	// Port is the loopback port the sandbox's programs reach the gateway on.
	Port int
	// Control is the agent's end of a unix SOCK_SEQPACKET socket pair with the host.
	Control *os.File
}

// EgressMessage is what the agent sends with each connection's descriptor (one message,
// one descriptor). The host treats it as what it is: the sandbox's word.
type EgressMessage struct {
	// Command is the Tag of the command the connection belongs to ("" when the agent
	// could not tell); PID its process in the sandbox.
	Command string `json:"command,omitempty"`
	PID     int    `json:"pid,omitempty"`
}

// MaxEgressMessage bounds a control message.
const MaxEgressMessage = 512

// egress is the running listener.
type egress struct {
	l       net.Listener
	control *net.UnixConn
	port    int
	mu      sync.Mutex // serialises sends (a SEQPACKET send is one message anyway)
}

// startEgress listens on the egress port; Serve hands connections over until it returns.
func (s *Server) startEgress() error {
	cfg := s.cfg.Egress
	if cfg == nil {
		return nil
	}
	fc, err := net.FileConn(cfg.Control) // a copy, close-on-exec
	if err != nil {
		return fmt.Errorf("egress control socket: %w", err)
	}
	uc, ok := fc.(*net.UnixConn)
	if !ok {
		fc.Close()
		return fmt.Errorf("egress control socket is a %T, not a unix socket", fc)
	}
	l, err := net.Listen("tcp4", netip.AddrPortFrom(loop4, uint16(cfg.Port)).String())
	if err != nil {
		uc.Close()
		return fmt.Errorf("listen on the egress port: %w", err)
	}
	s.egress = &egress{l: l, control: uc, port: cfg.Port}
	return nil
}

// serveEgress accepts until the listener is closed.
func (s *Server) serveEgress() {
	e := s.egress
	for {
		c, err := e.l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			s.log.Debug("egress accept", "err", err)
			continue
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() { // counted in s.wg: ends once the descriptor is handed over
			defer s.wg.Done()
			defer c.Close()
			if err := s.handOver(c); err != nil {
				s.log.Debug("egress hand-over", "err", err)
			}
		}()
	}
}

// closeEgress stops accepting and drops the control socket.
func (s *Server) closeEgress() {
	if s.egress != nil {
		s.egress.l.Close()
		s.egress.control.Close()
	}
}

// handOver sends c's descriptor to the host with the command that made it.
func (s *Server) handOver(c net.Conn) error {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return fmt.Errorf("egress connection is a %T", c)
	}
	msg := s.attribute(tc)
	b, err := json.Marshal(msg)
	if err != nil || len(b) > MaxEgressMessage {
		b = []byte("{}")
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		s.egress.mu.Lock()
		defer s.egress.mu.Unlock()
		_, _, serr = s.egress.control.WriteMsgUnix(b, unix.UnixRights(int(fd)), nil)
	}); err != nil {
		return err
	}
	return serr
}

// attribute finds the command of a connection to the egress port: the process holding the
// other end (by its socket's inode in the sandbox's /proc/net/tcp), then the command the
// agent started that the process belongs to (its process group, else its parents).
func (s *Server) attribute(c *net.TCPConn) EgressMessage {
	peer, ok := c.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return EgressMessage{}
	}
	inode := clientInode(s.cfg.ProcDir, peer.Port, s.egress.port)
	if inode == 0 {
		return EgressMessage{}
	}
	owners := procnet.SocketOwners(s.cfg.ProcDir, map[uint64]bool{inode: true})
	o, ok := owners[inode]
	if !ok {
		return EgressMessage{}
	}
	return EgressMessage{Command: s.commandOf(o.PID), PID: o.PID}
}

// clientInode finds the inode of the client's socket of a loopback connection
// 127.0.0.1:from -> 127.0.0.1:to in /proc/net/tcp.
func clientInode(procDir string, from, to int) uint64 {
	b, err := os.ReadFile(filepath.Join(procDir, "net", "tcp"))
	if err != nil {
		return 0
	}
	var lo [4]byte
	copy(lo[:], loop4.AsSlice())
	host := fmt.Sprintf("%08X", binary.NativeEndian.Uint32(lo[:]))
	local := fmt.Sprintf("%s:%04X", host, from)
	remote := fmt.Sprintf("%s:%04X", host, to)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 10 || f[1] != local || f[2] != remote {
			continue
		}
		if n, err := strconv.ParseUint(f[9], 10, 64); err == nil {
			return n
		}
	}
	return 0
}

// commandOf is the tag of the command pid belongs to: the command whose process group it
// is in, else the nearest ancestor the agent started; "" when none (a process that left
// its group and whose parents are gone).
func (s *Server) commandOf(pid int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	tagOf := func(p int) (string, bool) {
		if pr, ok := s.procs[uint32(p)]; ok {
			return pr.tag, true
		}
		return "", false
	}
	if pgid, _, ok := procStat(s.cfg.ProcDir, pid); ok {
		if t, ok := tagOf(pgid); ok {
			return t
		}
	}
	for p, hops := pid, 0; p > 1 && hops < 64; hops++ {
		if t, ok := tagOf(p); ok {
			return t
		}
		_, ppid, ok := procStat(s.cfg.ProcDir, p)
		if !ok {
			break
		}
		p = ppid
	}
	return ""
}

// procStat reads a process's group and parent from /proc/PID/stat ("pid (comm) state ppid
// pgrp ..."; comm may hold spaces and parentheses, so the fields count from the last ')').
func procStat(procDir string, pid int) (pgid, ppid int, ok bool) {
	b, err := os.ReadFile(filepath.Join(procDir, strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, 0, false
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 3 {
		return 0, 0, false
	}
	ppid, err1 := strconv.Atoi(f[1])
	pgid, err2 := strconv.Atoi(f[2])
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return pgid, ppid, true
}
