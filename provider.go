package toolhost

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/core/sandbox/local"
)

// ProviderFactory makes the sandbox provider that sandbox.provider names, from the whole
// configuration (a provider reads its own keys and the sandbox.* limits it can enforce).
// When the provider has a Close(context.Context) error method, Toolhost.Close calls it. A
// provider that cannot mount host directories must refuse CreateOptions.Workspace (an
// error wrapping sandbox.ErrUnsupported), never ignore it.
type ProviderFactory func(ctx context.Context, cfg *Config, log *slog.Logger) (sandbox.Provider, error)

// registry maps provider names to their factories.
type registry struct {
	mu sync.RWMutex
	m  map[string]ProviderFactory
}

var providers = &registry{m: map[string]ProviderFactory{"local": newLocalProvider}}

// RegisterProvider makes a sandbox provider available under name (the value of
// sandbox.provider). Providers register from an init function; a name registered twice
// panics, as the second would silently replace the first.
func RegisterProvider(name string, f ProviderFactory) {
	providers.mu.Lock()
	defer providers.mu.Unlock()
	if _, dup := providers.m[name]; dup || name == "" || f == nil {
		panic(fmt.Sprintf("toolhost: RegisterProvider(%q): empty, nil or already registered", name))
	}
	providers.m[name] = f
}

func (r *registry) lookup(name string) (ProviderFactory, bool) {
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

// newLocalProvider is the local (bubblewrap) provider with the sandbox.* limits and the
// session's lifetime.
func newLocalProvider(_ context.Context, cfg *Config, log *slog.Logger) (sandbox.Provider, error) {
	mib := func(v int64) int64 {
		if v < 0 {
			return -1 // no limit
		}
		return v << 20
	}
	sb := cfg.Sandbox
	p, err := local.New(local.Config{
		RunDir:         sb.RunDir,
		WorkspaceDir:   sb.WorkspaceDir,
		DefaultTimeout: cfg.Session.TTL,
		MaxLifetime:    cfg.Session.MaxLifetime,
		Limits: local.Limits{
			MemoryBytes: mib(sb.MemoryMiB), Processes: sb.Processes, CPUs: sb.CPUs,
			TmpBytes: mib(sb.TmpMiB), ShmBytes: mib(sb.ShmMiB), DiskBytes: mib(sb.DiskMiB), OpenFiles: sb.OpenFiles,
		},
		HostUID: sb.HostUID,
		Logger:  log,
	})
	if err != nil {
		return nil, fmt.Errorf("local sandbox provider: %w%s", err, bwrapHint())
	}
	return p, nil
}

// bwrapHint tells people how to get bubblewrap when it is missing.
func bwrapHint() string {
	if _, err := os.Stat(local.BwrapPath); err != nil {
		return " (install bubblewrap: make setup, or apt-get install bubblewrap)"
	}
	return ""
}
