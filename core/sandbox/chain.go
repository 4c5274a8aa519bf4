package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
)

// ErrUnavailable: a provider cannot create a sandbox now, for a reason that is not the
// caller's fault: it is not configured (no API key), its service cannot be reached, or
// it is out of capacity. A Chain gives way to its next provider on such an error; any
// other error is the caller's to fix (a bad template, a timeout past the plan's maximum,
// a key the service refused) and stops the chain.
var ErrUnavailable = errors.New("sandbox provider unavailable")

// ErrForeign: a provider was handed a sandbox another provider made (Handoff).
var ErrForeign = errors.New("the sandbox belongs to another provider")

// Named is a provider with the name it was configured under ("e2b", "local").
type Named struct {
	Name     string
	Provider Provider
}

// Chain is a Provider that tries its providers in order ("e2b,local"): one that answers
// with ErrUnavailable gives way to the next, and the reason is logged; so does one that
// answers ErrUnsupported (it cannot do what the options ask, such as mount a host
// directory, and a later one may). Any other error is reported and stops the chain,
// unless ContinueOnError is set. The sandbox returned is the serving provider's own, so
// its optional abilities stay visible.
type Chain struct {
	Providers []Named
	// ContinueOnError makes every error give way to the next provider, not only
	// ErrUnavailable (the last provider's error is still returned).
	ContinueOnError bool
	Logger          *slog.Logger
}

var (
	_ Provider       = (*Chain)(nil)
	_ Handoff        = (*Chain)(nil)
	_ HandoffChecker = (*Chain)(nil)
	_ LifetimeBound  = (*Chain)(nil)
	_ ProjectScoped  = (*Chain)(nil)
	_ Closer         = (*Chain)(nil)
	_ Reconnector    = (*Chain)(nil)
	_ Lister         = (*Chain)(nil)
	_ Killer         = (*Chain)(nil)
)

// MaxLifetime is the shortest bound of its members (a session may land on any of them),
// or 0 when none has one.
func (c *Chain) MaxLifetime() time.Duration {
	var least time.Duration
	for _, p := range c.Providers {
		if d := MaxLifetimeOf(p.Provider); d > 0 && (least == 0 || d < least) {
			least = d
		}
	}
	return least
}

// ForProject is a chain of the members' views for project (see ProjectScoped).
func (c *Chain) ForProject(project string) Provider {
	views := make([]Named, len(c.Providers))
	for i, p := range c.Providers {
		views[i] = Named{Name: p.Name, Provider: ForProject(p.Provider, project)}
	}
	return &Chain{Providers: views, ContinueOnError: c.ContinueOnError, Logger: c.Logger}
}

// Close closes every member that is a Closer.
func (c *Chain) Close(ctx context.Context) error {
	var errs []error
	for _, p := range c.Providers {
		if err := CloseProvider(ctx, p.Provider); err != nil {
			errs = append(errs, fmt.Errorf("closing the %s sandbox provider: %w", p.Name, err))
		}
	}
	return errors.Join(errs...)
}

// NewChain builds a chain over providers, tried in the order given.
func NewChain(log *slog.Logger, providers ...Named) *Chain {
	return &Chain{Providers: providers, Logger: log}
}

func (c *Chain) log() *slog.Logger {
	if c.Logger != nil {
		return c.Logger
	}
	return slog.Default()
}

// Create asks each provider in turn. When all give way, the error joins their reasons
// and wraps ErrUnavailable.
func (c *Chain) Create(ctx context.Context, opts CreateOptions) (Sandbox, error) {
	if len(c.Providers) == 0 {
		return nil, fmt.Errorf("create sandbox: no provider configured: %w", ErrUnavailable)
	}
	var reasons []string
	for i, p := range c.Providers {
		sb, err := p.Provider.Create(ctx, opts)
		if err == nil {
			if i > 0 {
				c.log().Info("sandbox provider fallback: created the sandbox with a later provider",
					"provider", p.Name, "sandbox", sb.ID(), "skipped", strings.Join(reasons, "; "))
			}
			return sb, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("create sandbox with %s: %w", p.Name, err)
		}
		last := i == len(c.Providers)-1
		if !errors.Is(err, ErrUnavailable) && !errors.Is(err, ErrUnsupported) && !c.ContinueOnError {
			return nil, fmt.Errorf("create sandbox with %s: %w", p.Name, err)
		}
		reasons = append(reasons, p.Name+": "+err.Error())
		if last {
			if len(c.Providers) == 1 {
				return nil, fmt.Errorf("create sandbox with %s: %w", p.Name, err)
			}
			return nil, fmt.Errorf("create sandbox: no provider could (%s): %w", strings.Join(reasons, "; "), errors.Join(ErrUnavailable, err))
		}
		c.log().Warn("sandbox provider unavailable; trying the next one",
			"provider", p.Name, "next", c.Providers[i+1].Name, "reason", err.Error())
	}
	panic("unreachable")
}

// Handoff passes the rotation to the provider that made old, when that provider can hand
// a workspace over; providers that do not know old answer ErrForeign and are skipped.
// When none can, the error wraps ErrForeign and the caller restores a snapshot instead.
func (c *Chain) Handoff(ctx context.Context, old Sandbox, opts CreateOptions) (Sandbox, error) {
	for _, p := range c.Providers {
		h, ok := p.Provider.(Handoff)
		if !ok {
			continue
		}
		sb, err := h.Handoff(ctx, old, opts)
		if errors.Is(err, ErrForeign) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("handoff with %s: %w", p.Name, err)
		}
		return sb, nil
	}
	return nil, fmt.Errorf("handoff of sandbox %s: no provider in the chain can hand it over: %w", old.ID(), ErrForeign)
}

// CanHandoff reports whether one of the chain's providers can hand old's workspace over:
// the one that made it, when it can (a local sandbox in "e2b,local"; never an E2B one).
// A provider that implements Handoff without HandoffChecker cannot tell whether old is
// its own, so it is taken to be able to.
func (c *Chain) CanHandoff(old Sandbox) bool {
	for _, p := range c.Providers {
		if CanHandoff(p.Provider, old) {
			return true
		}
	}
	return false
}

// Reconnect asks each member that is a Reconnector in turn; one that answers ErrForeign
// (the ID is not of its sandboxes) gives way to the next. When none knows the sandbox
// the error wraps ErrForeign (ErrUnsupported when no member can reconnect at all).
func (c *Chain) Reconnect(ctx context.Context, id string, opts ReconnectOptions) (Sandbox, error) {
	var foreign []string
	for _, p := range c.Providers {
		r, ok := ProviderAs[Reconnector](p.Provider)
		if !ok {
			continue
		}
		sb, err := r.Reconnect(ctx, id, opts)
		if errors.Is(err, ErrForeign) {
			foreign = append(foreign, p.Name+": "+err.Error())
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reconnect with %s: %w", p.Name, err)
		}
		return sb, nil
	}
	if len(foreign) == 0 {
		return nil, fmt.Errorf("reconnect to sandbox %s: no provider in the chain can reconnect: %w", id, ErrUnsupported)
	}
	return nil, fmt.Errorf("reconnect to sandbox %s: %s: %w", id, strings.Join(foreign, "; "), ErrForeign)
}

// List lists the sandboxes of every member that is a Lister. A member that cannot list
// now (ErrUnavailable) is logged and left out; any other error is returned.
func (c *Chain) List(ctx context.Context, filter map[string]string) ([]SandboxInfo, error) {
	var all []SandboxInfo
	listed := false
	for _, p := range c.Providers {
		l, ok := ProviderAs[Lister](p.Provider)
		if !ok {
			continue
		}
		infos, err := l.List(ctx, filter)
		if errors.Is(err, ErrUnavailable) {
			c.log().Warn("sandbox provider cannot list its sandboxes now", "provider", p.Name, "err", err)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list the sandboxes of %s: %w", p.Name, err)
		}
		listed = true
		all = append(all, infos...)
	}
	if !listed {
		return nil, fmt.Errorf("list sandboxes: no provider in the chain could: %w", ErrUnsupported)
	}
	return all, nil
}

// Kill asks each member that is a Killer in turn; one that answers ErrForeign gives way
// to the next.
func (c *Chain) Kill(ctx context.Context, id string) error {
	for _, p := range c.Providers {
		k, ok := ProviderAs[Killer](p.Provider)
		if !ok {
			continue
		}
		err := k.Kill(ctx, id)
		if errors.Is(err, ErrForeign) {
			continue
		}
		if err != nil {
			return fmt.Errorf("kill with %s: %w", p.Name, err)
		}
		return nil
	}
	return fmt.Errorf("kill sandbox %s: no provider in the chain has it: %w", id, ErrForeign)
}
