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
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/toolhost/toolhost/internal/envd/procnet"
)

// EgressConfig turns on the agent's side of the egress gateway.
type EgressConfig struct {
	// Port is the loopback port the sandbox's programs reach the gateway on.
	Port int
	// Control is the agent's end of a unix SOCK_SEQPACKET socket pair with the host.
	Control *os.File
	// Relay, instead of Control, is the TCP address of the host's egress relay (a sandbox
	// on another machine: a Kubernetes pod): each connection is carried there, opened by
	// an envd.EgressHello with the key of the agent's access token (relay.go).
	Relay string
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

// maxEgressBatch bounds the connections the agent holds that it has not handed over: as
// many wait for the next batch, as many are being attributed; past that it stops
// accepting (the kernel's backlog holds the rest) until a batch is handed over. A flood of
// connections costs it that many descriptors at most, never memory per connection.
const maxEgressBatch = 256

// egress is the running listener.
type egress struct {
	l       net.Listener
	control *net.UnixConn // nil with a relay
	// relay is where connections are carried (relay.go), nil without a relay: the host that
	// holds the sandbox, moved by SetRelay when another host takes it over. relayed are
	// the connections carried to each (under Server.mu), so that a move ends those to the
	// earlier host.
	relay   atomic.Pointer[relayTarget]
	relayed map[net.Conn]*relayTarget
	relays  chan struct{} // a slot per relayed connection open
	port    int
	pending chan *net.TCPConn // accepted, not yet attributed; closed when accepting ends
}

// startEgress listens on the egress port; Serve hands connections over until it returns.
func (s *Server) startEgress() error {
	cfg := s.cfg.Egress
	if cfg == nil {
		return nil
	}
	var uc *net.UnixConn
	if cfg.Relay == "" {
		fc, err := net.FileConn(cfg.Control) // a copy, close-on-exec
		if err != nil {
			return fmt.Errorf("egress control socket: %w", err)
		}
		var ok bool
		if uc, ok = fc.(*net.UnixConn); !ok {
			fc.Close()
			return fmt.Errorf("egress control socket is a %T, not a unix socket", fc)
		}
	}
	l, err := net.Listen("tcp4", netip.AddrPortFrom(loop4, uint16(cfg.Port)).String())
	if err != nil {
		if uc != nil {
			uc.Close()
		}
		return fmt.Errorf("listen on the egress port: %w", err)
	}
	e := &egress{l: l, control: uc, relays: make(chan struct{}, maxRelays), relayed: map[net.Conn]*relayTarget{}, port: cfg.Port,
		pending: make(chan *net.TCPConn, maxEgressBatch)}
	if cfg.Relay != "" {
		e.relay.Store(&relayTarget{addr: cfg.Relay})
	}
	s.egress = e
	return nil
}

// serveEgress accepts until the listener is closed; one goroutine hands the connections
// over in batches, so a burst of connections costs one read of the sandbox's TCP table
// and one walk of its processes per batch, not per connection.
func (s *Server) serveEgress() {
	e := s.egress
	s.wg.Add(1)
	go func() { // counted in s.wg: ends once accepting has ended and pending is drained
		defer s.wg.Done()
		s.handOverBatches()
	}()
	defer close(e.pending)
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
		closed := s.closed
		s.mu.Unlock()
		if closed {
			c.Close()
			return
		}
		tc, ok := c.(*net.TCPConn)
		if !ok {
			c.Close()
			continue
		}
		e.pending <- tc // waits while a full batch is attributed: the backlog holds the rest
	}
}

// handOverBatches takes what is pending (up to a batch), attributes it at once and hands
// each connection to the host, until pending is closed.
func (s *Server) handOverBatches() {
	e := s.egress
	batch := make([]*net.TCPConn, 0, maxEgressBatch)
	for c := range e.pending {
		batch = append(batch[:0], c)
	more:
		for len(batch) < maxEgressBatch {
			select {
			case c, ok := <-e.pending:
				if !ok {
					break more
				}
				batch = append(batch, c)
			default:
				break more
			}
		}
		msgs := s.attribute(batch)
		for i, c := range batch {
			batch[i] = nil
			if t := e.relay.Load(); t != nil {
				s.relay(c, msgs[i], t)
				continue
			}
			if err := s.handOver(c, msgs[i]); err != nil {
				s.log.Debug("egress hand-over", "err", err)
			}
			c.Close()
		}
	}
}

// closeEgress stops accepting and drops the control socket.
func (s *Server) closeEgress() {
	if s.egress != nil {
		s.egress.l.Close()
		if s.egress.control != nil {
			s.egress.control.Close()
		}
	}
}

// handOver sends c's descriptor to the host with the command that made it.
func (s *Server) handOver(c *net.TCPConn, msg EgressMessage) error {
	b, err := json.Marshal(msg)
	if err != nil || len(b) > MaxEgressMessage {
		b = []byte("{}")
	}
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		_, _, serr = s.egress.control.WriteMsgUnix(b, unix.UnixRights(int(fd)), nil)
	}); err != nil {
		return err
	}
	return serr
}

// attribute finds the command of each connection to the egress port: the process holding
// the other end (by its socket's inode in the sandbox's /proc/net/tcp), then the command
// the agent started that the process belongs to (its process group, else its parents).
// The table is read once, streamed, and the processes walked once, for the whole batch.
func (s *Server) attribute(conns []*net.TCPConn) []EgressMessage {
	msgs := make([]EgressMessage, len(conns))
	byClient := make(map[netip.AddrPort]int, len(conns)) // the client's end -> its index
	for i, c := range conns {
		if peer, ok := c.RemoteAddr().(*net.TCPAddr); ok {
			ap := peer.AddrPort()
			byClient[netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())] = i
		}
	}
	inodes := clientInodes(s.cfg.ProcDir, byClient, netip.AddrPortFrom(loop4, uint16(s.egress.port)))
	if len(inodes) == 0 {
		return msgs
	}
	want := make(map[uint64]bool, len(inodes))
	for _, inode := range inodes {
		want[inode] = true
	}
	owners := procnet.SocketOwners(s.cfg.ProcDir, want)
	for i, inode := range inodes {
		if o, ok := owners[inode]; ok {
			msgs[i] = EgressMessage{Command: s.commandOf(o.PID), PID: o.PID}
		}
	}
	return msgs
}

// clientInodes finds the inodes of the clients' sockets of loopback connections to
// server in /proc/net/tcp: by the index byClient gives each client's address.
func clientInodes(procDir string, byClient map[netip.AddrPort]int, server netip.AddrPort) map[int]uint64 {
	out := map[int]uint64{}
	f, err := os.Open(filepath.Join(procDir, "net", "tcp"))
	if err != nil {
		return out
	}
	defer f.Close()
	_ = procnet.ScanTCPTable(f, func(r procnet.Row) bool {
		if r.Remote == server && r.Inode != 0 {
			if i, ok := byClient[r.Local]; ok {
				out[i] = r.Inode
			}
		}
		return len(out) < len(byClient)
	})
	return out
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
	find := func() (string, bool) {
		if pgid, _, ok := procStat(s.cfg.ProcDir, pid); ok {
			if t, ok := tagOf(pgid); ok {
				return t, true
			}
		}
		for p, hops := pid, 0; p > 1 && hops < 64; hops++ {
			if t, ok := tagOf(p); ok {
				return t, true
			}
			_, ppid, ok := procStat(s.cfg.ProcDir, p)
			if !ok {
				break
			}
			p = ppid
		}
		return "", false
	}
	t, ok := find()
	if !ok && s.starting > 0 {
		// A command that connects at once may do so before start has tracked it: wait
		// for the starts in flight (each a fork and exec; a few rounds at most, should
		// more keep coming), then look again.
		for i := 0; s.starting > 0 && i < 8; i++ {
			s.started.Wait()
		}
		t, _ = find()
	}
	return t
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
