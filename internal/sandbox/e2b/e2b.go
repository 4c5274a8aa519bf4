// Package e2b is the sandbox provider for E2B's cloud sandboxes (Firecracker microVMs on
// E2B's fleet, or on a self-hosted E2B cluster). It speaks E2B's two protocols directly,
// without the official SDK:
//
//   - the control plane, E2B's REST API (X-API-Key): create (POST /v2/sandboxes), get
//     (for endAt), set timeout, kill, templates, and for a sandbox another process created
//     connect, list by metadata and kill by ID (reconnect.go); a 429 is retried after its
//     Retry-After within the request's deadline;
//   - the data plane, the envd daemon in each sandbox, through the same client.Client the
//     local provider uses, addressed at https://49983-{id}.{domain} (or at one sandbox
//     URL with the E2b-Sandbox-Id and E2b-Sandbox-Port headers) with X-Access-Token.
//
// E2B's envd is not our agent: it kills only the process it started, has no background
// logs, no archive endpoints and no port list. So a command runs under coreutils'
// timeout(1), which kills its whole process group at the timeout; a background command
// appends its output to a log under /tmp/toolhost; the workspace is packed and unpacked
// by GNU tar inside the sandbox, with what goes in judged on the host first
// (archive.Filter), so a hostile archive is refused as the local provider refuses it;
// ports are read from /proc/net/tcp; previews are served on the host's loopback by a
// proxy to the sandbox's public https://{port}-{id}.{domain} host, which adds the
// sandbox's traffic token. The templates used need coreutils, GNU tar and gzip (E2B's
// base template has them).
//
// E2B sandboxes are ephemeral: a sandbox that stops loses its files, and pause/resume
// has lost files (E2B issue #884). This provider never pauses: durability is the
// snapshots'. Every sandbox says so to what runs in it (TOOLHOST_WORKSPACE_DURABILITY).
package e2b

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/envd"
	"github.com/toolhost/toolhost/internal/envd/client"
)

// ErrNoAPIKey: no API key was configured (Config.APIKey, or E2B_API_KEY in the
// environment). It wraps sandbox.ErrUnavailable: a chain gives way to the next provider.
var ErrNoAPIKey error = noKeyError{}

type noKeyError struct{}

func (noKeyError) Error() string { return "E2B API key not configured" }
func (noKeyError) Unwrap() error { return sandbox.ErrUnavailable }

// Defaults.
const (
	DefaultDomain         = "e2b.app"
	DefaultTemplate       = "base"
	DefaultRequestTimeout = 60 * time.Second // as the official SDKs
	DefaultConnectTimeout = 10 * time.Second
	// DefaultTimeout is a sandbox's lifetime when CreateOptions.Timeout is zero (E2B's
	// own default).
	DefaultTimeout = 300 * time.Second
	// EnvdPort is envd's port in every sandbox.
	EnvdPort = 49983
	// minEnvdVersion is the oldest envd this provider talks to: streamed uploads
	// (application/octet-stream on POST /files) came with 0.5.7.
	minEnvdVersion = "0.5.7"
)

// Plan is what an E2B plan allows (docs: sandbox/rate-limits). The provider refuses a
// lifetime past MaxLifetime, and warns (log and quota report) when usage reaches WarnAt of
// a limit; zero limits are not watched.
type Plan struct {
	Name string
	// MaxLifetime bounds a sandbox's life from its start (Hobby 1h, Pro 24h).
	MaxLifetime time.Duration
	// MonthlyCPUMinutes is the compute the team means to spend in a calendar month
	// (sandbox lifetime x CPU count), e.g. what its credits cover.
	MonthlyCPUMinutes float64
	// ConcurrentSandboxes (Hobby 20, Pro 100) and CreationsPerSecond (Hobby 1, Pro 5).
	ConcurrentSandboxes int
	CreationsPerSecond  float64
	// WarnAt is the fraction of a limit at which to warn; default 0.8.
	WarnAt float64
}

// The plans E2B documents.
var (
	PlanHobby = Plan{Name: "hobby", MaxLifetime: time.Hour, ConcurrentSandboxes: 20, CreationsPerSecond: 1}
	PlanPro   = Plan{Name: "pro", MaxLifetime: 24 * time.Hour, ConcurrentSandboxes: 100, CreationsPerSecond: 5}
)

// PlanNamed returns a documented plan by name ("hobby", "pro").
func PlanNamed(name string) (Plan, bool) {
	switch strings.ToLower(name) {
	case "hobby":
		return PlanHobby, true
	case "pro":
		return PlanPro, true
	}
	return Plan{}, false
}

// Config configures the provider. Empty fields take the environment variables the
// official SDKs read (E2B_API_KEY, E2B_DOMAIN, E2B_API_URL, E2B_SANDBOX_URL), then the
// defaults.
type Config struct {
	// APIKey authenticates to the control plane (e2b_...). Without one Create fails with
	// ErrNoAPIKey.
	APIKey string
	// Domain is E2B's domain: e2b.app for the managed service, a self-hosted cluster's
	// own otherwise. Sandboxes are reached at {port}-{id}.{Domain}.
	Domain string
	// APIURL is the control plane's address; default https://api.{Domain}.
	APIURL string
	// SandboxURL, when set, is where all data-plane traffic goes, routed by the
	// E2b-Sandbox-Id and E2b-Sandbox-Port headers (E2B's shared sandbox host, or a proxy
	// of a self-hosted cluster); default: each sandbox's own host.
	SandboxURL string

	// Template is the template sandboxes start from (ID or alias). Default "base", or,
	// when CPUs or MemoryMB are set, the smallest known template that provides them.
	Template string
	// CPUs and MemoryMB are the size asked for. CPU and memory belong to templates on E2B,
	// so a size picks a template from Templates and the team's own (GET /templates), or
	// fails naming what is available.
	CPUs     int
	MemoryMB int
	// Templates lists templates and their sizes beyond what the API lists (public
	// templates such as base are not in the team's list); default DefaultTemplates.
	Templates []Template

	// PrivatePreviews makes every sandbox's ports other than envd's reachable only with
	// its traffic token (allowPublicTraffic: false); the preview proxy adds the token.
	PrivatePreviews bool

	// Metadata is added to every sandbox (E2B labels, visible in its dashboard and list);
	// the provider adds toolhost=1, host and project.
	Metadata map[string]string
	// Host names this host in the metadata; default os.Hostname().
	Host string
	// Project is the project the quota ledger counts sandboxes under when the provider
	// is not bound to one with ForProject.
	Project string

	// Plan bounds lifetimes and sets the quota warnings; default PlanHobby (the safe one).
	Plan Plan
	// DefaultTimeout is a sandbox's lifetime when CreateOptions.Timeout is zero; default
	// DefaultTimeout, at most Plan.MaxLifetime.
	DefaultTimeout time.Duration

	// RequestTimeout bounds each control-plane request, 429 waits included;
	// ConnectTimeout bounds reaching the service and, for a create (and the template
	// listing it may need), the wait for its answer to begin: an unreachable or hung
	// service gives way in a chain within it.
	RequestTimeout time.Duration
	ConnectTimeout time.Duration
	// IdleTimeout is the host's bound on an envd that makes no progress (client.Client's).
	IdleTimeout time.Duration

	// Quota, when set, records every sandbox for the quota report.
	Quota *Ledger
	// Transport carries both planes; default an http.Transport with ConnectTimeout, the
	// environment's proxy and the system's roots. Tests and self-hosted clusters with
	// their own CA set it.
	Transport http.RoundTripper
	Logger    *slog.Logger
}

// DefaultTemplates are the public templates whose size is known without asking.
var DefaultTemplates = []Template{{TemplateID: "base", CPUCount: 2, MemoryMB: 512}}

func (c Config) withDefaults() Config {
	env := func(v *string, name string) {
		if *v == "" {
			*v = os.Getenv(name)
		}
	}
	env(&c.APIKey, "E2B_API_KEY")
	env(&c.Domain, "E2B_DOMAIN")
	env(&c.APIURL, "E2B_API_URL")
	env(&c.SandboxURL, "E2B_SANDBOX_URL")
	if c.Domain == "" {
		c.Domain = DefaultDomain
	}
	if c.APIURL == "" {
		c.APIURL = "https://api." + c.Domain
	}
	c.APIURL = strings.TrimRight(c.APIURL, "/")
	c.SandboxURL = strings.TrimRight(c.SandboxURL, "/")
	if c.Plan.MaxLifetime <= 0 {
		name := c.Plan.Name
		c.Plan.MaxLifetime = PlanHobby.MaxLifetime
		if p, ok := PlanNamed(name); ok {
			c.Plan.MaxLifetime = p.MaxLifetime
		}
	}
	if c.Plan.WarnAt <= 0 || c.Plan.WarnAt > 1 {
		c.Plan.WarnAt = 0.8
	}
	if c.DefaultTimeout <= 0 {
		c.DefaultTimeout = min(DefaultTimeout, c.Plan.MaxLifetime)
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.ConnectTimeout <= 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.Templates == nil {
		c.Templates = DefaultTemplates
	}
	if c.Host == "" {
		c.Host, _ = os.Hostname()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Provider creates E2B sandboxes. It is safe for concurrent use.
type Provider struct {
	cfg     Config
	log     *slog.Logger
	api     *api
	hc      *http.Client // both planes
	tr      http.RoundTripper
	project string

	mu       sync.Mutex
	template *Template       // the template chosen for the configured size, once known
	gapsSaid map[string]bool // egress policies whose gaps on E2B were logged (once each)
}

var (
	_ sandbox.Provider      = (*Provider)(nil)
	_ sandbox.LifetimeBound = (*Provider)(nil)
	_ sandbox.ProjectScoped = (*Provider)(nil)
	_ sandbox.Closer        = (*Provider)(nil)
)

// New builds a provider. It does not contact E2B: a missing key or an unreachable
// service shows at Create, where a chain can give way to the next provider.
func New(cfg Config) (*Provider, error) {
	cfg = cfg.withDefaults()
	if cfg.DefaultTimeout > cfg.Plan.MaxLifetime {
		return nil, fmt.Errorf("e2b provider: default timeout %s exceeds the plan's maximum lifetime %s", cfg.DefaultTimeout, cfg.Plan.MaxLifetime)
	}
	if cfg.CPUs < 0 || cfg.MemoryMB < 0 {
		return nil, fmt.Errorf("e2b provider: negative size (%d CPUs, %d MB)", cfg.CPUs, cfg.MemoryMB)
	}
	tr := cfg.Transport
	if tr == nil {
		d := &net.Dialer{Timeout: cfg.ConnectTimeout, KeepAlive: 30 * time.Second}
		tr = &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           d.DialContext,
			TLSHandshakeTimeout:   cfg.ConnectTimeout,
			TLSClientConfig:       &tls.Config{MinVersion: tls.VersionTLS12},
			ForceAttemptHTTP2:     true,
			MaxIdleConns:          256,
			MaxIdleConnsPerHost:   64,
			IdleConnTimeout:       90 * time.Second,
			ExpectContinueTimeout: time.Second,
			// envd answers gzip only when asked; the client reads raw bytes.
			DisableCompression: true,
		}
	}
	hc := &http.Client{Transport: tr}
	p := &Provider{cfg: cfg, log: cfg.Logger, hc: hc, tr: tr, project: cfg.Project,
		api: &api{base: cfg.APIURL, key: cfg.APIKey, hc: hc, timeout: cfg.RequestTimeout, answer: cfg.ConnectTimeout}}
	return p, nil
}

// Close drops the provider's idle connections. Sandboxes still open keep working; close
// them first to kill them.
func (p *Provider) Close(context.Context) error {
	if ci, ok := p.tr.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
	return nil
}

// ForProject returns a view of p that counts its sandboxes under project in the quota
// ledger (and labels them with it). It shares p's connections and template choice.
func (p *Provider) ForProject(project string) sandbox.Provider {
	return &projectProvider{p: p, project: project}
}

type projectProvider struct {
	p       *Provider
	project string
}

func (pp *projectProvider) Create(ctx context.Context, opts sandbox.CreateOptions) (sandbox.Sandbox, error) {
	sb, err := pp.p.create(ctx, opts, pp.project)
	if err != nil {
		return nil, err
	}
	return sb, nil
}

// Plan is the plan the provider enforces.
func (p *Provider) Plan() Plan { return p.cfg.Plan }

// MaxLifetime is the plan's bound on a sandbox's life (sandbox.LifetimeBound).
func (p *Provider) MaxLifetime() time.Duration { return p.cfg.Plan.MaxLifetime }

// Running asks E2B how many sandboxes of the team run now (all hosts, all projects).
func (p *Provider) Running(ctx context.Context) (int, error) {
	if p.cfg.APIKey == "" {
		return 0, ErrNoAPIKey
	}
	return p.api.running(ctx)
}

// Create starts a sandbox. No API key, an unreachable service or one out of capacity
// give errors wrapping sandbox.ErrUnavailable; a bad template, size, lifetime or key
// give errors that are the caller's to fix.
func (p *Provider) Create(ctx context.Context, opts sandbox.CreateOptions) (sandbox.Sandbox, error) {
	sb, err := p.create(ctx, opts, p.project)
	if err != nil {
		return nil, err
	}
	return sb, nil
}

func (p *Provider) create(ctx context.Context, opts sandbox.CreateOptions, project string) (*Sandbox, error) {
	if p.cfg.APIKey == "" {
		return nil, ErrNoAPIKey
	}
	timeout, err := p.check(opts)
	if err != nil {
		return nil, fmt.Errorf("create E2B sandbox: %w", err)
	}
	tmpl, err := p.chooseTemplate(ctx)
	if err != nil {
		return nil, fmt.Errorf("create E2B sandbox: %w", err)
	}
	meta := maps.Clone(p.cfg.Metadata)
	if meta == nil {
		meta = map[string]string{}
	}
	maps.Copy(meta, opts.Labels) // the provider's own keys below win
	meta["toolhost"] = "1"
	if p.cfg.Host != "" {
		meta["host"] = p.cfg.Host
	}
	if project != "" {
		meta["project"] = project
	}
	env := maps.Clone(opts.Env)
	if env == nil {
		env = map[string]string{}
	}
	env["TOOLHOST_SANDBOX_PROVIDER"] = "e2b"
	env["TOOLHOST_WORKSPACE_DURABILITY"] = durability
	internet := opts.Network == sandbox.NetworkHost
	in := newSandbox{
		TemplateID:          tmpl.TemplateID,
		Timeout:             int(math.Ceil(timeout.Seconds())),
		Metadata:            meta,
		EnvVars:             env,
		AllowInternetAccess: &internet,
	}
	if opts.Network == sandbox.NetworkEgress {
		n, err := compileNetwork(opts.Egress.Policy)
		if err != nil {
			return nil, fmt.Errorf("create E2B sandbox: %w", err)
		}
		p.sayGaps(opts.Egress, n)
		internet = n.internet
		if n.allowOut != nil || n.denyOut != nil {
			in.Network = &networkConfig{AllowOut: n.allowOut, DenyOut: n.denyOut}
		}
	}
	if p.cfg.PrivatePreviews {
		public := false
		if in.Network == nil {
			in.Network = &networkConfig{}
		}
		in.Network.AllowPublicTraffic = &public
	}
	began := time.Now()
	created, err := p.api.create(ctx, in)
	if err != nil {
		return nil, fmt.Errorf("create E2B sandbox: %w", p.explain(err))
	}
	sb, err := p.open(ctx, created, tmpl, project, timeout, began)
	if err != nil {
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.RequestTimeout)
		if kerr := p.api.kill(kctx, created.SandboxID); kerr != nil {
			p.log.Warn("kill an E2B sandbox that could not be set up", "sandbox", created.SandboxID, "err", kerr)
		}
		cancel()
		return nil, fmt.Errorf("create E2B sandbox %s: %w", created.SandboxID, err)
	}
	if p.cfg.Quota != nil {
		p.cfg.Quota.Created(ctx, Record{ID: sb.id, Project: project, Template: tmpl.TemplateID,
			CPUs: sb.cpus, MemoryMB: sb.memoryMB, StartedAt: sb.startedAt, EndAt: sb.EndsAt()}, p.cfg.Plan, p.log)
	}
	p.log.Info("E2B sandbox created", "sandbox", sb.id, "template", tmpl.TemplateID, "cpus", sb.cpus, "memory_mb", sb.memoryMB,
		"ends", sb.EndsAt().UTC().Format(time.RFC3339), "took", time.Since(began))
	return sb, nil
}

// sayGaps logs, once per policy, what E2B cannot enforce of it as the gateway does.
func (p *Provider) sayGaps(eg *sandbox.Egress, n e2bNetwork) {
	gaps := n.gaps
	if len(eg.Trust) > 0 {
		gaps = append(gaps, "sandbox.egress.ca_file is not installed in E2B sandboxes")
	}
	gaps = append(gaps, "sandbox.egress.inject is not applied on E2B (the secret stays on this host), nor are max_bytes, max_conns and idle_timeout; connections are not audited")
	key := strings.Join(gaps, "\n") + fmt.Sprint(n.allowOut, n.denyOut, n.internet)
	p.mu.Lock()
	if p.gapsSaid == nil {
		p.gapsSaid = map[string]bool{}
	}
	said := p.gapsSaid[key]
	p.gapsSaid[key] = true
	p.mu.Unlock()
	if said {
		return
	}
	p.log.Warn("E2B cannot enforce the egress policy as the gateway does", "allow_internet_access", n.internet,
		"allowOut", strings.Join(n.allowOut, ","), "denyOut", strings.Join(n.denyOut, ","), "gaps", strings.Join(gaps, "; "))
}

// durability is what every sandbox tells the processes in it about its files.
const durability = "ephemeral: files live only as long as this E2B sandbox; toolhost keeps the work in snapshots, never in pause/resume"

// explain turns the API's answers into errors written for whoever configured toolhost.
func (p *Provider) explain(err error) error {
	var ae *APIError
	if !errors.As(err, &ae) {
		return err
	}
	switch ae.Status {
	case http.StatusUnauthorized:
		return fmt.Errorf("E2B refused the API key (check E2B_API_KEY or e2b.api_key): %w", err)
	case http.StatusForbidden:
		return fmt.Errorf("E2B refused the team of this API key: %w", err)
	case http.StatusNotFound:
		return fmt.Errorf("the E2B template does not exist or is not the team's (check e2b.template): %w", err)
	}
	return err
}

// check validates options and returns the sandbox's lifetime.
func (p *Provider) check(opts sandbox.CreateOptions) (time.Duration, error) {
	switch opts.Network {
	case "", sandbox.NetworkNone, sandbox.NetworkHost:
	case sandbox.NetworkEgress:
		if opts.Egress == nil {
			return 0, fmt.Errorf("network %q needs its policy (CreateOptions.Egress)", opts.Network)
		}
	default:
		return 0, fmt.Errorf("unknown network mode %q (want %q, %q or %q)", opts.Network, sandbox.NetworkNone, sandbox.NetworkEgress, sandbox.NetworkHost)
	}
	for k := range opts.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return 0, fmt.Errorf("invalid environment variable name %q", k)
		}
	}
	for k, v := range opts.Labels {
		if k == "" || len(k) > 256 || len(v) > 1024 || !utf8.ValidString(k) || !utf8.ValidString(v) {
			return 0, fmt.Errorf("invalid label %q (a name of 1 to 256 bytes and a value of at most 1024, in UTF-8)", k)
		}
	}
	if opts.Workspace != "" {
		// An E2B sandbox is a microVM elsewhere: it cannot mount a directory of this host,
		// and silently giving it an empty workspace instead would lose the caller's files.
		return 0, fmt.Errorf("an E2B sandbox cannot mount the host directory %s as its workspace (sessions restore the project's snapshots into it instead): %w",
			opts.Workspace, sandbox.ErrUnsupported)
	}
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = p.cfg.DefaultTimeout
	}
	if timeout > p.cfg.Plan.MaxLifetime {
		return 0, fmt.Errorf("timeout %s exceeds the E2B plan's maximum sandbox lifetime of %s (set e2b.plan, or a shorter session TTL)", timeout, p.cfg.Plan.MaxLifetime)
	}
	return timeout, nil
}

// chooseTemplate picks the template for the configured size, once.
func (p *Provider) chooseTemplate(ctx context.Context) (Template, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.template != nil {
		return *p.template, nil
	}
	want := p.cfg.Template
	if p.cfg.CPUs == 0 && p.cfg.MemoryMB == 0 {
		if want == "" {
			want = DefaultTemplate
		}
		t := Template{TemplateID: want}
		if k, ok := findTemplate(p.cfg.Templates, want); ok {
			t = k
		}
		p.template = &t
		return t, nil
	}
	known := slices.Clone(p.cfg.Templates)
	listed, err := p.api.templates(ctx)
	if err != nil {
		if errors.Is(err, sandbox.ErrUnavailable) || isUnreachable(err) {
			return Template{}, fmt.Errorf("list the team's templates to find one of %d CPUs and %d MB: %w", p.cfg.CPUs, p.cfg.MemoryMB, err)
		}
		p.log.Warn("could not list the team's E2B templates; choosing among the configured ones", "err", err)
	}
	known = append(known, listed...)
	t, err := pickTemplate(known, want, p.cfg.CPUs, p.cfg.MemoryMB)
	if err != nil {
		return Template{}, err
	}
	p.template = &t
	return t, nil
}

func findTemplate(ts []Template, name string) (Template, bool) {
	for _, t := range ts {
		if t.TemplateID == name || slices.Contains(t.Aliases, name) || slices.Contains(t.Names, name) {
			return t, true
		}
	}
	return Template{}, false
}

// pickTemplate returns the named template when it is big enough, or else (no name) the
// smallest template that provides cpus and memoryMB.
func pickTemplate(known []Template, name string, cpus, memoryMB int) (Template, error) {
	fits := func(t Template) bool { return t.CPUCount >= cpus && t.MemoryMB >= memoryMB }
	if name != "" {
		t, ok := findTemplate(known, name)
		if !ok {
			return Template{}, fmt.Errorf("template %q: its size is not known (list it in e2b.templates with its cpu_count and memory_mb), so it cannot be checked against the %d CPUs and %d MB asked for", name, cpus, memoryMB)
		}
		if !fits(t) {
			return Template{}, fmt.Errorf("template %q has %d CPUs and %d MB, less than the %d CPUs and %d MB asked for; available: %s",
				name, t.CPUCount, t.MemoryMB, cpus, memoryMB, templateList(known))
		}
		return t, nil
	}
	var best *Template
	for i, t := range known {
		if !fits(t) {
			continue
		}
		if best == nil || t.CPUCount < best.CPUCount || (t.CPUCount == best.CPUCount && t.MemoryMB < best.MemoryMB) {
			best = &known[i]
		}
	}
	if best == nil {
		return Template{}, fmt.Errorf("no E2B template provides %d CPUs and %d MB; available: %s (build one with `e2b template build --cpu-count %d --memory-mb %d`, or ask for less)",
			cpus, memoryMB, templateList(known), max(cpus, 1), max(memoryMB, 512))
	}
	return *best, nil
}

func templateList(ts []Template) string {
	if len(ts) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(ts))
	for _, t := range ts {
		parts = append(parts, fmt.Sprintf("%s (%d CPUs, %d MB)", t.TemplateID, t.CPUCount, t.MemoryMB))
	}
	return strings.Join(parts, ", ")
}

// open builds the Sandbox of a created one: its data-plane client and its lifetime (GET).
func (p *Provider) open(ctx context.Context, c sandboxCreated, tmpl Template, project string, timeout time.Duration, began time.Time) (*Sandbox, error) {
	if !versionAtLeast(c.EnvdVersion, minEnvdVersion) {
		return nil, fmt.Errorf("template %s runs envd %q, older than %s, which this provider needs (rebuild the template)", c.TemplateID, c.EnvdVersion, minEnvdVersion)
	}
	domain := p.cfg.Domain
	if c.Domain != nil && *c.Domain != "" {
		domain = *c.Domain
	}
	s := &Sandbox{p: p, id: c.SandboxID, project: project, domain: domain, template: tmpl.TemplateID,
		log: p.log.With("sandbox", c.SandboxID), cpus: tmpl.CPUCount, memoryMB: tmpl.MemoryMB,
		envdVersion: c.EnvdVersion}
	if c.TrafficAccessToken != nil {
		s.trafficToken = *c.TrafficAccessToken
	}
	hdr := http.Header{}
	if c.EnvdAccessToken != "" {
		hdr.Set("X-Access-Token", c.EnvdAccessToken)
	}
	base := "https://" + strconv.Itoa(EnvdPort) + "-" + c.SandboxID + "." + domain
	if p.cfg.SandboxURL != "" {
		base = p.cfg.SandboxURL
		hdr.Set("E2b-Sandbox-Id", c.SandboxID)
		hdr.Set("E2b-Sandbox-Port", strconv.Itoa(EnvdPort))
	}
	cl, err := client.New(client.Config{
		BaseURL: base, Header: hdr, Transport: p.tr, IdleTimeout: p.cfg.IdleTimeout,
		WrapTimeout: wrapTimeout, WrapBackground: wrapBackground, KillSignal: envd.SignalTerm,
	})
	if err != nil {
		return nil, err
	}
	s.client = cl
	detail, err := p.api.get(ctx, c.SandboxID)
	if err != nil {
		// The sandbox exists; its lifetime is the one asked for, from when we asked.
		p.log.Warn("could not read the new sandbox's end time; assuming the one asked for", "sandbox", c.SandboxID, "err", err)
		s.startedAt, s.endsAt = began, began.Add(timeout)
		return s, nil
	}
	s.startedAt, s.endsAt = detail.StartedAt, detail.EndAt
	if detail.CPUCount > 0 {
		s.cpus, s.memoryMB = detail.CPUCount, detail.MemoryMB
	}
	return s, nil
}

// versionAtLeast compares dotted versions numerically ("0.6.13" >= "0.5.7").
func versionAtLeast(v, min string) bool {
	a, b := strings.Split(strings.TrimPrefix(v, "v"), "."), strings.Split(min, ".")
	for i := range max(len(a), len(b)) {
		var x, y int
		if i < len(a) {
			x, _ = strconv.Atoi(a[i])
		}
		if i < len(b) {
			y, _ = strconv.Atoi(b[i])
		}
		if x != y {
			return x > y
		}
	}
	return true
}
