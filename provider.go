package toolhost

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/sandbox/e2b"
)

// ProviderFactory makes the sandbox provider that sandbox.provider names, from the whole
// configuration (a provider reads its own keys and the sandbox.* limits it can enforce).
// When the provider has a Close(context.Context) error method, Toolhost.Close calls it. A
// provider that cannot mount host directories must refuse CreateOptions.Workspace (an
// error wrapping sandbox.ErrUnsupported), never ignore it.
type ProviderFactory func(ctx context.Context, cfg *Config, log *slog.Logger) (sandbox.Provider, error)

// providerEnv is what the built-in providers are made with: the configuration, the
// logger, and the store (the E2B quota ledger lives in it when it is shared).
type providerEnv struct {
	cfg     *Config
	log     *slog.Logger
	storage *Storage
}

type providerFactory func(ctx context.Context, env providerEnv) (sandbox.Provider, error)

// registry maps provider names to their factories.
type registry struct {
	mu sync.RWMutex
	m  map[string]providerFactory
}

var providers = &registry{m: map[string]providerFactory{"local": newLocalProvider, "e2b": newE2BProvider}}

// RegisterProvider makes a sandbox provider available under name (the value of
// sandbox.provider, alone or in a list). Providers register from an init function; a
// name registered twice panics, as the second would silently replace the first, and so
// does a name with a comma.
func RegisterProvider(name string, f ProviderFactory) {
	providers.mu.Lock()
	defer providers.mu.Unlock()
	if _, dup := providers.m[name]; dup || name == "" || f == nil || ProviderNamesOf(name)[0] != name {
		panic(fmt.Sprintf("toolhost: RegisterProvider(%q): empty, nil, a list or already registered", name))
	}
	providers.m[name] = func(ctx context.Context, env providerEnv) (sandbox.Provider, error) {
		return f(ctx, env.cfg, env.log)
	}
}

func (r *registry) lookup(name string) (providerFactory, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	f, ok := r.m[name]
	return f, ok
}

func (r *registry) names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []string
	for n := range r.m {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// ProviderNames lists the registered sandbox providers.
func ProviderNames() []string { return providers.names() }

// projectScoped is a provider that can count its sandboxes under a project (e2b's quota
// ledger): each session gets its own view.
type projectScoped interface {
	ForProject(project string) sandbox.Provider
}

// lifetimeCapped is a provider whose sandboxes cannot live past a bound (an E2B plan's);
// sessions keep their ttl and max_lifetime within it.
type lifetimeCapped interface {
	MaxLifetime() time.Duration
}

// e2bProvider is the e2b provider with what the root package asks of it (its ForProject
// and Close are e2b.Provider's).
type e2bProvider struct{ *e2b.Provider }

// MaxLifetime is the plan's bound on a sandbox's life.
func (p e2bProvider) MaxLifetime() time.Duration { return p.Plan().MaxLifetime }

// unavailable stands for a provider of a list that could not be made (bubblewrap missing
// for local): it gives way to the next one, saying why.
type unavailable struct{ err error }

func (u unavailable) Create(context.Context, sandbox.CreateOptions) (sandbox.Sandbox, error) {
	return nil, fmt.Errorf("%w: %w", sandbox.ErrUnavailable, u.err)
}

// buildProviders makes every provider sandbox.provider names, in order. In a list, one
// that cannot be made is logged and stands aside (a chain gives way past it); alone, its
// error is returned.
func buildProviders(ctx context.Context, env providerEnv) ([]sandbox.Named, error) {
	names := ProviderNamesOf(env.cfg.Sandbox.Provider)
	var out []sandbox.Named
	for _, name := range names {
		f, ok := providers.lookup(name)
		if !ok { // Validate checked; a registry cannot shrink
			return nil, fmt.Errorf("sandbox provider %q is not registered", name)
		}
		p, err := f(ctx, env)
		if err != nil {
			if len(names) == 1 {
				return nil, err
			}
			env.log.Warn("sandbox provider not available; the others of sandbox.provider will serve", "provider", name, "err", err)
			p = unavailable{err}
		}
		out = append(out, sandbox.Named{Name: name, Provider: p})
	}
	return out, nil
}

// chainOf is the provider of members: the one alone, or a chain trying them in order.
func chainOf(cfg *Config, log *slog.Logger, members []sandbox.Named) sandbox.Provider {
	if len(members) == 1 {
		return members[0].Provider
	}
	c := sandbox.NewChain(log, members...)
	c.ContinueOnError = cfg.E2B.ContinueOnError
	return c
}

// newE2BProvider is the E2B provider of the e2b.* keys. Empty keys take the variables
// E2B's SDKs read (E2B_API_KEY...). Its quota ledger is the store's when the store is S3
// (hosts that share a bucket add up their figures), else data_dir/quota.
func newE2BProvider(_ context.Context, env providerEnv) (sandbox.Provider, error) {
	cfg := env.cfg
	ledger, err := e2bLedger(cfg, env.storage)
	if err != nil {
		return nil, fmt.Errorf("e2b sandbox provider: %w", err)
	}
	p, err := e2b.New(e2bProviderConfig(cfg, ledger, env.log))
	if err != nil {
		return nil, fmt.Errorf("e2b sandbox provider: %w", err)
	}
	return e2bProvider{p}, nil
}

// e2bProviderConfig is the e2b.Config of the e2b.* keys.
func e2bProviderConfig(cfg *Config, ledger *e2b.Ledger, log *slog.Logger) e2b.Config {
	e := cfg.E2B
	var templates []e2b.Template
	if len(e.Templates) > 0 {
		templates = slices.Clone(e2b.DefaultTemplates)
		for _, t := range e.Templates {
			templates = append(templates, e2b.Template{TemplateID: t.ID, CPUCount: t.CPUCount, MemoryMB: t.MemoryMB})
		}
	}
	return e2b.Config{
		APIKey:          string(e.APIKey),
		Domain:          e.Domain,
		APIURL:          e.APIURL,
		SandboxURL:      e.SandboxURL,
		Template:        e.Template,
		Templates:       templates,
		CPUs:            e.CPUCount,
		MemoryMB:        e.MemoryMB,
		PrivatePreviews: e.PrivatePreviews,
		Metadata:        e.Metadata,
		Plan:            cfg.e2bPlan(),
		RequestTimeout:  e.RequestTimeout,
		ConnectTimeout:  e.ConnectTimeout,
		Quota:           ledger,
		Logger:          log,
	}
}

// E2BRunning asks E2B how many sandboxes of the API key's team run now, on every host
// and for every project: E2B's live figure, next to what toolhost counted (E2BUsage).
func E2BRunning(ctx context.Context, cfg Config) (int, error) {
	if err := cfg.Validate(); err != nil {
		return 0, err
	}
	p, err := e2b.New(e2bProviderConfig(&cfg, nil, slog.New(slog.DiscardHandler)))
	if err != nil {
		return 0, fmt.Errorf("e2b sandbox provider: %w", err)
	}
	defer p.Close(ctx)
	return p.Running(ctx)
}

// e2bLedger is where E2B usage is counted: in the store when it is S3 (several hosts may
// share it, and their figures add up), else in data_dir/quota.
func e2bLedger(cfg *Config, st *Storage) (*e2b.Ledger, error) {
	if cfg.Store.Kind == "s3" {
		if st == nil {
			return nil, errors.New("no store for the quota ledger")
		}
		return e2b.NewLedger(st.store, e2b.DefaultQuotaPrefix), nil
	}
	return e2b.OpenLedger(cfg.DataDir)
}

// E2BUsage is what toolhost counted of E2B in the month of now (the quota ledger: in the
// store when it is S3, else in data_dir/quota), with the warnings of the configured plan
// (e2b.plan, e2b.max_lifetime, e2b.monthly_cpu_minutes): what `toolhost quota` shows.
func (s *Storage) E2BUsage(ctx context.Context, now time.Time) (e2b.Usage, error) {
	plan := s.cfg.e2bPlan()
	if s.cfg.Store.Kind == "s3" {
		return e2b.ReadUsage(ctx, s.store, e2b.DefaultQuotaPrefix, plan, now)
	}
	return e2b.QuotaReport(ctx, s.cfg.DataDir, plan, now)
}
