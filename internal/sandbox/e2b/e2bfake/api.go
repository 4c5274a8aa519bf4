//go:build linux

package e2bfake

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/egress"
	"github.com/toolhost/toolhost/internal/sandbox/local"
)

// fakeSandbox is one E2B sandbox and the local sandbox behind it while it runs.
type fakeSandbox struct {
	s          *Server
	id         string
	templateID string
	alias      string
	cpu, mem   int
	token      string // envd access token
	traffic    string // traffic access token, when public traffic is off
	metadata   map[string]string
	envVars    map[string]string
	net        netRules // its network options (under mu once it runs)
	autoPause  bool
	startedAt  time.Time

	mu           sync.Mutex
	state        string // running, paused, killed
	endAt        time.Time
	local        *local.Sandbox
	egress       *egress.SessionGateway // its side of the gateway, while it runs
	agent        *http.Client           // to local's agent socket
	agentTr      *http.Transport
	timer        *time.Timer
	snaps        [][]byte // workspace archives of each pause, oldest first
	loseOnResume bool
}

const (
	stateRunning = "running"
	statePaused  = "paused"
	stateKilled  = "killed"
)

// startLocal creates the local sandbox behind sb (and, with archive, restores it).
func (sb *fakeSandbox) startLocal(ctx context.Context, archive []byte) error {
	sb.mu.Lock()
	rules := sb.net
	sb.mu.Unlock()
	spec, err := rules.spec()
	if err != nil {
		return err
	}
	pol, err := egress.Compile(spec)
	if err != nil {
		return err
	}
	sess := sb.s.gateway.Session(egress.SessionConfig{Project: "e2b:" + sb.id, Policy: pol})
	lsb, err := sb.s.cfg.Local.Create(ctx, sandbox.CreateOptions{
		Network: sandbox.NetworkEgress, Env: sb.envVars, Timeout: sb.s.cfg.MaxLifetime + time.Hour,
		Egress: &sandbox.Egress{Gateway: sess, Trust: sb.s.cfg.Trust},
	})
	if err != nil {
		return err
	}
	l := lsb.(*local.Sandbox)
	if archive != nil {
		if err := l.Extract(ctx, bytes.NewReader(archive)); err != nil {
			_ = l.Close(context.WithoutCancel(ctx))
			return err
		}
	}
	sock := l.AgentSocket()
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		MaxIdleConnsPerHost: 32,
		DisableCompression:  true,
	}
	sb.mu.Lock()
	sb.local, sb.agentTr, sb.agent, sb.egress = l, tr, &http.Client{Transport: tr}, sess
	sb.state = stateRunning
	sb.mu.Unlock()
	return nil
}

// stopLocal closes the local sandbox behind sb.
func (sb *fakeSandbox) stopLocal(ctx context.Context) {
	sb.mu.Lock()
	l, tr := sb.local, sb.agentTr
	sb.local, sb.agent, sb.agentTr, sb.egress = nil, nil, nil, nil
	sb.mu.Unlock()
	if tr != nil {
		tr.CloseIdleConnections()
	}
	if l != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		_ = l.Close(cctx)
		cancel()
	}
}

// stop kills sb for good.
func (sb *fakeSandbox) stop(ctx context.Context) {
	sb.mu.Lock()
	sb.state = stateKilled
	if sb.timer != nil {
		sb.timer.Stop()
	}
	sb.mu.Unlock()
	sb.stopLocal(ctx)
}

// arm sets the expiry timer at endAt. Called with sb.mu held.
func (sb *fakeSandbox) arm() {
	if sb.timer != nil {
		sb.timer.Stop()
	}
	sb.timer = time.AfterFunc(time.Until(sb.endAt), func() {
		sb.s.mu.Lock()
		closed := sb.s.closed
		if !closed {
			sb.s.wg.Add(1)
		}
		sb.s.mu.Unlock()
		if closed {
			return
		}
		go func() { // counted in s.wg: Close waits for it
			defer sb.s.wg.Done()
			sb.expire()
		}()
	})
}

// expire runs at endAt: the sandbox is killed, or paused with autoPause.
func (sb *fakeSandbox) expire() {
	sb.mu.Lock()
	if sb.state != stateRunning || time.Now().Before(sb.endAt) {
		sb.mu.Unlock()
		return
	}
	pause := sb.autoPause
	sb.mu.Unlock()
	ctx := context.Background()
	if pause {
		if err := sb.pause(ctx); err == nil {
			return
		}
	}
	sb.s.remove(sb.id)
	sb.stop(ctx)
	sb.s.log.Info("e2bfake: sandbox reached its end time", "sandbox", sb.id)
}

// pause archives the workspace (memory is not kept: a fake pause is filesystem-only)
// and stops the local sandbox.
func (sb *fakeSandbox) pause(ctx context.Context) error {
	sb.mu.Lock()
	l := sb.local
	if sb.state != stateRunning || l == nil {
		sb.mu.Unlock()
		return fmt.Errorf("sandbox %s is %s", sb.id, sb.state)
	}
	sb.state = "pausing"
	if sb.timer != nil {
		sb.timer.Stop()
	}
	sb.mu.Unlock()
	var buf bytes.Buffer
	if err := l.Archive(ctx, &buf, []string{}); err != nil {
		sb.mu.Lock()
		sb.state = stateRunning
		sb.arm()
		sb.mu.Unlock()
		return err
	}
	sb.stopLocal(ctx)
	sb.mu.Lock()
	sb.snaps = append(sb.snaps, buf.Bytes())
	sb.state = statePaused
	sb.endAt = time.Now() // for a paused sandbox, endAt is when it was paused
	sb.mu.Unlock()
	return nil
}

// resume restores the newest pause (or, with the #884 fault, the first) into a new local
// sandbox that lives timeout.
func (sb *fakeSandbox) resume(ctx context.Context, timeout time.Duration) error {
	sb.mu.Lock()
	if sb.state != statePaused || len(sb.snaps) == 0 {
		sb.mu.Unlock()
		return fmt.Errorf("sandbox %s is %s", sb.id, sb.state)
	}
	snap := sb.snaps[len(sb.snaps)-1]
	if sb.loseOnResume {
		snap, sb.loseOnResume = sb.snaps[0], false
	}
	sb.state = "resuming"
	sb.mu.Unlock()
	if err := sb.startLocal(ctx, snap); err != nil {
		sb.mu.Lock()
		sb.state = statePaused
		sb.mu.Unlock()
		return err
	}
	sb.mu.Lock()
	sb.endAt = time.Now().Add(timeout)
	sb.arm()
	sb.mu.Unlock()
	return nil
}

func (s *Server) remove(id string) {
	s.mu.Lock()
	delete(s.sandboxes, id)
	s.mu.Unlock()
}

func (s *Server) lookup(id string) *fakeSandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sandboxes[id]
}

// ---- control plane

// serveAPI answers the REST API.
func (s *Server) serveAPI(w http.ResponseWriter, r *http.Request) {
	op, id, handler := s.apiRoute(r)
	if handler == nil {
		apiError(w, http.StatusNotFound, "Not found")
		return
	}
	if op == "health" {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "Health check successful")
		return
	}
	if !s.authorized(w, r) {
		return
	}
	if s.fault(w, r, op, id) {
		return
	}
	if id != "" && !validID(id) {
		// The API strips the legacy "-<clientID>" suffix first.
		if base, _, ok := strings.Cut(id, "-"); ok && validID(base) {
			id = base
		} else {
			apiError(w, http.StatusBadRequest, "Invalid sandbox ID")
			return
		}
	}
	handler(w, r, id)
}

// apiRoute maps a request to its operation name (for faults), sandbox ID and handler.
func (s *Server) apiRoute(r *http.Request) (string, string, func(http.ResponseWriter, *http.Request, string)) {
	p := r.URL.Path
	m := r.Method
	switch {
	case p == "/health" && m == http.MethodGet:
		return "health", "", func(http.ResponseWriter, *http.Request, string) {}
	case (p == "/v2/sandboxes" || p == "/sandboxes") && m == http.MethodPost:
		v2 := p == "/v2/sandboxes"
		return "create", "", func(w http.ResponseWriter, r *http.Request, _ string) { s.create(w, r, v2) }
	case p == "/v2/sandboxes" && m == http.MethodGet:
		return "list", "", func(w http.ResponseWriter, r *http.Request, _ string) { s.list(w, r, true) }
	case p == "/sandboxes" && m == http.MethodGet:
		return "list", "", func(w http.ResponseWriter, r *http.Request, _ string) { s.list(w, r, false) }
	case p == "/sandboxes/metrics" && m == http.MethodGet:
		return "metrics", "", func(w http.ResponseWriter, r *http.Request, _ string) { s.metricsMany(w, r) }
	case p == "/templates" && m == http.MethodGet:
		return "templates", "", func(w http.ResponseWriter, r *http.Request, _ string) { s.templates(w) }
	}
	rest, v2 := strings.CutPrefix(p, "/v2/sandboxes/")
	if !v2 {
		var ok bool
		if rest, ok = strings.CutPrefix(p, "/sandboxes/"); !ok {
			return "", "", nil
		}
	}
	id, action, _ := strings.Cut(rest, "/")
	if id == "" {
		return "", "", nil
	}
	switch {
	case action == "" && m == http.MethodGet && !v2:
		return "get", id, s.get
	case action == "" && m == http.MethodDelete && !v2:
		return "kill", id, s.kill
	case action == "timeout" && m == http.MethodPost && !v2:
		return "timeout", id, s.setTimeout
	case action == "refreshes" && m == http.MethodPost && !v2:
		return "timeout", id, s.refresh
	case action == "pause" && m == http.MethodPost && !v2:
		return "pause", id, s.pauseHandler
	case action == "resume" && m == http.MethodPost && !v2:
		return "resume", id, s.resumeHandler
	case action == "connect" && m == http.MethodPost:
		return "connect", id, func(w http.ResponseWriter, r *http.Request, id string) { s.connect(w, r, id, v2) }
	case action == "metrics" && m == http.MethodGet && !v2:
		return "metrics", id, s.metrics
	case action == "network" && m == http.MethodPut && !v2:
		return "network", id, s.updateNetwork
	}
	return "", "", nil
}

// authorized checks X-API-Key with E2B's 401 texts.
func (s *Server) authorized(w http.ResponseWriter, r *http.Request) bool {
	key := r.Header.Get("X-API-Key")
	switch {
	case key == "":
		apiError(w, http.StatusUnauthorized, "authorization header is missing")
	case !strings.HasPrefix(key, "e2b_"):
		apiError(w, http.StatusUnauthorized, "authorization header is malformed")
	case key != s.cfg.APIKey:
		apiError(w, http.StatusUnauthorized, "Invalid API key, please visit https://e2b.dev/docs/api-key for more information.\nCannot get the team for the given API key")
	default:
		return true
	}
	return false
}

// createBody is NewSandbox (v1) and NewSandboxV2.
type createBody struct {
	TemplateID          *string           `json:"templateID"`
	Timeout             *int              `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	Secure              *bool             `json:"secure"`
	AutoPause           *bool             `json:"autoPause"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *struct {
		AllowPublicTraffic *bool    `json:"allowPublicTraffic"`
		AllowOut           []string `json:"allowOut"`
		DenyOut            []string `json:"denyOut"`
	} `json:"network"`
}

func (s *Server) template(ref string) (Template, bool) {
	name, _, _ := strings.Cut(ref, ":") // a tag is accepted and ignored
	for _, t := range s.cfg.Templates {
		if t.ID == name || slices.Contains(t.Aliases, name) {
			return t, true
		}
	}
	return Template{}, false
}

func (s *Server) maxHours() int { return int(s.cfg.MaxLifetime.Hours()) }

func (s *Server) create(w http.ResponseWriter, r *http.Request, v2 bool) {
	var in createBody
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&in); err != nil {
		apiError(w, http.StatusBadRequest, "Error when parsing request: "+err.Error())
		return
	}
	if in.TemplateID == nil || *in.TemplateID == "" {
		apiError(w, http.StatusBadRequest, "Error when parsing request: property \"templateID\" is missing")
		return
	}
	tmpl, ok := s.template(*in.TemplateID)
	if !ok {
		apiError(w, http.StatusNotFound, fmt.Sprintf("template '%s' not found", *in.TemplateID))
		return
	}
	timeout := 15 // v1's default
	if v2 {
		timeout = 300
	}
	if in.Timeout != nil {
		timeout = *in.Timeout
	}
	if timeout <= 0 {
		apiError(w, http.StatusBadRequest, "Timeout must be greater than 0")
		return
	}
	if time.Duration(timeout)*time.Second > s.cfg.MaxLifetime {
		apiError(w, http.StatusBadRequest, fmt.Sprintf("Timeout cannot be greater than %d hours", s.maxHours()))
		return
	}
	secure := v2 || (in.Secure != nil && *in.Secure)
	public := in.Network == nil || in.Network.AllowPublicTraffic == nil || *in.Network.AllowPublicTraffic
	if !public && !secure {
		apiError(w, http.StatusBadRequest, "allowPublicTraffic=false requires secure=true")
		return
	}
	sb := &fakeSandbox{
		s: s, id: newID(), templateID: tmpl.ID, cpu: tmpl.CPUCount, mem: tmpl.MemoryMB,
		metadata: maps.Clone(in.Metadata), envVars: maps.Clone(in.EnvVars),
		net:       netRules{Internet: in.AllowInternetAccess == nil || *in.AllowInternetAccess},
		autoPause: in.AutoPause != nil && *in.AutoPause, state: "starting",
	}
	if in.Network != nil {
		sb.net.AllowOut, sb.net.DenyOut = slices.Clone(in.Network.AllowOut), slices.Clone(in.Network.DenyOut)
	}
	if _, err := sb.net.spec(); err != nil {
		apiError(w, http.StatusBadRequest, err.Error())
		return
	}
	if *in.TemplateID != tmpl.ID {
		sb.alias = *in.TemplateID
	}
	if secure {
		sb.token = newToken()
	}
	if !public {
		sb.traffic = newToken()
	}
	s.mu.Lock()
	running := 0
	for _, o := range s.sandboxes {
		if o.stateOf() != statePaused {
			running++
		}
	}
	if running >= s.cfg.MaxConcurrent {
		s.mu.Unlock()
		apiError(w, http.StatusTooManyRequests, fmt.Sprintf("you have reached the maximum number of concurrent E2B sandboxes (%d). If you need more, please contact us at 'https://e2b.dev/docs/getting-help'", s.cfg.MaxConcurrent))
		return
	}
	s.sandboxes[sb.id] = sb // reserves the slot while the local sandbox starts
	s.mu.Unlock()
	if err := sb.startLocal(r.Context(), nil); err != nil {
		s.remove(sb.id)
		writeJSON(w, http.StatusInternalServerError, map[string]any{"code": 500, "message": "Failed to create sandbox: " + err.Error(), "error_code": "sandbox_create_failed"})
		return
	}
	sb.mu.Lock()
	sb.startedAt = time.Now()
	sb.endAt = sb.startedAt.Add(time.Duration(timeout) * time.Second)
	sb.arm()
	sb.mu.Unlock()
	s.mu.Lock()
	s.created++
	s.mu.Unlock()
	if s.isClosing() {
		sb.stop(context.Background())
		apiError(w, http.StatusServiceUnavailable, "shutting down")
		return
	}
	writeJSON(w, http.StatusCreated, sb.created(s))
}

func (sb *fakeSandbox) stateOf() string {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.state
}

// created is the Sandbox schema.
func (sb *fakeSandbox) created(s *Server) map[string]any {
	out := map[string]any{
		"templateID":  sb.templateID,
		"sandboxID":   sb.id,
		"clientID":    clientID,
		"envdVersion": s.cfg.EnvdVersion,
		"domain":      s.cfg.Domain,
	}
	if sb.alias != "" {
		out["alias"] = sb.alias
	}
	if sb.token != "" {
		out["envdAccessToken"] = sb.token
	}
	if sb.traffic != "" {
		out["trafficAccessToken"] = sb.traffic
	} else {
		out["trafficAccessToken"] = nil
	}
	return out
}

// detail is the SandboxDetail (full) or ListedSandbox schema.
func (sb *fakeSandbox) detail(s *Server, full bool) map[string]any {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	state := sb.state
	if state != statePaused {
		state = stateRunning
	}
	out := map[string]any{
		"templateID":  sb.templateID,
		"sandboxID":   sb.id,
		"clientID":    clientID,
		"startedAt":   sb.startedAt.UTC().Format(time.RFC3339Nano),
		"endAt":       sb.endAt.UTC().Format(time.RFC3339Nano),
		"cpuCount":    sb.cpu,
		"memoryMB":    sb.mem,
		"diskSizeMB":  1024,
		"metadata":    orEmpty(sb.metadata),
		"state":       state,
		"envdVersion": s.cfg.EnvdVersion,
	}
	if sb.alias != "" {
		out["alias"] = sb.alias
	}
	if full {
		out["domain"] = s.cfg.Domain
		out["allowInternetAccess"] = sb.net.Internet
		onTimeout := "kill"
		if sb.autoPause {
			onTimeout = "pause"
		}
		out["lifecycle"] = map[string]any{"autoResume": false, "onTimeout": onTimeout}
		if sb.token != "" {
			out["envdAccessToken"] = sb.token
		}
	}
	return out
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

func notFound(w http.ResponseWriter, id string) {
	apiError(w, http.StatusNotFound, fmt.Sprintf("Sandbox \"%s\" doesn't exist or you don't have access to it", id))
}

func (s *Server) get(w http.ResponseWriter, _ *http.Request, id string) {
	sb := s.lookup(id)
	if sb == nil {
		notFound(w, id)
		return
	}
	writeJSON(w, http.StatusOK, sb.detail(s, true))
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request, id string) {
	sb := s.lookup(id)
	if sb == nil {
		notFound(w, id)
		return
	}
	s.remove(id)
	sb.stop(r.Context())
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request, id string) {
	var in struct {
		Timeout *int `json:"timeout"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&in); err != nil || in.Timeout == nil {
		apiError(w, http.StatusBadRequest, "Error when parsing request: property \"timeout\" is missing")
		return
	}
	s.extend(w, id, max(*in.Timeout, 0), false)
}

func (s *Server) refresh(w http.ResponseWriter, r *http.Request, id string) {
	var in struct {
		Duration int `json:"duration"`
	}
	_ = json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&in)
	if in.Duration < 0 || in.Duration > 3600 {
		apiError(w, http.StatusBadRequest, "Duration must be between 0 and 3600 seconds")
		return
	}
	s.extend(w, id, in.Duration, true)
}

// extend sets endAt to now+seconds (only later, with onlyLonger), clamped to the plan's
// maximum from the start; past that maximum already, it is refused.
func (s *Server) extend(w http.ResponseWriter, id string, seconds int, onlyLonger bool) {
	sb := s.lookup(id)
	if sb == nil {
		notFound(w, id)
		return
	}
	status, msg := sb.extend(s.cfg.MaxLifetime, seconds, onlyLonger)
	switch status {
	case http.StatusNoContent:
		w.WriteHeader(status)
	case http.StatusNotFound:
		notFound(w, id)
	default:
		apiError(w, status, msg)
	}
}

func (sb *fakeSandbox) extend(maxLife time.Duration, seconds int, onlyLonger bool) (int, string) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	switch sb.state {
	case stateRunning:
	case statePaused:
		return http.StatusNotFound, ""
	default:
		return http.StatusConflict, fmt.Sprintf("Sandbox %s is being %s", sb.id, sb.state)
	}
	limit := sb.startedAt.Add(maxLife)
	now := time.Now()
	if !now.Before(limit) {
		return http.StatusBadRequest, "Max instance length exceeded"
	}
	end := now.Add(time.Duration(seconds) * time.Second)
	if end.After(limit) {
		end = limit
	}
	if !onlyLonger || end.After(sb.endAt) {
		sb.endAt = end
		sb.arm()
	}
	return http.StatusNoContent, ""
}

func (s *Server) pauseHandler(w http.ResponseWriter, r *http.Request, id string) {
	sb := s.lookup(id)
	if sb == nil {
		notFound(w, id)
		return
	}
	switch st := sb.stateOf(); st {
	case statePaused:
		apiError(w, http.StatusConflict, fmt.Sprintf("Sandbox %s is already paused", id))
		return
	case stateRunning:
	default:
		apiError(w, http.StatusConflict, fmt.Sprintf("Sandbox %s cannot be paused while in '%s' state", id, st))
		return
	}
	if err := sb.pause(r.Context()); err != nil {
		apiError(w, http.StatusInternalServerError, "Error pausing sandbox: "+err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) resumeHandler(w http.ResponseWriter, r *http.Request, id string) {
	var in struct {
		Timeout *int `json:"timeout"`
	}
	_ = json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&in)
	sb := s.lookup(id)
	if sb == nil {
		notFound(w, id)
		return
	}
	if sb.stateOf() != statePaused {
		apiError(w, http.StatusConflict, fmt.Sprintf("Sandbox %s is already running", id))
		return
	}
	timeout := 15
	if in.Timeout != nil {
		timeout = *in.Timeout
	}
	s.doResume(w, r, sb, timeout)
}

func (s *Server) doResume(w http.ResponseWriter, r *http.Request, sb *fakeSandbox, timeout int) {
	if time.Duration(timeout)*time.Second > s.cfg.MaxLifetime {
		apiError(w, http.StatusBadRequest, fmt.Sprintf("Timeout cannot be greater than %d hours", s.maxHours()))
		return
	}
	if err := sb.resume(r.Context(), time.Duration(timeout)*time.Second); err != nil {
		apiError(w, http.StatusInternalServerError, "Failed to resume sandbox: "+err.Error())
		return
	}
	writeJSON(w, http.StatusCreated, sb.created(s))
}

// connect: a running sandbox is only ever extended (200); a paused one resumes (201).
// v1 requires the timeout; v2 takes an optional body, default 300 s.
func (s *Server) connect(w http.ResponseWriter, r *http.Request, id string, v2 bool) {
	var in struct {
		Timeout *int `json:"timeout"`
	}
	b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if len(bytes.TrimSpace(b)) > 0 {
		if err := json.Unmarshal(b, &in); err != nil {
			apiError(w, http.StatusBadRequest, "Error when parsing request: "+err.Error())
			return
		}
	}
	if in.Timeout == nil {
		if !v2 {
			apiError(w, http.StatusBadRequest, "Error when parsing request: property \"timeout\" is missing")
			return
		}
		t := 300
		in.Timeout = &t
	}
	sb := s.lookup(id)
	if sb == nil {
		notFound(w, id)
		return
	}
	if sb.stateOf() == statePaused {
		s.doResume(w, r, sb, *in.Timeout)
		return
	}
	sb.mu.Lock()
	if time.Duration(*in.Timeout)*time.Second > s.cfg.MaxLifetime {
		sb.mu.Unlock()
		apiError(w, http.StatusBadRequest, fmt.Sprintf("Timeout cannot be greater than %d hours", s.maxHours()))
		return
	}
	end := time.Now().Add(time.Duration(*in.Timeout) * time.Second)
	if limit := sb.startedAt.Add(s.cfg.MaxLifetime); end.After(limit) {
		end = limit
	}
	if end.After(sb.endAt) {
		sb.endAt = end
		sb.arm()
	}
	sb.mu.Unlock()
	writeJSON(w, http.StatusOK, sb.created(s))
}

// list answers v2 (filters, paging) and v1 (running, metadata filter).
func (s *Server) list(w http.ResponseWriter, r *http.Request, v2 bool) {
	q := r.URL.Query()
	states := []string{stateRunning, statePaused}
	if !v2 {
		states = []string{stateRunning}
	}
	if v := q.Get("state"); v != "" {
		states = strings.Split(v, ",")
		for _, st := range states {
			if st != stateRunning && st != statePaused {
				apiError(w, http.StatusBadRequest, fmt.Sprintf("invalid state %q", st))
				return
			}
		}
	}
	var meta map[string]string
	if q.Has("metadata") {
		var err error
		if meta, err = parseMetadataFilter(q.Get("metadata")); err != nil {
			apiError(w, http.StatusBadRequest, "Error parsing metadata: error parsing metadata: "+err.Error())
			return
		}
	}
	limit := 100
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			apiError(w, http.StatusBadRequest, "limit must be between 1 and 100")
			return
		}
		limit = n
	}
	var after time.Time
	if v := q.Get("startedAfter"); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			apiError(w, http.StatusBadRequest, "invalid startedAfter: "+err.Error())
			return
		}
		after = t
	}
	tmpl := q.Get("template")
	s.mu.Lock()
	all := make([]*fakeSandbox, 0, len(s.sandboxes))
	for _, sb := range s.sandboxes {
		all = append(all, sb)
	}
	s.mu.Unlock()
	var items []map[string]any
	totalRunning := 0
	for _, sb := range all {
		d := sb.detail(s, false)
		state := d["state"].(string)
		if state == stateRunning {
			totalRunning++
		}
		if !slices.Contains(states, state) {
			continue
		}
		if tmpl != "" && sb.templateID != tmpl && sb.alias != tmpl {
			continue
		}
		if !after.IsZero() && sb.startedAt.Before(after) {
			continue
		}
		if meta == nil || matchesMetadata(sb.metadata, meta) {
			items = append(items, d)
		}
	}
	asc := q.Get("order") == "asc"
	slices.SortFunc(items, func(a, b map[string]any) int {
		c := strings.Compare(a["startedAt"].(string), b["startedAt"].(string))
		if c == 0 {
			c = strings.Compare(a["sandboxID"].(string), b["sandboxID"].(string))
		}
		if !asc {
			c = -c
		}
		return c
	})
	if !v2 {
		writeJSON(w, http.StatusOK, orEmptyList(items))
		return
	}
	offset := 0
	if tok := q.Get("nextToken"); tok != "" {
		b, err := base64.RawURLEncoding.DecodeString(tok)
		n, err2 := strconv.Atoi(string(b))
		if err != nil || err2 != nil || n < 0 {
			apiError(w, http.StatusBadRequest, "invalid nextToken")
			return
		}
		offset = n
	}
	page := items[min(offset, len(items)):]
	if len(page) > limit {
		page = page[:limit]
		w.Header().Set("X-Next-Token", base64.RawURLEncoding.EncodeToString([]byte(strconv.Itoa(offset+limit))))
	}
	if slices.Contains(states, stateRunning) {
		w.Header().Set("X-Total-Running", strconv.Itoa(totalRunning))
	}
	writeJSON(w, http.StatusOK, orEmptyList(page))
}

// parseMetadataFilter reads the metadata parameter of a list as E2B's API does: the
// parameter's value (already unescaped once as a query parameter) is unescaped again,
// split into key=value pairs at each & and =, exactly two parts each, and each key and
// value unescaped once more. The official SDKs escape to match: each key and value, then
// the pairs as a query, then that query as the parameter's value.
func parseMetadataFilter(v string) (map[string]string, error) {
	v, err := url.QueryUnescape(v)
	if err != nil {
		return nil, fmt.Errorf("error when unescaping query: %w", err)
	}
	filter := map[string]string{}
	for pair := range strings.SplitSeq(v, "&") {
		parts := strings.Split(pair, "=")
		if len(parts) != 2 {
			return nil, fmt.Errorf("invalid key value pair in query")
		}
		key, err := url.QueryUnescape(parts[0])
		if err != nil {
			return nil, fmt.Errorf("error when unescaping key: %w", err)
		}
		value, err := url.QueryUnescape(parts[1])
		if err != nil {
			return nil, fmt.Errorf("error when unescaping value: %w", err)
		}
		filter[key] = value
	}
	return filter, nil
}

// matchesMetadata: a sandbox matches a filter when it has every key with the value (a
// key it lacks matches no value, not even the empty one).
func matchesMetadata(md, filter map[string]string) bool {
	for k, v := range filter {
		if got, ok := md[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func orEmptyList(l []map[string]any) []map[string]any {
	if l == nil {
		return []map[string]any{}
	}
	return l
}

// metric is one SandboxMetric sample.
func (sb *fakeSandbox) metric() map[string]any {
	return map[string]any{
		"timestampUnix": time.Now().Unix(),
		"timestamp":     time.Now().UTC().Format(time.RFC3339),
		"cpuCount":      sb.cpu,
		"cpuUsedPct":    0.0,
		"memUsed":       64 << 20,
		"memTotal":      int64(sb.mem) << 20,
		"memCache":      0,
		"diskUsed":      16 << 20,
		"diskTotal":     1 << 30,
	}
}

func (s *Server) metrics(w http.ResponseWriter, _ *http.Request, id string) {
	sb := s.lookup(id)
	if sb == nil {
		notFound(w, id)
		return
	}
	if sb.stateOf() != stateRunning {
		writeJSON(w, http.StatusOK, []any{})
		return
	}
	writeJSON(w, http.StatusOK, []any{sb.metric()})
}

func (s *Server) metricsMany(w http.ResponseWriter, r *http.Request) {
	ids := strings.Split(r.URL.Query().Get("sandbox_ids"), ",")
	if len(ids) > 100 {
		apiError(w, http.StatusBadRequest, "too many sandbox IDs (at most 100)")
		return
	}
	out := map[string]any{}
	for _, id := range ids {
		if sb := s.lookup(id); sb != nil && sb.stateOf() == stateRunning {
			out[id] = sb.metric()
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"sandboxes": out})
}

func (s *Server) templates(w http.ResponseWriter) {
	var out []map[string]any
	now := time.Now().UTC().Format(time.RFC3339)
	for _, t := range s.cfg.Templates {
		out = append(out, map[string]any{
			"templateID": t.ID, "buildID": "build-" + t.ID, "cpuCount": t.CPUCount, "memoryMB": t.MemoryMB,
			"diskSizeMB": 1024, "public": false, "aliases": orEmptySlice(t.Aliases), "names": orEmptySlice(t.Aliases),
			"createdAt": now, "updatedAt": now, "createdBy": nil, "lastSpawnedAt": nil, "spawnCount": 0,
			"buildCount": 1, "envdVersion": s.cfg.EnvdVersion, "buildStatus": "ready",
		})
	}
	writeJSON(w, http.StatusOK, orEmptyList(out))
}

func orEmptySlice(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
