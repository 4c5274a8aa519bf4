//go:build linux

package e2b_test

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/sandbox/e2b"
	"github.com/toolhost/toolhost/internal/sandbox/e2b/e2bfake"
)

// routing says how the provider reaches sandboxes on the fake: by each sandbox's own
// host (https://49983-{id}.{domain}, through a transport that resolves the fake's domain
// to its listener and trusts its CA), or through one sandbox URL with E2B's routing
// headers (plain http on the fake's address, as the official SDKs do with
// E2B_SANDBOX_URL).
type routing int

const (
	byHost routing = iota
	byHeader
)

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("E2B_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// startFake runs a fake for the test: with TLS when sandboxes are reached by host.
func startFake(t testing.TB, r routing, cfg e2bfake.Config) *e2bfake.Server {
	t.Helper()
	cfg.TLS = r == byHost
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	return e2bfake.Start(t, cfg)
}

// providerConfig points a provider at the fake.
func providerConfig(t testing.TB, f *e2bfake.Server, r routing) e2b.Config {
	t.Helper()
	cfg := e2b.Config{
		APIKey: f.APIKey(), Domain: f.Domain(), Plan: e2b.PlanHobby,
		RequestTimeout: 30 * time.Second, Logger: testLogger(t),
	}
	switch r {
	case byHost:
		cfg.Transport = f.Transport()
	case byHeader:
		cfg.APIURL, cfg.SandboxURL = f.URL(), f.URL()
	}
	return cfg
}

func newProvider(t testing.TB, cfg e2b.Config) *e2b.Provider {
	t.Helper()
	p, err := e2b.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newSandbox(t testing.TB, p sandbox.Provider, opts sandbox.CreateOptions) *e2b.Sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sb, err := p.Create(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close(context.Background()) })
	return sb.(*e2b.Sandbox)
}

func sh(t testing.TB, sb sandbox.Sandbox, script string) sandbox.ExecResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"bash", "-c", script}})
	if err != nil {
		t.Fatalf("exec %q: %v", script, err)
	}
	return res
}
