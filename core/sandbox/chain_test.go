package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/memsandbox"
)

// fakeProvider answers Create with err, or a memory sandbox; it counts its calls.
type fakeProvider struct {
	err   error
	calls int
	sb    sandbox.Sandbox
}

func (f *fakeProvider) Create(context.Context, sandbox.CreateOptions) (sandbox.Sandbox, error) {
	f.calls++
	if f.err != nil {
		return nil, f.err
	}
	f.sb = memsandbox.New()
	return f.sb, nil
}

// handoffProvider can hand over only the sandboxes it made.
type handoffProvider struct {
	fakeProvider
	handed int
}

func (h *handoffProvider) CanHandoff(old sandbox.Sandbox) bool { return old == h.sb }

func (h *handoffProvider) Handoff(_ context.Context, old sandbox.Sandbox, _ sandbox.CreateOptions) (sandbox.Sandbox, error) {
	if old != h.sb {
		return nil, fmt.Errorf("not mine: %w", sandbox.ErrForeign)
	}
	h.handed++
	return memsandbox.New(), nil
}

func TestChainGivesWayOnlyWhenUnavailable(t *testing.T) {
	ctx := context.Background()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))

	noKey := &fakeProvider{err: fmt.Errorf("E2B API key not configured: %w", sandbox.ErrUnavailable)}
	local := &fakeProvider{}
	c := sandbox.NewChain(log, sandbox.Named{Name: "e2b", Provider: noKey}, sandbox.Named{Name: "local", Provider: local})
	sb, err := c.Create(ctx, sandbox.CreateOptions{})
	if err != nil || sb != local.sb {
		t.Fatalf("Create = %v, %v; want the local sandbox", sb, err)
	}
	if !strings.Contains(logs.String(), "E2B API key not configured") || !strings.Contains(logs.String(), "next=local") {
		t.Errorf("the reason was not logged: %s", logs.String())
	}

	// The other way round: local first and available, e2b never asked.
	e2b := &fakeProvider{}
	local = &fakeProvider{}
	c = sandbox.NewChain(log, sandbox.Named{Name: "local", Provider: local}, sandbox.Named{Name: "e2b", Provider: e2b})
	if sb, err := c.Create(ctx, sandbox.CreateOptions{}); err != nil || sb != local.sb || e2b.calls != 0 {
		t.Fatalf("Create = %v, %v (e2b asked %d times)", sb, err, e2b.calls)
	}

	// A caller fault stops the chain, and is reported as it is.
	fault := errors.New("timeout 48h0m0s exceeds the plan's maximum of 24h0m0s")
	bad := &fakeProvider{err: fault}
	local = &fakeProvider{}
	c = sandbox.NewChain(log, sandbox.Named{Name: "e2b", Provider: bad}, sandbox.Named{Name: "local", Provider: local})
	if _, err := c.Create(ctx, sandbox.CreateOptions{}); !errors.Is(err, fault) || local.calls != 0 {
		t.Fatalf("caller fault: %v (local asked %d times)", err, local.calls)
	}
	// ...unless the chain is told to go on.
	c.ContinueOnError = true
	if sb, err := c.Create(ctx, sandbox.CreateOptions{}); err != nil || sb != local.sb {
		t.Fatalf("ContinueOnError: %v, %v", sb, err)
	}

	// A provider that cannot do what is asked (a remote one, a host directory) gives way.
	cannot := &fakeProvider{err: fmt.Errorf("an E2B sandbox cannot mount the host directory /src: %w", sandbox.ErrUnsupported)}
	local = &fakeProvider{}
	c = sandbox.NewChain(log, sandbox.Named{Name: "e2b", Provider: cannot}, sandbox.Named{Name: "local", Provider: local})
	if sb, err := c.Create(ctx, sandbox.CreateOptions{Workspace: "/src"}); err != nil || sb != local.sb {
		t.Fatalf("a host workspace past a provider that cannot mount one: %v, %v", sb, err)
	}

	// All unavailable: the reasons are joined and the error is ErrUnavailable.
	down := &fakeProvider{err: fmt.Errorf("api.e2b.app unreachable: %w", sandbox.ErrUnavailable)}
	gone := &fakeProvider{err: fmt.Errorf("bubblewrap missing: %w", sandbox.ErrUnavailable)}
	c = sandbox.NewChain(log, sandbox.Named{Name: "e2b", Provider: down}, sandbox.Named{Name: "local", Provider: gone})
	_, err = c.Create(ctx, sandbox.CreateOptions{})
	if !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "unreachable") || !strings.Contains(err.Error(), "bubblewrap") {
		t.Fatalf("all unavailable: %v", err)
	}
}

func TestChainHandoffGoesToTheOwner(t *testing.T) {
	ctx := context.Background()
	remote := &fakeProvider{}
	local := &handoffProvider{}
	c := sandbox.NewChain(slog.New(slog.DiscardHandler), sandbox.Named{Name: "e2b", Provider: remote}, sandbox.Named{Name: "local", Provider: local})
	remote.err = sandbox.ErrUnavailable
	sb, err := c.Create(ctx, sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Asked before a rotation: only local's sandbox can be handed over.
	if !c.CanHandoff(sb) || !sandbox.CanHandoff(c, sb) {
		t.Error("the chain says it cannot hand over its local provider's sandbox")
	}
	remote.err = nil
	rsb, err := remote.Create(ctx, sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.CanHandoff(rsb) || c.CanHandoff(memsandbox.New()) {
		t.Error("the chain says it can hand over a sandbox of a provider without Handoff, or of none")
	}
	if _, err := c.Handoff(ctx, sb, sandbox.CreateOptions{}); err != nil || local.handed != 1 {
		t.Fatalf("handoff of local's sandbox: %v (handed %d)", err, local.handed)
	}
	if _, err := c.Handoff(ctx, memsandbox.New(), sandbox.CreateOptions{}); !errors.Is(err, sandbox.ErrForeign) {
		t.Fatalf("handoff of a sandbox no provider made: %v", err)
	}
}
