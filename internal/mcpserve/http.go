package mcpserve

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/fleet"
	"github.com/toolhost/toolhost/internal/storekeys"
)

// ProjectHeader names the project of the session a request opens (else the query
// parameter project).
const ProjectHeader = "Toolhost-Project"

// Token is a bearer token the HTTP handler accepts, and the projects it may open (none
// named: any).
type Token struct {
	// Name identifies the token in logs and binds the sessions it opens to it (never the
	// value).
	Name     string
	Value    string
	Projects []string
	// Egress narrows what the sessions the token opens may reach; nil: the host's policy.
	Egress *toolhost.EgressPolicy
}

// ReadTokensFile reads bearer tokens from a file: one a line, "TOKEN [PROJECT...]",
// blank lines and lines starting with # skipped. The file may not be readable by group
// or others.
func ReadTokensFile(path string) ([]Token, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading tokens: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("reading tokens: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("tokens file %s is readable by others (mode %v): chmod 600 it", path, st.Mode().Perm())
	}
	var out []Token
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		out = append(out, Token{Name: fmt.Sprintf("%s:%d", path, n), Value: fields[0], Projects: fields[1:]})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading tokens from %s: %w", path, err)
	}
	return out, nil
}

// CheckTokens refuses tokens too short to resist guessing, and projects that are not
// valid project names.
func CheckTokens(tokens []Token) error {
	for _, t := range tokens {
		if len(t.Value) < 16 {
			return fmt.Errorf("token %s is shorter than 16 characters: use a long random one (openssl rand -hex 32)", t.Name)
		}
		for _, p := range t.Projects {
			if err := storekeys.ValidProject(p); err != nil {
				return fmt.Errorf("token %s: %w", t.Name, err)
			}
		}
	}
	return nil
}

// CheckListen refuses to serve addr without tokens unless it is a loopback address
// (127.0.0.0/8, ::1 or localhost): anyone who can reach the port could run commands.
func CheckListen(addr string, tokens int) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("listen address %q: %w", addr, err)
	}
	if tokens > 0 || isLoopback(host) {
		return nil
	}
	return fmt.Errorf("refusing to listen on %s without bearer tokens: it is not a loopback address, and anyone who reaches it could run commands; set serve.tokens or serve.tokens_file, or listen on 127.0.0.1", addr)
}

// CheckNetwork refuses to serve without tokens while sandboxes get the host's network
// (sandbox.network host): a server without tokens trusts every process that can reach it,
// and such a sandbox reaches the host's loopback, so any command run in one could call
// the server and act in every project it serves.
func CheckNetwork(network string, tokens int) error {
	if tokens > 0 || network != toolhost.NetworkHost {
		return nil
	}
	return errors.New("refusing to serve without bearer tokens while sandbox.network is host: a sandbox on the host's network reaches this server on loopback, and without tokens it could run commands in every project served; set serve.tokens or serve.tokens_file, or give sandboxes another network")
}

// hostGuard refuses a request to a loopback listener whose Host header is not a
// loopback name (a DNS-rebinding page in a browser would send its own name), on every
// path: the MCP SDK guards /mcp alone.
func hostGuard(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok && la != nil {
			if lh, _, err := net.SplitHostPort(la.String()); err == nil && isLoopback(lh) {
				host := r.Host
				if hn, _, err := net.SplitHostPort(host); err == nil {
					host = hn
				}
				if !isLoopback(strings.Trim(host, "[]")) {
					http.Error(w, fmt.Sprintf("Forbidden: Host %q is not a loopback name, and this server listens on loopback", r.Host), http.StatusForbidden)
					return
				}
			}
		}
		h.ServeHTTP(w, r)
	})
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

type ctxKey int

const projectKey ctxKey = iota

// Handler is the HTTP interface: the MCP endpoint at /mcp (streamable HTTP, one session
// per Mcp-Session-Id), /healthz, and /metrics (Prometheus text). With tokens, /mcp and
// /metrics need "Authorization: Bearer TOKEN".
func (s *Server) Handler() http.Handler {
	h := mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		if a, ok := r.Context().Value(adoptKey).(adoption); ok {
			return s.newMCPServerID(a.rec.Project, a.rec.Owner, a.id) // fleet.go
		}
		project, _ := r.Context().Value(projectKey).(string)
		if project == "" {
			return nil
		}
		return s.newMCPServer(project, principalOf(r))
	}, &mcp.StreamableHTTPOptions{
		SessionTimeout:      s.opts.IdleTimeout,
		MaxRequestBodyBytes: s.opts.MaxBodyBytes,
		Logger:              s.log,
	})
	// The stateless revision (2026-07-28) on the same endpoint: one server for every
	// request, sessions as handles (stateless.go).
	sh := mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		if project, _ := r.Context().Value(projectKey).(string); project == "" {
			return nil
		}
		return s.statelessServer()
	}, &mcp.StreamableHTTPOptions{
		Stateless:                    true,
		PropagateRequestCancellation: true,
		MaxRequestBodyBytes:          s.opts.MaxBodyBytes,
		Logger:                       s.log,
	})
	// A cancelled request of the session revision gets no response (cancel.go); one of
	// the stateless revision is cancelled by ending its HTTP request, which then carries
	// none.
	stateful := s.adoptingHandler(newCancelGuard(h, s.opts.MaxBodyBytes, s.metrics.cancelDropped))
	byEra := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if statelessEra(r) {
			sh.ServeHTTP(w, r)
			return
		}
		stateful.ServeHTTP(w, r)
	})
	var mcpH http.Handler = http.NewCrossOriginProtection().Handler(s.gate(byEra))
	if s.opts.Fleet != nil {
		mcpH = s.route(mcpH) // after the token is checked: it names the principal
	}
	metricsH := http.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		s.metrics.WriteTo(w)
	}))
	if len(s.opts.Tokens) > 0 {
		mw := auth.RequireBearerToken(s.verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})
		mcpH, metricsH = s.countRefusals(mw(mcpH)), s.countRefusals(mw(metricsH))
	}
	if s.opts.Fleet != nil {
		mcpH = s.fleetIn(mcpH) // a signed request stands in for its principal's token
	}
	mcpH = s.traceHTTP(mcpH) // each request a span, continuing the trace it came with
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcpH)
	mux.Handle("GET /metrics", metricsH)
	if s.opts.Fleet != nil {
		mux.Handle("GET "+fleet.HealthPath, s.opts.Fleet.HealthHandler())
	}
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		closing := s.closing
		s.mu.Unlock()
		if closing {
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return hostGuard(mux)
}

// verify finds the token among the configured ones, comparing digests in constant time
// and looking at every token whatever matched.
func (s *Server) verify(_ context.Context, token string, r *http.Request) (*auth.TokenInfo, error) {
	if principal, ok := verifiedPrincipal(r); ok && token == fleetToken {
		// A fleet request, its signature checked (fleetIn): it acts for the token of that
		// name, which every replica of the fleet has.
		for i := range s.opts.Tokens {
			if s.opts.Tokens[i].Name == principal {
				t := &s.opts.Tokens[i]
				return &auth.TokenInfo{UserID: t.Name, Expiration: time.Now().Add(24 * time.Hour),
					Extra: map[string]any{"projects": t.Projects}}, nil
			}
		}
		return nil, fmt.Errorf("%w: the fleet request acts for a token this replica does not have", auth.ErrInvalidToken)
	}
	got := sha256.Sum256([]byte(token))
	var match *Token
	for i := range s.opts.Tokens {
		want := sha256.Sum256([]byte(s.opts.Tokens[i].Value))
		if subtle.ConstantTimeCompare(got[:], want[:]) == 1 && match == nil {
			match = &s.opts.Tokens[i]
		}
	}
	if match == nil {
		return nil, fmt.Errorf("%w: the bearer token is not one of this server's", auth.ErrInvalidToken)
	}
	return &auth.TokenInfo{UserID: match.Name, Expiration: time.Now().Add(24 * time.Hour),
		Extra: map[string]any{"projects": match.Projects}}, nil
}

// countRefusals counts the requests h answers 401, and gives each 401 the challenge it
// must carry (RFC 9110 section 11.6.1): a bearer token in realm toolhost, and when the
// request sent one, that it was refused (RFC 6750 section 3). The tokens are static, with
// no OAuth authorization server behind them, so there is no protected resource metadata
// to point to (the resource_metadata of MCP's authorization, for servers that have one).
func (s *Server) countRefusals(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		challenge := `Bearer realm="toolhost"`
		if r.Header.Get("Authorization") != "" {
			challenge += `, error="invalid_token", error_description="the bearer token is not one of this server's"`
		}
		sw := &statusWriter{ResponseWriter: w, challenge: challenge}
		h.ServeHTTP(sw, r)
		if sw.status == http.StatusUnauthorized {
			s.metrics.authRefused.Add(1)
		}
	})
}

type statusWriter struct {
	http.ResponseWriter
	status    int
	challenge string // WWW-Authenticate of a 401 that has none
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	if code == http.StatusUnauthorized && w.challenge != "" && w.Header().Get("WWW-Authenticate") == "" {
		w.Header().Set("WWW-Authenticate", w.challenge)
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// gate decides the project of a request that opens a session (one without
// Mcp-Session-Id), refuses one the token may not open (403) and new sessions past
// MaxSessions or while shutting down (503).
func (s *Server) gate(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		stateless := statelessEra(r)
		if r.Method != http.MethodPost || (r.Header.Get("Mcp-Session-Id") != "" && !stateless) {
			h.ServeHTTP(w, r)
			return
		}
		project, err := s.chooseProject(r)
		switch {
		case errors.Is(err, errProjectRefused):
			s.metrics.projectRefused.Add(1)
			http.Error(w, err.Error(), http.StatusForbidden)
			return
		case err != nil:
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if stateless {
			// Every request of the stateless revision names its project; the handlers
			// read it from this header (and count sessions where they open one).
			r = r.Clone(r.Context())
			r.Header.Set(ProjectHeader, project)
		}
		// A request opening a session holds a slot from here until its session is watched
		// (from its first request on, see newMCPServer) or it failed: requests arriving
		// together cannot all pass the count before any is counted.
		s.mu.Lock()
		full := !stateless && (len(s.connected)+s.pending >= s.opts.MaxSessions || len(s.open) >= s.opts.MaxSessions)
		closing := s.closing
		held := !full && !closing && !stateless
		if held {
			s.pending++
		}
		s.mu.Unlock()
		switch {
		case closing:
			http.Error(w, "the server is shutting down", http.StatusServiceUnavailable)
			return
		case full:
			w.Header().Set("Retry-After", "30")
			http.Error(w, fmt.Sprintf("the server has %d sessions open, its limit; try again later", s.opts.MaxSessions), http.StatusServiceUnavailable)
			return
		}
		if held {
			defer func() {
				s.mu.Lock()
				s.pending--
				s.mu.Unlock()
			}()
		}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), projectKey, project)))
	})
}

// errProjectRefused: the token may not open the project a request names.
var errProjectRefused = errors.New("project refused")

// chooseProject is the project a request that opens a session (or a stateless request)
// is for: its Toolhost-Project header, else ?project=, else the token's first project,
// else Options.Project. An invalid one is an error; one the token may not open matches
// errProjectRefused.
func (s *Server) chooseProject(r *http.Request) (string, error) {
	var allowed []string
	if ti := auth.TokenInfoFromContext(r.Context()); ti != nil {
		allowed, _ = ti.Extra["projects"].([]string)
	}
	project := r.Header.Get(ProjectHeader)
	if project == "" {
		project = r.URL.Query().Get("project")
	}
	if project == "" {
		project = s.opts.Project
		if len(allowed) > 0 {
			project = allowed[0]
		}
	}
	if err := storekeys.ValidProject(project); err != nil {
		return "", fmt.Errorf("project %q: %w", project, err)
	}
	if len(allowed) > 0 && !slices.Contains(allowed, project) {
		return "", fmt.Errorf("%w: this token may not open project %s (it may open: %s)", errProjectRefused, project, strings.Join(allowed, ", "))
	}
	return project, nil
}

// readyz answers 200 while the server takes requests and its store answers; 503 while it
// shuts down or drains, or when the store cannot be read (a balancer's readiness check).
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	closing := s.closing
	s.mu.Unlock()
	if closing || (s.opts.Fleet != nil && s.opts.Fleet.Draining()) {
		http.Error(w, "draining: not taking new requests", http.StatusServiceUnavailable)
		return
	}
	if err := s.storeAnswers(r.Context()); err != nil {
		s.log.Warn("readyz: the store does not answer", "err", err)
		http.Error(w, "the store does not answer", http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "ready")
}

// readyCheckTTL is how long the answer of the store to readyz's check is reused: the
// balancers' probes of every replica, every second or two, would otherwise each cost a
// request to the store (a paid LIST on S3).
const readyCheckTTL = 2 * time.Second

// storeAnswers checks that the store answers, at most once per readyCheckTTL; probes
// that arrive while a check runs wait for it.
func (s *Server) storeAnswers(ctx context.Context) error {
	s.ready.mu.Lock()
	defer s.ready.mu.Unlock()
	if !s.ready.at.IsZero() && time.Since(s.ready.at) < readyCheckTTL {
		return s.ready.err
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err := s.fleetStore().List(cctx, store.ListOptions{Prefix: storekeys.FleetReplicas, MaxKeys: 1})
	if ctx.Err() != nil {
		return err // this probe went away: its answer says nothing of the store
	}
	s.ready.at, s.ready.err = time.Now(), err
	return err
}

// ListenAndServe serves Handler on addr until ctx ends (SIGTERM, say), then stops taking
// requests, commits every session and closes every sandbox (Shutdown), bounded by
// grace. ready, when not nil, is called with the address once it listens.
func (s *Server) ListenAndServe(ctx context.Context, addr string, grace time.Duration, ready func(net.Addr)) error {
	if err := CheckListen(addr, len(s.opts.Tokens)); err != nil {
		return err
	}
	if err := CheckNetwork(s.th.Config().Sandbox.Network, len(s.opts.Tokens)); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", addr, err)
	}
	hs := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }() // owned here: ends when hs is shut down below
	if ready != nil {
		ready(ln.Addr())
	}
	if s.opts.Fleet != nil {
		rctx, stop := context.WithCancel(ctx)
		reaped := make(chan struct{})
		go func() { defer close(reaped); s.reapOrphans(rctx) }() // owned here: stopped below
		defer func() { stop(); <-reaped }()
	}
	s.log.Info("mcp: serving", "addr", ln.Addr().String(), "endpoint", "/mcp", "tokens", len(s.opts.Tokens))
	select {
	case err := <-errc:
		return fmt.Errorf("serving %s: %w", addr, err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	// A replica of a fleet with serve.drain handoff hands its sessions over first, while
	// it still answers requests (forwarding them to the sessions' new replicas).
	var derr error
	if s.opts.Drain == toolhost.DrainHandoff && s.opts.Fleet != nil {
		derr = s.Drain(sctx)
		// The answers of the calls that ended during the drain are written before the
		// sessions' streams are closed: the HTTP server stops taking connections (the
		// balancer sends them elsewhere) and finishes the requests under way; a stream
		// still open after the bound (a client's standalone GET) is cut below.
		fctx, fcancel := context.WithTimeout(sctx, 5*time.Second)
		hs.Shutdown(fctx)
		fcancel()
	}
	// Sessions first: Shutdown closes their MCP sessions, which ends their open streams,
	// so the HTTP server's own shutdown has nothing long left to wait for.
	serr := errors.Join(derr, s.Shutdown(sctx))
	hctx, hcancel := context.WithTimeout(sctx, 5*time.Second)
	defer hcancel()
	if err := hs.Shutdown(hctx); err != nil {
		hs.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		serr = errors.Join(serr, err)
	}
	return serr
}
