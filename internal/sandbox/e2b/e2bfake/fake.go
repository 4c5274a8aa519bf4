//go:build linux

// Package e2bfake is a fake E2B for tests: the control plane of E2B's OpenAPI spec and
// the envd data plane, on one listener on loopback, with each E2B sandbox backed by a
// real local sandbox (bubblewrap, internal/sandbox/local). Any E2B client can be pointed at
// it: the official SDKs through E2B_API_URL and E2B_SANDBOX_URL, this repository's e2b
// provider through its Config.
//
// Control plane (X-API-Key): create (POST /v2/sandboxes, and the deprecated v1), get,
// list (GET /v2/sandboxes with paging and filters, the metadata filter parsed as E2B
// parses it, and v1), set timeout, refreshes, kill,
// pause, resume and connect (v1 and v2), metrics (one sandbox and several), templates,
// health; errors as E2B's {"code","message"} with its statuses and texts; sandboxes
// expire at endAt (killed, or paused with autoPause).
//
// Data plane: requests reach a sandbox by Host ({port}-{id}.{domain}) or by the
// E2b-Sandbox-Id and E2b-Sandbox-Port headers. Port 49983 is envd: the fake speaks
// envd's protocol and nothing more, translating to the local sandbox's agent, which
// speaks a superset. The agent's toolhost extensions (its headers, query parameters, JSON
// fields and /toolhost endpoints) are hidden, and envd's own behaviour is emulated where
// the agent's differs: links are followed as the kernel follows them and described as
// envd describes them, a command's Connect deadline and SendSignal reach the started
// process only (never its group), multipart uploads are taken, keepalive events are
// sent. Other ports are the sandbox's previews (behind a traffic token when the sandbox
// asked for one); E2B's proxy errors (502 "The sandbox was not found", "port is not
// open") are given as E2B gives them.
//
// Faults can be injected (Inject, or POST /_fake/faults): an HTTP status (401, 429 with
// Retry-After, 5xx), a hang, a stream cut mid-way; and Vanish kills a sandbox under its
// clients, LoseFilesOnResume makes a resume restore an older state (E2B issue #884).
package e2bfake

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/toolhost/toolhost/internal/egress"
	"github.com/toolhost/toolhost/internal/sandbox/local"
)

// Template is a template the fake offers.
type Template struct {
	ID       string
	Aliases  []string
	CPUCount int
	MemoryMB int
}

// Config configures a fake.
type Config struct {
	// Local backs every sandbox with one of its sandboxes. Required.
	Local *local.Provider
	// APIKey is the one valid key; default DefaultAPIKey.
	APIKey string
	// Domain is the fake's domain ({port}-{id}.{Domain}); default DefaultDomain.
	Domain string
	// TLS serves HTTPS with a certificate of a CA made for the fake (CAPEM, CertPool).
	TLS bool
	// Templates offered; default base (2 CPUs, 512 MB).
	Templates []Template
	// MaxLifetime is the plan's longest sandbox life from its start; default 1h (Hobby).
	MaxLifetime time.Duration
	// MaxConcurrent running sandboxes; default 20 (Hobby).
	MaxConcurrent int
	// EnvdVersion reported for every sandbox; default 0.6.13.
	EnvdVersion string
	// Egress is the gateway every sandbox reaches the network through, with the rules of
	// its E2B network options (network.go); nil: a gateway over this machine's network.
	Egress *egress.Gateway
	// Trust is PEM certificates the sandboxes trust besides the system's.
	Trust  []byte
	Logger *slog.Logger
}

// Defaults.
const (
	DefaultAPIKey      = "e2b_0000000000000000000000000000000000000000"
	DefaultDomain      = "e2b.test"
	DefaultEnvdVersion = "0.6.13"
	envdPort           = 49983
	clientID           = "6532622b" // the constant E2B still sends
)

// Server is a running fake.
type Server struct {
	cfg     Config
	log     *slog.Logger
	gateway *egress.Gateway
	srv     *http.Server
	ln      net.Listener
	ca      *x509.Certificate
	caPE    []byte
	pool    *x509.CertPool

	mu        sync.Mutex
	sandboxes map[string]*fakeSandbox
	created   int // sandboxes created (Created)
	faults    []*activeFault
	closing   chan struct{}
	closed    bool
	wg        sync.WaitGroup // background work: expiries, pauses, resumes, kills
}

// New builds a fake; Serve or Listen start it.
func New(cfg Config) (*Server, error) {
	if cfg.Local == nil {
		return nil, errors.New("e2bfake: Config.Local is required")
	}
	if cfg.APIKey == "" {
		cfg.APIKey = DefaultAPIKey
	}
	if cfg.Domain == "" {
		cfg.Domain = DefaultDomain
	}
	if len(cfg.Templates) == 0 {
		cfg.Templates = []Template{{ID: "base", CPUCount: 2, MemoryMB: 512}}
	}
	if cfg.MaxLifetime <= 0 {
		cfg.MaxLifetime = time.Hour
	}
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = 20
	}
	if cfg.EnvdVersion == "" {
		cfg.EnvdVersion = DefaultEnvdVersion
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, sandboxes: map[string]*fakeSandbox{}, closing: make(chan struct{}), gateway: cfg.Egress}
	if s.gateway == nil {
		s.gateway = egress.New(egress.Config{Logger: cfg.Logger})
	}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 30 * time.Second,
		ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug)}
	if cfg.TLS {
		cert, err := s.makeCerts()
		if err != nil {
			return nil, err
		}
		s.srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	return s, nil
}

// Listen serves on addr (e.g. 127.0.0.1:0) until Close. Its goroutine is owned by Close.
func (s *Server) Listen(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("e2bfake: listen: %w", err)
	}
	s.Serve(ln)
	return nil
}

// Serve serves on ln (a listener in a test's network namespace, say) until Close, which
// closes ln. Its goroutine is owned by Close.
func (s *Server) Serve(ln net.Listener) {
	s.ln = ln
	s.wg.Go(func() {
		var err error
		if s.cfg.TLS {
			err = s.srv.ServeTLS(ln, "", "")
		} else {
			err = s.srv.Serve(ln)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("e2bfake: serve", "err", err)
		}
	})
}

// Addr is the listener's host:port.
func (s *Server) Addr() string { return s.ln.Addr().String() }

func (s *Server) scheme() string {
	if s.cfg.TLS {
		return "https"
	}
	return "http"
}

// URL is the fake's base URL (by address): E2B_API_URL and E2B_SANDBOX_URL.
func (s *Server) URL() string { return s.scheme() + "://" + s.Addr() }

// APIKey is the valid key; Domain the fake's domain.
func (s *Server) APIKey() string { return s.cfg.APIKey }
func (s *Server) Domain() string { return s.cfg.Domain }

// CAPEM is the PEM of the CA that signed the fake's certificate (TLS only).
func (s *Server) CAPEM() []byte { return s.caPE }

// CertPool trusts the fake's CA (TLS only).
func (s *Server) CertPool() *x509.CertPool { return s.pool }

// Env is what the official SDKs read to use the fake.
func (s *Server) Env() []string {
	return []string{"E2B_API_KEY=" + s.cfg.APIKey, "E2B_API_URL=" + s.URL(), "E2B_SANDBOX_URL=" + s.URL(), "E2B_DOMAIN=" + s.cfg.Domain}
}

// Transport is an HTTP transport that reaches any host of the fake's domain (and the
// API) at its listener, trusting its CA: for clients that address sandboxes by host.
func (s *Server) Transport() *http.Transport {
	d := &net.Dialer{Timeout: 10 * time.Second}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", s.Addr())
		},
		ForceAttemptHTTP2:  true,
		MaxIdleConns:       256,
		IdleConnTimeout:    90 * time.Second,
		DisableCompression: true,
	}
	if s.cfg.TLS {
		tr.TLSClientConfig = &tls.Config{RootCAs: s.pool, MinVersion: tls.VersionTLS12}
	}
	return tr
}

// Close stops serving, kills every sandbox and waits for the fake's goroutines.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closing)
	sbs := make([]*fakeSandbox, 0, len(s.sandboxes))
	for _, sb := range s.sandboxes {
		sbs = append(sbs, sb)
	}
	s.sandboxes = map[string]*fakeSandbox{}
	s.mu.Unlock()
	err := s.srv.Close()
	for _, sb := range sbs {
		sb.stop(ctx)
	}
	s.wg.Wait()
	return err
}

// ServeHTTP routes a request to the control plane, a sandbox's envd or a preview.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Every request is counted in wg, so Close waits for the sandboxes a request is
	// still creating; none starts once Close has begun.
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		apiError(w, http.StatusServiceUnavailable, "the fake is shutting down")
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	if strings.HasPrefix(r.URL.Path, "/_fake/") {
		s.admin(w, r)
		return
	}
	if id, port, ok, err := s.sandboxRoute(r); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	} else if ok {
		s.serveSandbox(w, r, id, port)
		return
	}
	s.serveAPI(w, r)
}

// sandboxRoute finds the sandbox a request is for: by the E2b-Sandbox-Id and
// E2b-Sandbox-Port headers (both or neither), or by a {port}-{id}.{domain} host.
func (s *Server) sandboxRoute(r *http.Request) (id string, port int, ok bool, err error) {
	hid, hport := r.Header.Get("E2b-Sandbox-Id"), r.Header.Get("E2b-Sandbox-Port")
	if hid != "" || hport != "" {
		if hid == "" || hport == "" {
			return "", 0, false, errors.New("missing header E2b-Sandbox-Id or E2b-Sandbox-Port")
		}
		p, err := strconv.Atoi(hport)
		if err != nil || p < 1 || p > 65535 {
			//lint:ignore ST1005 E2B's own message, as its clients see it
			return "", 0, false, errors.New("Invalid sandbox port")
		}
		return hid, p, true, nil
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.ToLower(host)
	label, ok := strings.CutSuffix(host, "."+s.cfg.Domain)
	if !ok || label == "api" || strings.Contains(label, ".") {
		return "", 0, false, nil
	}
	parts := strings.Split(label, "-")
	if len(parts) < 2 {
		//lint:ignore ST1005 E2B's own message, as its clients see it
		return "", 0, false, errors.New("Invalid host")
	}
	p, err := strconv.Atoi(parts[0])
	if err != nil || p < 1 || p > 65535 {
		//lint:ignore ST1005 E2B's own message, as its clients see it
		return "", 0, false, errors.New("Invalid sandbox port")
	}
	return parts[1], p, true, nil
}

// newID makes a sandbox ID as E2B does: 20 characters of [a-z0-9].
func newID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	var b [20]byte
	_, _ = rand.Read(b[:])
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b[:])
}

func validID(id string) bool {
	if len(id) != 20 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%x", b[:])
}

// writeJSON answers with a JSON body.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// apiError is E2B's error body.
func apiError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"code": status, "message": msg})
}

func (s *Server) isClosing() bool {
	select {
	case <-s.closing:
		return true
	default:
		return false
	}
}
