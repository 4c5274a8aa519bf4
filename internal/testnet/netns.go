//go:build linux

package testnet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// netns is a network namespace held by a descriptor only: it has no name anywhere
// (nothing under /run/netns), so nothing of it outlives the test process; closing the
// descriptor (and every socket in it) frees it with its interfaces.
type netns struct {
	name string // for messages
	fd   int

	// workers run dials (and listens) on threads that sit in the namespace: a socket
	// belongs to the namespace of the thread that created it, and is used from anywhere
	// after.
	jobs    chan func()
	wg      sync.WaitGroup
	closeMu sync.RWMutex // held for reading while a job is handed over
	closed  bool
}

const nsWorkers = 16

// newNetns makes a network namespace with loopback up.
func newNetns(name string) (*netns, error) {
	type result struct {
		fd  int
		err error
	}
	done := make(chan result, 1)
	go func() { // owned by newNetns; its thread is discarded (never unlocked)
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			done <- result{-1, fmt.Errorf("unshare the network namespace: %w", err)}
			return
		}
		fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		done <- result{fd, err}
	}()
	r := <-done
	if r.err != nil {
		return nil, r.err
	}
	n := &netns{name: name, fd: r.fd, jobs: make(chan func())}
	for range nsWorkers {
		ready := make(chan error, 1)
		n.wg.Add(1)
		go func() { // a worker thread in the namespace; close ends it (and its thread)
			defer n.wg.Done()
			runtime.LockOSThread()
			if err := unix.Setns(n.fd, unix.CLONE_NEWNET); err != nil {
				ready <- err
				return
			}
			ready <- nil
			for job := range n.jobs {
				job()
			}
		}()
		if err := <-ready; err != nil {
			n.close()
			return nil, fmt.Errorf("enter the network namespace: %w", err)
		}
	}
	if err := n.ip("link", "set", "lo", "up"); err != nil {
		n.close()
		return nil, err
	}
	return n, nil
}

// do runs f on a thread in the namespace.
func (n *netns) do(f func()) error {
	n.closeMu.RLock()
	if n.closed {
		n.closeMu.RUnlock()
		return errors.New("network namespace " + n.name + " is closed")
	}
	done := make(chan struct{})
	n.jobs <- func() { defer close(done); f() }
	n.closeMu.RUnlock()
	<-done
	return nil
}

// ip runs ip(8) in the namespace: forked from a thread that is in it, the child is too.
func (n *netns) ip(args ...string) error { return n.run("ip", args...) }

// run runs prog (ip or tc) in the namespace.
func (n *netns) run(prog string, args ...string) error {
	var out []byte
	var err error
	if derr := n.do(func() {
		cmd := exec.Command(prog, args...)
		cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
		cmd.WaitDelay = 5 * time.Second
		out, err = cmd.CombinedOutput()
	}); derr != nil {
		return derr
	}
	if err != nil {
		return fmt.Errorf("%s %s in %s: %w: %s", prog, strings.Join(args, " "), n.name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// ipTo runs ip(8) in the namespace with the descriptor of other as /proc/self/fd/3, for
// "netns /proc/self/fd/3".
func (n *netns) ipTo(other *netns, args ...string) error {
	var out []byte
	var err error
	dup, err := unix.FcntlInt(uintptr(other.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("dup the descriptor of %s: %w", other.name, err)
	}
	f := os.NewFile(uintptr(dup), "netns "+other.name)
	defer f.Close()
	if derr := n.do(func() {
		cmd := exec.Command("ip", args...)
		cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
		cmd.WaitDelay = 5 * time.Second
		cmd.ExtraFiles = []*os.File{f}
		out, err = cmd.CombinedOutput()
	}); derr != nil {
		return derr
	}
	if err != nil {
		return fmt.Errorf("ip %s in %s: %w: %s", strings.Join(args, " "), n.name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// sysctl sets a network sysctl of the namespace (/proc/sys/net is the opening thread's
// namespace's).
func (n *netns) sysctl(key, val string) error {
	var err error
	if derr := n.do(func() { err = os.WriteFile("/proc/sys/"+key, []byte(val), 0) }); derr != nil {
		return derr
	}
	if err != nil {
		return fmt.Errorf("sysctl %s in %s: %w", key, n.name, err)
	}
	return nil
}

// dial connects from the namespace.
func (n *netns) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	var err error
	if derr := n.do(func() {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
	}); derr != nil {
		return nil, derr
	}
	return c, err
}

// listen listens in the namespace.
func (n *netns) listen(network, addr string) (net.Listener, error) {
	var l net.Listener
	var err error
	if derr := n.do(func() { l, err = net.Listen(network, addr) }); derr != nil {
		return nil, derr
	}
	return l, err
}

// listenPacket listens for datagrams in the namespace.
func (n *netns) listenPacket(network, addr string) (net.PacketConn, error) {
	var l net.PacketConn
	var err error
	if derr := n.do(func() { l, err = net.ListenPacket(network, addr) }); derr != nil {
		return nil, derr
	}
	return l, err
}

// close ends the workers (their threads exit, never having left the namespace) and
// drops the descriptor; the namespace goes when its last socket does.
func (n *netns) close() {
	n.closeMu.Lock()
	if n.closed {
		n.closeMu.Unlock()
		return
	}
	n.closed = true
	close(n.jobs)
	n.closeMu.Unlock()
	n.wg.Wait()
	unix.Close(n.fd)
}
