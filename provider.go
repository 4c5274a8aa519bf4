package toolhost

import (
	"context"
	"fmt"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/module"
)

// unavailable stands for a provider of a list that could not be made (bubblewrap missing
// for local): it gives way to the next one, saying why.
type unavailable struct{ err error }

func (u unavailable) Create(context.Context, sandbox.CreateOptions) (sandbox.Sandbox, error) {
	return nil, fmt.Errorf("%w: %w", sandbox.ErrUnavailable, u.err)
}

// moduleEnv is what the modules of cfg are made with.
func (t *Toolhost) moduleEnv() module.Env {
	env := module.Env{Logger: t.opts.log, DataDir: t.cfg.DataDir, Settings: t.cfg.settings()}
	if t.storage != nil {
		env.Store, env.StoreShared = t.storage.store, t.storage.shared
	}
	return env
}

// buildProvider makes every provider sandbox.provider names, in order, and the provider
// sessions use: the one named, or a chain that tries them in order. In a list, one that
// cannot be made is logged and stands aside (the chain gives way past it); alone, its
// error is returned.
func (t *Toolhost) buildProvider(ctx context.Context) (sandbox.Provider, error) {
	names := ProviderNamesOf(t.cfg.Sandbox.Provider)
	env := t.moduleEnv()
	var members []sandbox.Named
	for _, name := range names {
		m, ok := module.LookupProvider(name)
		if !ok { // Validate checked; the registry cannot shrink
			return nil, fmt.Errorf("sandbox provider %q is not registered", name)
		}
		p, err := m.New(ctx, t.cfg.Module(name), env)
		if err != nil {
			if len(names) == 1 {
				return nil, err
			}
			t.opts.log.Warn("sandbox provider not available; the others of sandbox.provider will serve", "provider", name, "err", err)
			p = unavailable{err}
		}
		members = append(members, sandbox.Named{Name: name, Provider: p})
	}
	if len(members) == 1 {
		return members[0].Provider, nil
	}
	c := sandbox.NewChain(t.opts.log, members...)
	c.ContinueOnError = t.cfg.Sandbox.ContinueOnError
	return c, nil
}

// Provider is the sandbox provider sandbox.provider names, made on first use: the one
// named, or, for a list such as "e2b,local", a sandbox.Chain that tries them in order
// (giving way when one is unavailable; see e2b.continue_on_error).
func (t *Toolhost) Provider(ctx context.Context) (sandbox.Provider, error) {
	t.provMu.Lock()
	defer t.provMu.Unlock()
	if t.provider != nil {
		return t.provider, nil
	}
	p, err := t.buildProvider(ctx)
	if err != nil {
		return nil, err
	}
	t.provider, t.lifeCap = p, sandbox.MaxLifetimeOf(p)
	return t.provider, nil
}

// sessionProvider is the provider of one session of project: Provider, viewed for project
// where it counts per project (sandbox.ProjectScoped: E2B's quota ledger).
func (t *Toolhost) sessionProvider(ctx context.Context, project string) (sandbox.Provider, error) {
	p, err := t.Provider(ctx)
	if err != nil {
		return nil, err
	}
	return sandbox.ForProject(p, project), nil
}
