package screenshot

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	maxBlocked    = 20
	maxPageErrors = 10
	// proxyErrHeader marks a response the pin proxy made itself (not the preview server).
	proxyErrHeader = "X-Toolhost-Pin"
)

// pinProxy is an HTTP proxy that forwards only to one origin: plain requests whose URL is on
// the origin, and CONNECT tunnels (https, WebSockets) to the origin's host:port. Everything
// else gets 403 and is recorded. One per browser context; it serves the connections the
// browser's router hands it (the browser has no other way out of its sandbox). close stops
// its listener, its connections and its tunnels and waits for its handlers.
type pinProxy struct {
	// target is the origin it lets through and where to dial it; nil refuses everything
	// (a warm page's pin, made before anyone asked for a capture: retarget sets it once).
	target atomic.Pointer[pinTarget]
	// asked is set once the browser sent the pin anything after it had a target: from
	// then on the origin may have seen a request of this capture.
	asked    atomic.Bool
	log      *slog.Logger
	ln       net.Listener
	url      string // the proxy server the browser context is given
	srv      *http.Server
	rp       *httputil.ReverseProxy
	tr       *http.Transport
	ctx      context.Context // cancelled by close; parent of every upstream request
	cancel   context.CancelFunc
	handlers sync.WaitGroup

	mu        sync.Mutex
	tunnels   map[net.Conn]struct{}
	closed    bool
	blocked   []string
	nBlocked  int
	upErr     error // first failed exchange with the origin (dial, or no response)
	serveDone chan struct{}
}

// newPinProxy serves the pin on ln, which the browser reaches at url: a route of the
// browser's router (router.go), so the browser, in its sandbox, reaches it and nothing else.
func newPinProxy(origin, hostPort string, log *slog.Logger, ln net.Listener, url string) *pinProxy {
	ctx, cancel := context.WithCancel(context.Background())
	p := &pinProxy{
		log: log, ln: ln, url: url,
		ctx: ctx, cancel: cancel,
		tunnels:   map[net.Conn]struct{}{},
		serveDone: make(chan struct{}),
	}
	if origin != "" {
		p.retarget(origin, hostPort)
	}
	dialer := &net.Dialer{Timeout: 10 * time.Second}
	p.tr = &http.Transport{
		Proxy: nil, // never chain to an environment proxy
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			t := p.target.Load()
			if t == nil {
				return nil, errNoTarget
			}
			return dialer.DialContext(ctx, network, t.hostPort) // only ever the origin
		},
		ForceAttemptHTTP2:     false,
		MaxIdleConnsPerHost:   8,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 0, // bounded by the browser's navigation timeout and close
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.Out.URL = r.In.URL
			r.Out.Host = r.In.Host
			r.Out.Header.Del("Proxy-Connection")
			r.Out.Header.Del("Proxy-Authorization")
		},
		Transport:     p.tr,
		FlushInterval: -1, // stream (long polls, server-sent events)
		ErrorLog:      slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() == nil { // not the browser going away
				p.noteUpErr(err)
			}
			w.Header().Set(proxyErrHeader, "upstream")
			http.Error(w, "toolhost: the preview server could not be reached: "+err.Error(), http.StatusBadGateway)
		},
	}
	p.srv = &http.Server{
		Handler:           p,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	go func() { // owned by p: ends when close closes the listener
		defer close(p.serveDone)
		_ = p.srv.Serve(ln)
	}()
	return p
}

func (p *pinProxy) addr() string { return p.url }

// pinTarget is what a pin lets through: one origin, dialled at one address.
type pinTarget struct {
	origin   string // scheme://host:port
	hostPort string // host:port to dial
}

var errNoTarget = errors.New("the pin has no target yet")

// retarget gives a pin made without a target (a warm page's) its origin; it must be
// called before the page is sent anywhere, and only once.
func (p *pinProxy) retarget(origin, hostPort string) {
	p.target.Store(&pinTarget{origin: origin, hostPort: hostPort})
}

// origin is the pin's origin, for messages.
func (p *pinProxy) origin() string {
	if t := p.target.Load(); t != nil {
		return t.origin
	}
	return "(none yet)"
}

func (p *pinProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.handlers.Add(1)
	defer p.handlers.Done()
	if p.target.Load() != nil {
		p.asked.Store(true)
	}
	if r.Method == http.MethodConnect {
		p.connect(w, r)
		return
	}
	if t := p.target.Load(); t == nil || !r.URL.IsAbs() || !sameOrigin(r.URL.String(), t.origin) {
		p.block(w, r.URL.String())
		return
	}
	p.rp.ServeHTTP(w, r)
}

func (p *pinProxy) connect(w http.ResponseWriter, r *http.Request) {
	t := p.target.Load()
	if t == nil || strings.ToLower(r.Host) != t.hostPort {
		p.block(w, "CONNECT "+r.Host)
		return
	}
	d := net.Dialer{Timeout: 10 * time.Second}
	up, err := d.DialContext(r.Context(), "tcp", t.hostPort)
	if err != nil {
		p.noteUpErr(err)
		w.Header().Set(proxyErrHeader, "upstream")
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		up.Close()
		http.Error(w, "no hijack", http.StatusInternalServerError)
		return
	}
	down, rw, err := hj.Hijack()
	if err != nil {
		up.Close()
		return
	}
	if !p.track(down, up) {
		down.Close()
		up.Close()
		return
	}
	defer p.untrack(down, up)
	if _, err := io.WriteString(down, "HTTP/1.1 200 Connection Established\r\n\r\n"); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() { // owned by this handler, which waits for it below
		if n := rw.Reader.Buffered(); n > 0 {
			b, _ := rw.Reader.Peek(n)
			_, _ = up.Write(b)
		}
		_, _ = io.Copy(up, down)
		closeWrite(up)
		done <- struct{}{}
	}()
	_, _ = io.Copy(down, up)
	closeWrite(down)
	<-done
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
		return
	}
	_ = c.Close()
}

func (p *pinProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	for _, c := range cs {
		p.tunnels[c] = struct{}{}
	}
	return true
}

func (p *pinProxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.tunnels, c)
		c.Close()
	}
}

func (p *pinProxy) block(w http.ResponseWriter, what string) {
	p.mu.Lock()
	p.nBlocked++
	if len(p.blocked) < maxBlocked {
		p.blocked = append(p.blocked, what)
	}
	p.mu.Unlock()
	p.log.Debug("screenshot: blocked off-origin request", "request", what, "origin", p.origin())
	w.Header().Set(proxyErrHeader, "blocked")
	http.Error(w, "toolhost: blocked; a preview may load only "+p.origin(), http.StatusForbidden)
}

func (p *pinProxy) noteUpErr(err error) {
	p.mu.Lock()
	if p.upErr == nil {
		p.upErr = err
	}
	p.mu.Unlock()
}

// upstreamErr returns the first failed exchange with the preview server, or nil.
func (p *pinProxy) upstreamErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.upErr
}

func (p *pinProxy) blockedList() ([]string, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.blocked...), p.nBlocked
}

// close stops everything the proxy started and waits (bounded) for its handlers.
func (p *pinProxy) close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.tunnels {
		c.Close()
	}
	p.mu.Unlock()
	p.cancel()
	_ = p.srv.Close()
	p.tr.CloseIdleConnections()
	<-p.serveDone
	waited := make(chan struct{})
	go func() { // owned by close: ends when the handlers have returned
		p.handlers.Wait()
		close(waited)
	}()
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		p.log.Warn("screenshot: proxy handlers still running after close", "origin", p.origin())
	}
}

// isRefused reports whether err is a refused TCP connection.
func isRefused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED)
}
