package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/envd"
	"github.com/toolhost/toolhost/internal/envd/procnet"
)

// Previews. Every port of an E2B sandbox is public at https://{port}-{id}.{domain}
// (behind a traffic token when the sandbox was made with one), served by E2B's edge
// proxy, which answers 502 "port is not open" for a port nobody listens on. PreviewURL
// hands the host an http://127.0.0.1:N/ URL instead, served by a reverse proxy in this
// process to that public host: the browser that takes screenshots is pinned to a
// loopback origin as with the local provider, never learns the sandbox's address or its
// token, and needs no DNS for a self-hosted cluster's domain. The proxy adds the traffic
// token, and the E2b-Sandbox-Id and E2b-Sandbox-Port headers when the data plane goes
// through one sandbox URL. It ends with the sandbox.

const (
	trafficTokenHeader = "E2b-Traffic-Access-Token"
	probeTimeout       = 10 * time.Second
)

// target is where port's traffic goes, and the headers that route it.
func (s *Sandbox) target(port int) (*url.URL, http.Header) {
	h := http.Header{}
	if s.trafficToken != "" {
		h.Set(trafficTokenHeader, s.trafficToken)
	}
	if base := s.p.cfg.SandboxURL; base != "" {
		u, _ := url.Parse(base)
		h.Set("E2b-Sandbox-Id", s.id)
		h.Set("E2b-Sandbox-Port", strconv.Itoa(port))
		return u, h
	}
	return &url.URL{Scheme: "https", Host: strconv.Itoa(port) + "-" + s.id + "." + s.domain}, h
}

// PreviewURL returns a loopback URL that serves what listens on port in the sandbox. It
// fails with ErrPortClosed when E2B's proxy says nothing listens there.
func (s *Sandbox) PreviewURL(ctx context.Context, port int) (*url.URL, error) {
	if port < 1 || port > 65535 || port == EnvdPort {
		return nil, fmt.Errorf("preview of port %d in E2B sandbox %s: not a port a preview can show (1..65535, not envd's %d)", port, s.id, EnvdPort)
	}
	if err := s.closedErr(); err != nil {
		return nil, err
	}
	if err := s.probe(ctx, port); err != nil {
		return nil, fmt.Errorf("preview of port %d in E2B sandbox %s: %w", port, s.id, err)
	}
	u, err := s.previews.url(s, port)
	if err != nil {
		return nil, fmt.Errorf("preview of port %d in E2B sandbox %s: %w", port, s.id, err)
	}
	return u, nil
}

// proxyError is the JSON body of E2B's edge proxy.
type proxyError struct {
	SandboxID string `json:"sandboxId"`
	Message   string `json:"message"`
	Port      int    `json:"port"`
	Code      int    `json:"code"`
}

// probe asks the port once through E2B's proxy: its own 502 answers say whether the
// sandbox and the port are there; anything else comes from what listens.
func (s *Sandbox) probe(ctx context.Context, port int) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	u, h := s.target(port)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String()+"/", nil)
	if err != nil {
		return err
	}
	for k, v := range h {
		req.Header[k] = v
	}
	req.Header.Set("Accept", "application/json")
	resp, err := s.p.hc.Do(req)
	if err != nil {
		return s.wrap(fmt.Errorf("reach the port through E2B's proxy: %w", err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		return nil
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	var pe proxyError
	if json.Unmarshal(b, &pe) != nil || pe.Code != http.StatusBadGateway {
		return nil // a dev server's own 502: something listens
	}
	switch {
	case strings.Contains(pe.Message, "port is not open"):
		return fmt.Errorf("nothing in the sandbox listens on port %d: %w", port, sandbox.ErrPortClosed)
	case strings.Contains(pe.Message, "not found"):
		s.markGone("is gone (E2B's proxy no longer knows it)")
		return fmt.Errorf("%s: %w", pe.Message, sandbox.ErrClosed)
	}
	return nil
}

// previews are the loopback proxies of one sandbox; close stops them and waits for their
// servers and requests, upgraded (WebSocket) ones included: every request's context ends
// with close, and with it the proxy's copy of an upgraded connection.
type previews struct {
	mu     sync.Mutex
	closed bool
	byPort map[int]*preview
	wg     sync.WaitGroup // servers and requests in flight
	ctx    context.Context
	cancel context.CancelFunc
}

type preview struct {
	srv *http.Server
	url *url.URL
}

func (p *previews) url(s *Sandbox, port int) (*url.URL, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, sandbox.ErrClosed
	}
	if pv := p.byPort[port]; pv != nil {
		return pv.url, nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen on the host's loopback: %w", err)
	}
	to, hdr := s.target(port)
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(to)
			r.Out.Host = to.Host
			// The page is the sandbox's and may send any header: none of E2B's routing or
			// credential headers pass but the proxy's own, so it cannot aim elsewhere.
			for _, h := range []string{"E2b-Sandbox-Id", "E2b-Sandbox-Port", trafficTokenHeader, "X-Access-Token", "X-Api-Key", "Forwarded"} {
				r.Out.Header.Del(h)
			}
			for k, v := range hdr {
				r.Out.Header[k] = v
			}
		},
		Transport:     s.p.tr,
		FlushInterval: -1, // stream: server-sent events, long polls
		ErrorLog:      nil,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			s.log.Debug("preview request failed", "port", port, "err", err)
			http.Error(w, "toolhost: the sandbox's preview could not be reached", http.StatusBadGateway)
		},
	}
	if p.byPort == nil {
		p.byPort = map[int]*preview{}
		p.ctx, p.cancel = context.WithCancel(context.Background())
	}
	pv := &preview{
		srv: &http.Server{
			Handler:           p.track(rp),
			ReadHeaderTimeout: 10 * time.Second,
			BaseContext:       func(net.Listener) context.Context { return p.ctx },
		},
		url: &url.URL{Scheme: "http", Host: ln.Addr().String(), Path: "/"},
	}
	p.byPort[port] = pv
	p.wg.Go(func() { // owned by previews: close shuts the server and waits
		if err := pv.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Warn("preview proxy stopped", "port", port, "err", err)
		}
	})
	s.log.Info("preview listening", "port", port, "url", pv.url.String())
	return pv.url, nil
}

// track counts each request in wg while it is served; none starts once close has begun.
func (p *previews) track(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			http.Error(w, "toolhost: the sandbox has ended", http.StatusBadGateway)
			return
		}
		p.wg.Add(1)
		p.mu.Unlock()
		defer p.wg.Done()
		h.ServeHTTP(w, r)
	})
}

func (p *previews) close() {
	p.mu.Lock()
	p.closed = true
	if p.cancel != nil {
		p.cancel()
	}
	for _, pv := range p.byPort {
		_ = pv.srv.Close() // the listener and every connection not upgraded
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// portsScript prints the sandbox's TCP tables, the IPv4 one first, then which process
// holds which socket ("/proc/PID/fd socket:[INODE]") and the processes' names
// ("/proc/PID/comm:NAME"): two processes (find, grep), however many processes run.
const portsScript = `cat /proc/net/tcp; echo '--- tcp6'; cat /proc/net/tcp6 2>/dev/null
echo '--- fds'; find /proc/[0-9]*/fd -maxdepth 1 -lname 'socket:*' -printf '%h %l\n' 2>/dev/null
echo '--- comm'; grep -H . /proc/[0-9]*/comm 2>/dev/null; true`

// socketOwners reads portsScript's fds and comm sections into a function from a socket's
// inode to the lowest pid holding it and that process's name.
func socketOwners(fds, comms []byte) func(uint64) (int, string) {
	pids := map[uint64]int{}
	for line := range strings.Lines(string(fds)) {
		dir, link, ok := strings.Cut(strings.TrimSpace(line), " ")
		pidText, ok2 := strings.CutSuffix(strings.TrimPrefix(dir, "/proc/"), "/fd")
		inodeText, ok3 := strings.CutSuffix(strings.TrimPrefix(link, "socket:["), "]")
		pid, err1 := strconv.Atoi(pidText)
		inode, err2 := strconv.ParseUint(inodeText, 10, 64)
		if !ok || !ok2 || !ok3 || err1 != nil || err2 != nil {
			continue
		}
		if old, seen := pids[inode]; !seen || pid < old {
			pids[inode] = pid
		}
	}
	names := map[int]string{}
	for line := range strings.Lines(string(comms)) {
		file, name, ok := strings.Cut(strings.TrimSpace(line), ":")
		pidText, ok2 := strings.CutSuffix(strings.TrimPrefix(file, "/proc/"), "/comm")
		if pid, err := strconv.Atoi(pidText); ok && ok2 && err == nil {
			names[pid] = name
		}
	}
	return func(inode uint64) (int, string) {
		pid := pids[inode]
		return pid, names[pid]
	}
}

// Ports lists the TCP ports listened on in the sandbox (read from /proc/net/tcp{,6}:
// E2B's envd has no port list). The sandbox is a microVM of its own, so every listener
// is the sandbox's.
func (s *Sandbox) Ports(ctx context.Context) ([]envd.ListeningPort, error) {
	if err := s.closedErr(); err != nil {
		return nil, err
	}
	res, err := s.client.Exec(ctx, sandbox.ExecRequest{Argv: []string{"/bin/sh", "-c", portsScript}, MaxOutputBytes: 4 << 20})
	if err != nil {
		return nil, s.wrap(fmt.Errorf("list the ports of E2B sandbox %s: %w", s.id, err))
	}
	tcp, rest, _ := bytes.Cut(res.Stdout, []byte("--- tcp6\n"))
	tcp6, rest, _ := bytes.Cut(rest, []byte("--- fds\n"))
	fds, comms, _ := bytes.Cut(rest, []byte("--- comm\n"))
	ps, err := procnet.ListeningPorts(tcp, tcp6, socketOwners(fds, comms))
	if err != nil {
		return nil, fmt.Errorf("list the ports of E2B sandbox %s: %w", s.id, err)
	}
	out := ps[:0]
	for _, p := range ps {
		// envd's own port, and the egress proxy of a sandbox that has one (the fake's: its
		// agent holds it, and no process the command can see does) are no program's.
		if p.Port != EnvdPort && !(p.Port == sandbox.EgressPort && p.PID == 0) {
			out = append(out, p)
		}
	}
	return out, nil
}
