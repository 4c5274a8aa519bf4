//go:build linux

package local

// The way out of a sandbox with sandbox.NetworkEgress. The sandbox keeps its own network
// namespace with loopback only: no route leads anywhere. Its agent listens on
// 127.0.0.1:sandbox.EgressPort and passes each connection's descriptor, with the tag of
// the command that made it, over a unix socket pair that bubblewrap hands it as an
// inherited descriptor: nothing in the sandbox has a path to it, and no other sandbox
// holds it. The host end of the pair is read here, and every connection is served by the
// sandbox's door of the gateway (CreateOptions.Egress.Gateway).
//
// What the agent sends is the sandbox's word: the host takes one descriptor per message,
// checks that it is a stream socket, bounds the message, and uses the command only as a
// label (the gateway serves the connection under this sandbox's door whatever it says).

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/envd/agent"
)

// caBundle is where the sandbox's TLS clients find their roots (Debian's bundle, which
// curl, git, pip, Python and Go read); extraCA holds only the added certificates, for
// NODE_EXTRA_CA_CERTS (Node keeps its own roots and adds these).
const (
	caBundle     = "/etc/ssl/certs/ca-certificates.crt"
	extraCA      = "/etc/toolhost/extra-ca.pem"
	egressHosts  = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tsandbox\n"
	maxEgressFDs = 4 // room to see (and close) descriptors past the one a message may carry
)

// egressLink joins one sandbox's agent to its door of the gateway.
type egressLink struct {
	door  sandbox.EgressDoor
	trust []byte // PEM the sandbox trusts besides the system's roots
	ctl   *net.UnixConn
	agent *os.File // the agent's end, handed to bwrap and closed after the start
	log   *slog.Logger

	wg sync.WaitGroup // the reader and every connection it handed to the door
}

// newEgressLink opens the sandbox's door and the socket pair.
func newEgressLink(opts sandbox.CreateOptions, id string, log *slog.Logger) (*egressLink, error) {
	door, err := opts.Egress.Gateway.Open(id)
	if err != nil {
		return nil, fmt.Errorf("open the egress gateway for the sandbox: %w", err)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		door.Close()
		return nil, fmt.Errorf("egress socket pair: %w", err)
	}
	host := os.NewFile(uintptr(fds[0]), "egress-host")
	fc, err := net.FileConn(host)
	host.Close()
	if err != nil {
		unix.Close(fds[1])
		door.Close()
		return nil, fmt.Errorf("egress socket pair: %w", err)
	}
	e := &egressLink{door: door, ctl: fc.(*net.UnixConn), agent: os.NewFile(uintptr(fds[1]), "egress-agent"), log: log}
	e.trust = append(append([]byte(nil), opts.Egress.Trust...), door.CACert()...)
	return e, nil
}

// plan adds the link to a sandbox's bubblewrap invocation: the agent's end of the pair,
// the proxy variables, a hosts file for localhost, and the roots to trust.
func (e *egressLink) plan(l *launch) error {
	fd := l.add(e.agent)
	e.agent = nil // the launch closes it once bwrap has its copy
	l.arg("--setenv", envAgentEgress, fd+":"+strconv.Itoa(sandbox.EgressPort))
	env := sandbox.EgressEnv()
	hosts, err := l.data("hosts", []byte(egressHosts))
	if err != nil {
		return err
	}
	l.arg("--perms", "0444", "--file", hosts, "/etc/hosts") // a copy in /etc, as its other files
	if len(bytes.TrimSpace(e.trust)) > 0 {
		system, err := os.ReadFile(caBundle)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("read the system's CA bundle: %w", err)
		}
		bundle := append(append(bytes.TrimRight(system, "\n"), '\n'), e.trust...)
		bfd, err := l.data("ca-bundle", bundle)
		if err != nil {
			return err
		}
		xfd, err := l.data("extra-ca", e.trust)
		if err != nil {
			return err
		}
		// The bundle lies in a host directory bound read-only (/etc/ssl/certs): it stays a
		// bind over the host's; the extra roots are a copy in the sandbox's own /etc.
		l.arg("--ro-bind-data", bfd, caBundle, "--perms", "0444", "--file", xfd, extraCA)
		for _, k := range []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO"} {
			env[k] = caBundle
		}
		env["NODE_EXTRA_CA_CERTS"] = extraCA
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		l.arg("--setenv", k, env[k])
	}
	return nil
}

// run reads the agent's messages until the pair is closed, handing each connection to the
// door.
func (e *egressLink) run() {
	defer e.wg.Done()
	buf := make([]byte, agent.MaxEgressMessage+1)
	oob := make([]byte, unix.CmsgSpace(4*maxEgressFDs))
	for {
		n, oobn, flags, _, err := e.ctl.ReadMsgUnix(buf, oob)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				e.log.Debug("egress control socket", "err", err)
			}
			return
		}
		if n == 0 && oobn == 0 {
			return // the agent's end is gone
		}
		fds := rights(oob[:oobn])
		if len(fds) != 1 || flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || n > agent.MaxEgressMessage {
			for _, fd := range fds {
				unix.Close(fd)
			}
			e.log.Debug("egress: a malformed message from the agent", "fds", len(fds), "bytes", n)
			continue
		}
		conn, err := streamConn(fds[0])
		if err != nil {
			e.log.Debug("egress: the agent sent a descriptor that is not a connection", "err", err)
			continue
		}
		var msg agent.EgressMessage
		_ = json.Unmarshal(buf[:n], &msg) // a label at most: nothing depends on it
		e.wg.Add(1)
		go func() { // counted in e.wg: close ends the door, and with it the connection
			defer e.wg.Done()
			e.door.ServeConn(conn, commandLabel(msg.Command))
		}()
	}
}

// rights takes the descriptors out of a control message, close-on-exec.
func rights(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if fs, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, fs...)
		}
	}
	for _, fd := range fds {
		syscall.CloseOnExec(fd)
	}
	return fds
}

// streamConn makes a connection of a received descriptor, which must be a connected
// stream socket; it is closed otherwise.
func streamConn(fd int) (net.Conn, error) {
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil || typ != unix.SOCK_STREAM {
		unix.Close(fd)
		return nil, fmt.Errorf("socket type %d (%v)", typ, err)
	}
	if acc, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || acc != 0 {
		unix.Close(fd)
		return nil, errors.New("a listening socket")
	}
	f := os.NewFile(uintptr(fd), "egress-conn")
	c, err := net.FileConn(f)
	f.Close()
	return c, err
}

// commandLabel keeps a command tag the agent sent if it looks like one.
func commandLabel(s string) string {
	if len(s) > 64 || strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != "" {
		return ""
	}
	return s
}

// start begins reading the agent's messages.
func (e *egressLink) start() {
	e.wg.Add(1)
	go e.run() // counted in e.wg: close closes the socket and waits
}

// close ends the link: no more connections, the open ones end with the door.
func (e *egressLink) close() {
	e.ctl.Close()
	if e.agent != nil {
		e.agent.Close()
	}
	e.door.Close()
	e.wg.Wait()
}

var _ sandbox.EgressReporter = (*Sandbox)(nil)

// EgressRefused is what the gateway refused to command, once; nil without a gateway.
func (s *Sandbox) EgressRefused(command string) []string {
	if s.egress == nil {
		return nil
	}
	return s.egress.door.Refused(command)
}
