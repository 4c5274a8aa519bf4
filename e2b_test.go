//go:build linux

package toolhost

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/module"
	"github.com/toolhost/toolhost/internal/sandbox/e2b"
	"github.com/toolhost/toolhost/internal/sandbox/e2b/e2bfake"
	"github.com/toolhost/toolhost/internal/sandbox/local"
	"github.com/toolhost/toolhost/internal/testenv"
	"github.com/toolhost/toolhost/internal/testplugins"
)

// e2bConfig is testConfig with sandbox.provider set and the E2B keys pointing at the fake
// f (nil: no key). Its data dir is its own (the quota ledger lives there), with the shared
// compilation cache linked in.
func e2bConfig(t *testing.T, providers string, f *e2bfake.Server) Config {
	t.Helper()
	// The official SDKs' variables would fill the keys left empty: none may leak in.
	for _, v := range []string{"E2B_API_KEY", "E2B_DOMAIN", "E2B_API_URL", "E2B_SANDBOX_URL"} {
		t.Setenv(v, "")
	}
	cfg := testConfig(t)
	cfg.DataDir = t.TempDir()
	if err := testplugins.LinkCache(cfg.DataDir); err != nil {
		t.Fatal(err)
	}
	cfg.Sandbox.Provider = providers
	if f != nil {
		for k, v := range map[string]any{"e2b.api_key": Secret(f.APIKey()), "e2b.domain": f.Domain(), "e2b.api_url": f.URL(), "e2b.sandbox_url": f.URL()} {
			if err := cfg.Set(k, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	return cfg
}

// logTo records a Toolhost's logs.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuf) option() Option {
	return WithLogger(slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug})))
}

// TestE2BWithoutKey: sandbox.provider e2b with no API key fails with exactly E2B's
// "E2B API key not configured"; e2b,local says the same in its log and runs the session
// here.
func TestE2BWithoutKey(t *testing.T) {
	testenv.NeedBwrap(t)
	ctx := context.Background()
	th := newToolhost(t, e2bConfig(t, "e2b", nil))
	_, err := th.Open(ctx, SessionOptions{})
	if err == nil || !errors.Is(err, e2b.ErrNoAPIKey) || !errors.Is(err, sandbox.ErrUnavailable) ||
		!strings.Contains(err.Error(), ": E2B API key not configured") {
		t.Fatalf("e2b without a key: %v", err)
	}

	var logs logBuf
	th = newToolhost(t, e2bConfig(t, "e2b,local", nil), logs.option())
	s := open(t, th, SessionOptions{})
	if _, ok := sandbox.As[*local.Sandbox](s.live); !ok {
		t.Fatalf("e2b,local without a key: the session's sandbox is %T, want a local one", s.live.Unwrap())
	}
	expect(t, s, "bash", `{"command":"echo $TOOLHOST_SANDBOX_PROVIDER here"}`, false, " here")
	if !strings.Contains(logs.String(), `reason="E2B API key not configured"`) || !strings.Contains(logs.String(), "next=local") {
		t.Errorf("the fallback's reason is not logged:\n%s", logs.String())
	}
}

// TestE2BSessions: sessions on the fake E2B through the root package, alone and first in
// a list: the tools run there, a rotation restores the snapshot into a new E2B sandbox
// (no handoff tried: E2B cannot hand a workspace over), the session's lifetime stays
// within the plan's, and the quota counts the project's sandboxes.
func TestE2BSessions(t *testing.T) {
	f := e2bfake.Start(t, e2bfake.Config{Logger: slog.New(slog.DiscardHandler)})
	ctx := context.Background()
	for _, providers := range []string{"e2b", "e2b,local"} {
		t.Run(providers, func(t *testing.T) {
			var logs logBuf
			cfg := e2bConfig(t, providers, f)
			if err := cfg.Set("e2b.max_lifetime", 20*time.Minute); err != nil { // the session's 1h ttl is cut to it
				t.Fatal(err)
			}
			th := newToolhost(t, cfg, logs.option())
			project := "on-e2b"
			s := open(t, th, SessionOptions{Project: project})
			if _, ok := sandbox.As[*e2b.Sandbox](s.live); !ok {
				t.Fatalf("the session's sandbox is %T, want an E2B one\n%s", s.live.Unwrap(), logs.String())
			}
			if left := time.Until(s.live.EndsAt()); left > 20*time.Minute || left < 10*time.Minute {
				t.Errorf("the sandbox ends in %s: want within the plan's 20m", left.Round(time.Second))
			}
			expect(t, s, "write_file", `{"path":"notes.txt","content":"on E2B\n"}`, false)
			expect(t, s, "bash", `{"command":"cat notes.txt; echo $TOOLHOST_SANDBOX_PROVIDER"}`, false, "on E2B\ne2b")
			first := s.live.SandboxID()
			if err := s.live.Rotate(ctx); err != nil {
				t.Fatalf("rotate: %v\n%s", err, logs.String())
			}
			if s.live.SandboxID() == first {
				t.Fatal("the rotation kept the sandbox")
			}
			expect(t, s, "read_file", `{"path":"notes.txt"}`, false, "on E2B")
			if l := logs.String(); !strings.Contains(l, `how="restore`) || strings.Contains(l, "handoff") {
				t.Errorf("the rotation of an E2B sandbox did not simply restore:\n%s", l)
			}
			// The ledger: two sandboxes of the project, one running once the first's close
			// (off the session's path) is recorded.
			var u e2b.Usage
			testenv.WaitFor(t, "the quota ledger to count the project's sandboxes", func() bool {
				var err error
				st := th.Storage()
				if u, err = e2b.UsageOf(ctx, e2bSection(t, &th.cfg), module.Env{DataDir: th.cfg.DataDir, Store: st.Store(), StoreShared: st.Shared()}, time.Now()); err != nil {
					t.Fatal(err)
				}
				return u.Running == 1
			})
			if u.Creations != 2 || len(u.Days) != 1 || u.Days[0].Project != project || u.Days[0].Creations != 2 || u.Days[0].CPUMinutes <= 0 {
				t.Errorf("quota after a session with one rotation: %+v", u)
			}
		})
	}
}

// TestE2BHostWorkspaceFallsBack: a host directory as the workspace is local's to mount:
// e2b,local gives way to local for it; e2b alone refuses it.
func TestE2BHostWorkspaceFallsBack(t *testing.T) {
	f := e2bfake.Start(t, e2bfake.Config{Logger: slog.New(slog.DiscardHandler)})
	ws := t.TempDir()
	os.WriteFile(filepath.Join(ws, "here.txt"), []byte("on this host\n"), 0o644)
	th := newToolhost(t, e2bConfig(t, "e2b,local", f))
	s := open(t, th, SessionOptions{Workspace: ws})
	expect(t, s, "read_file", `{"path":"here.txt"}`, false, "on this host")
	th = newToolhost(t, e2bConfig(t, "e2b", f))
	if _, err := th.Open(context.Background(), SessionOptions{Workspace: ws}); !errors.Is(err, sandbox.ErrUnsupported) {
		t.Errorf("e2b alone with a host workspace: %v, want ErrUnsupported", err)
	}
}

// e2bSection is cfg's e2b provider configuration.
func e2bSection(t *testing.T, cfg *Config) *e2b.Section {
	sec, ok := ModuleConfig[e2b.Section](cfg, "e2b")
	if !ok {
		t.Fatal("no e2b provider registered")
	}
	return sec
}
