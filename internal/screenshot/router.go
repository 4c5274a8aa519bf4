//go:build linux

package screenshot

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// routeQueue is how many connections may wait for one pin proxy's Accept.
const routeQueue = 64

// router is the host end of the browser's network: a unix socket (SOCK_SEQPACKET) in a
// private directory, to which each browser sandbox's wrapper connects once, before the
// sandbox exists. Over it the sandbox's forwarder sends every connection the browser makes,
// as a descriptor, with the loopback address the browser dialled; the router gives the
// connection to the pin proxy listening on that address ([router.listen]) and closes it
// when none does. One router per running browser; close stops it.
//
// What arrives here is hostile input: a message that is not exactly 4 bytes with one
// descriptor ends that sandbox's connection, and a descriptor that is not a TCP socket is
// closed.
type router struct {
	log  *slog.Logger
	dir  string // private (0700), holds the socket
	path string
	ln   *net.UnixListener
	wg   sync.WaitGroup // the accept loop and one reader per sandbox

	mu     sync.Mutex
	closed bool
	conns  map[*net.UnixConn]struct{}
	routes map[[4]byte]*routeListener
}

func newRouter(log *slog.Logger) (*router, error) {
	dir, err := os.MkdirTemp("", "toolhost-browser-") // mode 0700
	if err != nil {
		return nil, fmt.Errorf("making the browser router's directory: %w", err)
	}
	path := filepath.Join(dir, "router")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("listening for the browser's forwarder at %s: %w", path, err)
	}
	r := &router{
		log: log, dir: dir, path: path, ln: ln,
		conns:  map[*net.UnixConn]struct{}{},
		routes: map[[4]byte]*routeListener{},
	}
	r.wg.Go(r.accept) // owned by r: ends when close closes ln
	return r, nil
}

func (r *router) accept() {
	for {
		c, err := r.ln.AcceptUnix()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			r.log.Warn("screenshot: router accept", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			c.Close()
			return
		}
		r.conns[c] = struct{}{}
		r.wg.Go(func() { r.serve(c) }) // owned by r: ends when c closes (the sandbox ends, or close)
		r.mu.Unlock()
	}
}

// serve receives one sandbox's connections until it goes away.
func (r *router) serve(c *net.UnixConn) {
	defer func() {
		r.mu.Lock()
		delete(r.conns, c)
		r.mu.Unlock()
		c.Close()
	}()
	buf := make([]byte, 16)
	oob := make([]byte, syscall.CmsgSpace(4))
	for {
		n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
		if err != nil {
			return
		}
		fds, perr := parseRights(oob[:oobn])
		if perr != nil || n != 4 || len(fds) != 1 || flags&(syscall.MSG_TRUNC|syscall.MSG_CTRUNC) != 0 {
			for _, fd := range fds {
				syscall.Close(fd)
			}
			r.log.Warn("screenshot: malformed message from the browser's sandbox; dropping its connection",
				"bytes", n, "descriptors", len(fds), "flags", flags, "err", perr)
			return
		}
		r.route([4]byte(buf[:4]), fds[0])
	}
}

// parseRights returns the descriptors of SCM_RIGHTS messages in oob.
func parseRights(oob []byte) ([]int, error) {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, m := range msgs {
		if m.Header.Level != syscall.SOL_SOCKET || m.Header.Type != syscall.SCM_RIGHTS {
			continue
		}
		got, err := syscall.ParseUnixRights(&m)
		if err != nil {
			return fds, err
		}
		fds = append(fds, got...)
	}
	return fds, nil
}

// route gives the connection fd to the pin proxy on ip, or closes it.
func (r *router) route(ip [4]byte, fd int) {
	f := os.NewFile(uintptr(fd), "browser-connection")
	c, err := net.FileConn(f) // a dup, non-blocking, in the poller
	f.Close()
	if err != nil {
		return
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		c.Close()
		return
	}
	r.mu.Lock()
	l := r.routes[ip]
	r.mu.Unlock()
	if l == nil || !l.deliver(tc) {
		tc.Close()
	}
}

// listen returns a listener on a fresh random loopback address of the sandbox's namespace,
// 127.a.b.c with a in 1..254 (127.0.0.x, the browser's default proxy, is never handed out).
func (r *router) listen() (pinListener, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, errors.New("the browser's router is closed")
	}
	for range 64 {
		ip := [4]byte{127, byte(1 + rand.IntN(254)), byte(rand.IntN(256)), byte(1 + rand.IntN(254))}
		if _, taken := r.routes[ip]; taken {
			continue
		}
		l := &routeListener{r: r, ip: ip, ch: make(chan net.Conn, routeQueue), done: make(chan struct{})}
		r.routes[ip] = l
		return l, nil
	}
	return nil, errors.New("no free loopback address for a browser context")
}

// close stops accepting, ends every sandbox's connection, waits for the goroutines and
// removes the directory. Listeners still open stay usable (and receive nothing).
func (r *router) close() {
	r.mu.Lock()
	r.closed = true
	conns := make([]*net.UnixConn, 0, len(r.conns))
	for c := range r.conns {
		conns = append(conns, c)
	}
	r.mu.Unlock()
	_ = r.ln.Close()
	for _, c := range conns {
		c.Close()
	}
	r.wg.Wait()
	if err := os.RemoveAll(r.dir); err != nil {
		r.log.Warn("screenshot: removing the browser router's directory", "dir", r.dir, "err", err)
	}
}

// routeListener is a net.Listener fed by the router: the connections the browser makes to
// one loopback address. Close unregisters it and closes what is queued.
type routeListener struct {
	r    *router
	ip   [4]byte
	ch   chan net.Conn
	done chan struct{}

	mu     sync.Mutex
	closed bool
}

// Accept returns the next connection, or net.ErrClosed once the listener is closed.
func (l *routeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// deliver queues c; false when the listener is closed or its queue is full.
func (l *routeListener) deliver(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	select {
	case l.ch <- c:
		return true
	default:
		return false
	}
}

// Close is safe to call more than once.
func (l *routeListener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.done)
	l.mu.Unlock()
	l.r.mu.Lock()
	if l.r.routes[l.ip] == l {
		delete(l.r.routes, l.ip)
	}
	l.r.mu.Unlock()
	for {
		select {
		case c := <-l.ch:
			c.Close()
		default:
			return nil
		}
	}
}

// Addr is the address the browser dials, inside its sandbox.
func (l *routeListener) Addr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(l.ip[0], l.ip[1], l.ip[2], l.ip[3]), Port: forwardPort}
}

// proxyURL is the proxy server to give the browser context.
func (l *routeListener) proxyURL() string {
	return "http://" + net.JoinHostPort(net.IPv4(l.ip[0], l.ip[1], l.ip[2], l.ip[3]).String(), strconv.Itoa(forwardPort))
}
