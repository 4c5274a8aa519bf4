package e2b

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/module"
)

// The e2b provider as a module of toolhost's configuration: its keys (e2b.*), their
// validation, the provider they make, and its doctor line.
func init() {
	module.RegisterProvider(module.Provider[Section]{
		Name:     "e2b",
		Prefix:   "e2b.",
		Sections: []module.Section{{Name: "e2b", Doc: sectionDoc}},
		Keys:     keys,
		Config:   DefaultSection,
		Validate: func(cfg *Section, s module.Settings) error { return cfg.Validate(s) },
		New: func(ctx context.Context, cfg *Section, env module.Env) (sandbox.Provider, error) {
			return NewFromSection(cfg, env)
		},
		Doctor: func(ctx context.Context, cfg *Section, env module.Env, alone bool) []module.Check {
			return []module.Check{doctor(ctx, cfg, alone)}
		},
	})
}

// Section is the e2b.* keys. Empty strings take the variables E2B's official SDKs read
// (E2B_API_KEY, E2B_DOMAIN, E2B_API_URL, E2B_SANDBOX_URL), then E2B's defaults.
type Section struct {
	APIKey            module.Secret     `key:"api_key"`
	Domain            string            `key:"domain"`
	APIURL            string            `key:"api_url"`
	SandboxURL        string            `key:"sandbox_url"`
	Template          string            `key:"template"`
	Templates         []SectionTemplate `key:"templates"`
	CPUCount          int               `key:"cpu_count"`
	MemoryMB          int               `key:"memory_mb"`
	Plan              string            `key:"plan"`
	MaxLifetime       time.Duration     `key:"max_lifetime"`
	MonthlyCPUMinutes float64           `key:"monthly_cpu_minutes"`
	PrivatePreviews   bool              `key:"private_previews"`
	Metadata          map[string]string `key:"metadata"`
	RequestTimeout    time.Duration     `key:"request_timeout"`
	ConnectTimeout    time.Duration     `key:"connect_timeout"`
}

// SectionTemplate is an E2B template and its size (an entry of e2b.templates).
type SectionTemplate struct {
	ID       string `key:"id"`
	CPUCount int    `key:"cpu_count"`
	MemoryMB int    `key:"memory_mb"`
}

// DefaultSection is the e2b.* keys' defaults.
func DefaultSection() *Section {
	return &Section{
		Templates:      []SectionTemplate{},
		Plan:           "hobby",
		Metadata:       map[string]string{},
		RequestTimeout: 60 * time.Second,
		ConnectTimeout: 10 * time.Second,
	}
}

const sectionDoc = `The E2B provider (sandbox.provider: e2b, or e2b in a list): sandboxes on E2B's fleet,
or on a self-hosted E2B cluster (set domain, and api_url when it is elsewhere). Its
sandboxes are ephemeral: the work lives in the snapshots, restored into a new sandbox
at each rotation. Every sandbox it creates is counted for toolhost quota, in data_dir
(or in the store when it is S3, which several hosts may share). More: docs/E2B.md.`

var keys = []module.Key{
	{Name: "e2b.api_key", Secret: true, Default: `"" ($E2B_API_KEY)`,
		Doc: `The E2B API key (e2b_...). Empty: the variable E2B_API_KEY, as E2B's own SDKs read it.
Without a key the e2b provider is unavailable ("E2B API key not configured") and a list
such as e2b,local goes on to the next provider. A secret: no flag, and never printed.`},
	{Name: "e2b.domain", Flag: "e2b-domain", Default: `"" ($E2B_DOMAIN, else e2b.app)`,
		Usage: "E2B's domain (default $E2B_DOMAIN, else e2b.app; a self-hosted cluster's own)",
		Doc: `E2B's domain: sandboxes are reached at {port}-{id}.{domain}. e2b.app is the managed
service; a self-hosted E2B cluster has its own.`},
	{Name: "e2b.api_url", Flag: "e2b-api-url", Default: `"" ($E2B_API_URL, else https://api.DOMAIN)`,
		Usage: "E2B's API (default $E2B_API_URL, else https://api.DOMAIN)",
		Doc:   `The control plane's URL, when it is not https://api.{domain}.`},
	{Name: "e2b.sandbox_url", Flag: "e2b-sandbox-url", Default: `"" ($E2B_SANDBOX_URL, else each sandbox's own host)`,
		Usage: "one URL for all sandbox traffic (default $E2B_SANDBOX_URL)",
		Doc: `One URL for all traffic to sandboxes, routed by E2B's E2b-Sandbox-Id and
E2b-Sandbox-Port headers (a proxy of a self-hosted cluster); empty: each sandbox's own
host, https://{port}-{id}.{domain}.`},
	{Name: "e2b.template", Flag: "e2b-template", Default: `"" (base, or the smallest known that fits cpu_count and memory_mb)`,
		Usage: "E2B template (ID or alias) sandboxes start from (default base)",
		Doc: `The template sandboxes start from, an ID or alias: base, or a team's own with its tools
preinstalled. It needs coreutils, GNU tar and gzip (base has them).`},
	{Name: "e2b.templates", FileOnly: true, Example: "A team's own template, for example:\n- id: my-team-dev\n  cpu_count: 4\n  memory_mb: 4096",
		Doc: `Templates and their sizes, beyond what E2B's API lists (public templates such as base,
2 CPUs and 512 MB, are known already). cpu_count and memory_mb below pick from them.
No environment variable or flag; set it here.`},
	{Name: "e2b.cpu_count", Flag: "e2b-cpu-count",
		Usage: "CPUs per E2B sandbox (0: the template's)",
		Doc: `CPUs and memory per E2B sandbox. On E2B they belong to templates: a size picks the
smallest known template that provides it, or fails naming the ones there are. 0: the
template's.`},
	{Name: "e2b.memory_mb", Flag: "e2b-memory-mb",
		Usage: "memory per E2B sandbox, MB (0: the template's)",
		Doc:   `See cpu_count.`},
	{Name: "e2b.plan", Flag: "e2b-plan",
		Usage: "E2B plan: hobby or pro (lifetime, concurrency and rate limits)",
		Doc: `hobby (sandboxes live at most 1h; 20 at once; 1 creation a second) or pro (24h; 100; 5).
Sessions on E2B keep ttl and max_lifetime within the plan's lifetime; toolhost quota and
the log warn at 80% of a limit.`},
	{Name: "e2b.max_lifetime", Flag: "e2b-max-lifetime", Default: "0 (the plan's)",
		Usage: "longest life of one E2B sandbox (0: the plan's)",
		Doc:   `The longest one E2B sandbox may live, when the team's plan differs from the named one.`},
	{Name: "e2b.monthly_cpu_minutes", Flag: "e2b-monthly-cpu-minutes",
		Usage: "E2B compute the team means to spend a month, CPU minutes (0: not watched)",
		Doc: `The compute the team means to spend in a calendar month, in CPU minutes (sandbox
lifetime times CPUs), e.g. what its credits cover; toolhost quota and the log warn at
80%. 0: not watched.`},
	{Name: "e2b.private_previews", Flag: "e2b-private-previews",
		Usage: "E2B sandbox ports reachable only with their traffic token",
		Doc: `Make a sandbox's ports (other than E2B's own agent's) reachable only with the
sandbox's traffic token; previews and screenshots go through a proxy on this host
that adds it.`},
	{Name: "e2b.metadata", FileOnly: true, Example: "For example:\nmetadata:\n  team: web",
		Doc: `Labels added to every E2B sandbox, shown in E2B's dashboard and list; toolhost adds
toolhost: "1", host and project. No environment variable or flag; set it here.`},
	{Name: "e2b.request_timeout", Flag: "e2b-request-timeout",
		Usage: "bound of each E2B API request, waits after a 429 included",
		Doc:   `The bound of each request to E2B's API, the waits a 429 asks for included.`},
	{Name: "e2b.connect_timeout", Flag: "e2b-connect-timeout",
		Usage: "bound of reaching E2B; past it the provider is unavailable",
		Doc: `The bound of reaching E2B, and of the wait for a create's answer to begin; past it
the provider is unavailable and a list goes on (a hung API gives way within it).`},
}

// PlanOf is the plan e2b.plan names, with e2b.max_lifetime and e2b.monthly_cpu_minutes.
func (s *Section) PlanOf() Plan {
	plan, _ := PlanNamed(s.Plan)
	if s.MaxLifetime > 0 {
		plan.MaxLifetime = s.MaxLifetime
	}
	plan.MonthlyCPUMinutes = s.MonthlyCPUMinutes
	return plan
}

// Validate checks the e2b.* keys (and, against the plan's lifetime, the session's
// keepalive margin).
func (s *Section) Validate(set module.Settings) error {
	bad := func(key, format string, args ...any) error {
		return fmt.Errorf("config: %s: %s", key, fmt.Sprintf(format, args...))
	}
	if _, ok := PlanNamed(s.Plan); !ok {
		return bad("e2b.plan", "must be \"hobby\" or \"pro\" (set e2b.max_lifetime and e2b.monthly_cpu_minutes for what a plan of your own allows), got %q", s.Plan)
	}
	if strings.ContainsAny(s.Domain, "/: ") {
		return bad("e2b.domain", "must be a domain name such as e2b.app (no scheme, port or path), got %q", s.Domain)
	}
	for _, u := range []struct{ key, v string }{{"e2b.api_url", s.APIURL}, {"e2b.sandbox_url", s.SandboxURL}} {
		if u.v == "" {
			continue
		}
		if pu, err := url.Parse(u.v); err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" || pu.User != nil {
			return bad(u.key, "must be an http or https URL such as https://api.e2b.app, got %q", u.v)
		}
	}
	if s.CPUCount < 0 || s.MemoryMB < 0 {
		return bad("e2b.cpu_count", "e2b.cpu_count and e2b.memory_mb must be 0 (the template's) or positive, got %d and %d", s.CPUCount, s.MemoryMB)
	}
	for i, t := range s.Templates {
		if strings.TrimSpace(t.ID) == "" || t.CPUCount < 1 || t.MemoryMB < 1 {
			return bad(fmt.Sprintf("e2b.templates[%d]", i), "needs an id, a cpu_count and a memory_mb (positive), got %+v", t)
		}
	}
	if s.MaxLifetime < 0 {
		return bad("e2b.max_lifetime", "must be positive, or 0 for the plan's, got %s", s.MaxLifetime)
	}
	if s.MonthlyCPUMinutes < 0 {
		return bad("e2b.monthly_cpu_minutes", "must be positive, or 0 for no limit, got %g", s.MonthlyCPUMinutes)
	}
	for _, k := range slices.Sorted(maps.Keys(s.Metadata)) {
		if strings.TrimSpace(k) == "" {
			return bad("e2b.metadata", "has an empty name")
		}
	}
	if s.RequestTimeout <= 0 {
		return bad("e2b.request_timeout", "must be positive, got %s", s.RequestTimeout)
	}
	if s.ConnectTimeout <= 0 {
		return bad("e2b.connect_timeout", "must be positive, got %s", s.ConnectTimeout)
	}
	// A session on E2B lives within the plan's maximum lifetime (sessions cut their ttl
	// and max_lifetime to it): the keepalive margin must leave it room to extend and rotate.
	if max := s.PlanOf().MaxLifetime; slices.Contains(set.Providers, "e2b") && set.KeepaliveMargin >= max {
		return bad("session.keepalive_margin", "must be less than the E2B plan's maximum sandbox lifetime (%s, e2b.plan and e2b.max_lifetime), got %s", max, set.KeepaliveMargin)
	}
	return nil
}

// ProviderConfig is the provider's Config of the e2b.* keys, counting in ledger (nil: not
// counted).
func (s *Section) ProviderConfig(ledger *Ledger, log *slog.Logger) Config {
	var templates []Template
	if len(s.Templates) > 0 {
		templates = slices.Clone(DefaultTemplates)
		for _, t := range s.Templates {
			templates = append(templates, Template{TemplateID: t.ID, CPUCount: t.CPUCount, MemoryMB: t.MemoryMB})
		}
	}
	return Config{
		APIKey:          string(s.APIKey),
		Domain:          s.Domain,
		APIURL:          s.APIURL,
		SandboxURL:      s.SandboxURL,
		Template:        s.Template,
		Templates:       templates,
		CPUs:            s.CPUCount,
		MemoryMB:        s.MemoryMB,
		PrivatePreviews: s.PrivatePreviews,
		Metadata:        s.Metadata,
		Plan:            s.PlanOf(),
		RequestTimeout:  s.RequestTimeout,
		ConnectTimeout:  s.ConnectTimeout,
		Quota:           ledger,
		Logger:          log,
	}
}

// LedgerOf is where E2B usage is counted: in the store when it is shared by several hosts
// (their figures add up), else in the data dir.
func LedgerOf(env module.Env) (*Ledger, error) {
	if env.StoreShared && env.Store != nil {
		return NewLedger(env.Store, DefaultQuotaPrefix), nil
	}
	return OpenLedger(env.DataDir)
}

// NewFromSection is the provider of the e2b.* keys.
func NewFromSection(s *Section, env module.Env) (*Provider, error) {
	ledger, err := LedgerOf(env)
	if err != nil {
		return nil, fmt.Errorf("e2b sandbox provider: %w", err)
	}
	p, err := New(s.ProviderConfig(ledger, env.Logger))
	if err != nil {
		return nil, fmt.Errorf("e2b sandbox provider: %w", err)
	}
	return p, nil
}

// UsageOf is what toolhost counted of E2B in the month of now, with the warnings of the
// configured plan: what `toolhost quota` shows.
func UsageOf(ctx context.Context, s *Section, env module.Env, now time.Time) (Usage, error) {
	plan := s.PlanOf()
	if env.StoreShared && env.Store != nil {
		return ReadUsage(ctx, env.Store, DefaultQuotaPrefix, plan, now)
	}
	return QuotaReport(ctx, env.DataDir, plan, now)
}

// RunningOf asks E2B how many sandboxes of the API key's team run now, on every host and
// for every project: E2B's live figure, next to what toolhost counted (UsageOf).
func RunningOf(ctx context.Context, s *Section) (int, error) {
	p, err := New(s.ProviderConfig(nil, slog.New(slog.DiscardHandler)))
	if err != nil {
		return 0, fmt.Errorf("e2b sandbox provider: %w", err)
	}
	defer p.Close(ctx)
	return p.Running(ctx)
}

// doctor asks E2B for the team's running sandboxes: an authenticated call that creates
// nothing.
func doctor(ctx context.Context, s *Section, alone bool) module.Check {
	c := module.Check{Name: "e2b", Needed: alone}
	if s.APIKey == "" && os.Getenv("E2B_API_KEY") == "" {
		c.Detail = "no API key: set E2B_API_KEY (or TOOLHOST_E2B_API_KEY); get one at https://e2b.dev/dashboard"
		return c
	}
	cctx, cancel := context.WithTimeout(ctx, s.RequestTimeout)
	defer cancel()
	n, err := RunningOf(cctx, s)
	if err != nil {
		c.Detail = fmt.Sprintf("asking E2B with the API key: %v", err)
		return c
	}
	c.OK, c.Detail = true, fmt.Sprintf("the API key is accepted; %d of the team's sandboxes run now", n)
	return c
}
