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

// reconnectProvider knows the sandboxes in ids: it reconnects to, lists and kills them, and
// answers ErrForeign for any other ID.
type reconnectProvider struct {
	fakeProvider
	ids    map[string]map[string]string // id -> labels
	killed []string
}

func (r *reconnectProvider) Reconnect(_ context.Context, id string, _ sandbox.ReconnectOptions) (sandbox.Sandbox, error) {
	if _, ok := r.ids[id]; !ok {
		return nil, fmt.Errorf("%s: %w", id, sandbox.ErrForeign)
	}
	return memsandbox.New(), nil
}

func (r *reconnectProvider) List(_ context.Context, filter map[string]string) ([]sandbox.SandboxInfo, error) {
	var out []sandbox.SandboxInfo
next:
	for id, labels := range r.ids {
		for k, v := range filter {
			if labels[k] != v {
				continue next
			}
		}
		out = append(out, sandbox.SandboxInfo{ID: id, Labels: labels})
	}
	return out, nil
}

func (r *reconnectProvider) Kill(_ context.Context, id string) error {
	if _, ok := r.ids[id]; !ok {
		return fmt.Errorf("%s: %w", id, sandbox.ErrForeign)
	}
	r.killed = append(r.killed, id)
	return nil
}

// TestChainReconnectListKill: a chain reconnects to, lists and kills through the member that
// knows the sandbox (ErrForeign from one gives way to the next; members without the ability
// are passed over); one no member knows is ErrForeign, and a chain with no member able to
// reconnect says ErrUnsupported.
func TestChainReconnectListKill(t *testing.T) {
	ctx := context.Background()
	a := &reconnectProvider{ids: map[string]map[string]string{"a1": {"p": "x"}}}
	b := &reconnectProvider{ids: map[string]map[string]string{"b1": {"p": "x"}, "b2": {"p": "y"}}}
	c := sandbox.NewChain(slog.New(slog.DiscardHandler),
		sandbox.Named{Name: "local", Provider: &fakeProvider{}}, sandbox.Named{Name: "a", Provider: a}, sandbox.Named{Name: "b", Provider: b})
	r, ok := sandbox.ProviderAs[sandbox.Reconnector](c)
	if !ok {
		t.Fatal("a chain is not a Reconnector")
	}
	if _, err := r.Reconnect(ctx, "b1", sandbox.ReconnectOptions{}); err != nil {
		t.Errorf("Reconnect to a sandbox of the second reconnecting member: %v", err)
	}
	if _, err := r.Reconnect(ctx, "zz", sandbox.ReconnectOptions{}); !errors.Is(err, sandbox.ErrForeign) {
		t.Errorf("Reconnect to a sandbox no member knows: %v, want ErrForeign", err)
	}
	infos, err := c.List(ctx, map[string]string{"p": "x"})
	if err != nil || len(infos) != 2 {
		t.Errorf("List(p=x) = %+v, %v; want a1 and b1", infos, err)
	}
	if err := c.Kill(ctx, "b2"); err != nil || len(b.killed) != 1 || len(a.killed) != 0 {
		t.Errorf("Kill(b2): %v; killed by a %v, by b %v", err, a.killed, b.killed)
	}
	if err := c.Kill(ctx, "zz"); !errors.Is(err, sandbox.ErrForeign) {
		t.Errorf("Kill of a sandbox no member knows: %v, want ErrForeign", err)
	}
	none := sandbox.NewChain(nil, sandbox.Named{Name: "local", Provider: &fakeProvider{}})
	if _, err := none.Reconnect(ctx, "a1", sandbox.ReconnectOptions{}); !errors.Is(err, sandbox.ErrUnsupported) {
		t.Errorf("Reconnect through a chain that cannot: %v, want ErrUnsupported", err)
	}
	if _, err := none.List(ctx, nil); !errors.Is(err, sandbox.ErrUnsupported) {
		t.Errorf("List through a chain that cannot: %v, want ErrUnsupported", err)
	}
}
