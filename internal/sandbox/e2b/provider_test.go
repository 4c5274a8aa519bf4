//go:build linux

package e2b_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/egress"
	"github.com/toolhost/toolhost/internal/memsandbox"
	"github.com/toolhost/toolhost/internal/sandbox/e2b"
	"github.com/toolhost/toolhost/internal/sandbox/e2b/e2bfake"
	"github.com/toolhost/toolhost/internal/sandbox/local"
	"github.com/toolhost/toolhost/internal/testenv"
	"github.com/toolhost/toolhost/internal/testnet"
)

// apiGet reads a sandbox as E2B's API shows it.
func apiGet(t *testing.T, f *e2bfake.Server, id string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "https://api."+f.Domain()+"/sandboxes/"+id, nil)
	req.Header.Set("X-API-Key", f.APIKey())
	resp, err := (&http.Client{Transport: f.Transport()}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// localProvider is a real local provider, the next one in a chain.
func localProvider(t *testing.T) *local.Provider {
	t.Helper()
	return e2bfake.NewLocal(t)
}

func TestNoAPIKey(t *testing.T) {
	t.Setenv("E2B_API_KEY", "")
	p := newProvider(t, e2b.Config{Logger: testLogger(t)})
	_, err := p.Create(context.Background(), sandbox.CreateOptions{})
	if err == nil || err.Error() != "E2B API key not configured" || !errors.Is(err, sandbox.ErrUnavailable) {
		t.Fatalf("no key: %v", err)
	}
	// E2B_API_KEY is read as the official SDKs read it.
	f := startFake(t, byHeader, e2bfake.Config{})
	t.Setenv("E2B_API_KEY", f.APIKey())
	cfg := providerConfig(t, f, byHeader)
	cfg.APIKey = ""
	newSandbox(t, newProvider(t, cfg), sandbox.CreateOptions{})
}

// An unreachable service gives way (ErrUnavailable) within the connect timeout: a closed
// port, and a TEST-NET address (refused at once or dropped until the 2 s connect timeout,
// depending on the machine's network).
func TestUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	for name, url := range map[string]string{"refused": "http://" + closed, "test-net": "http://192.0.2.1:9"} {
		t.Run(name, func(t *testing.T) {
			p := newProvider(t, e2b.Config{APIKey: e2bfake.DefaultAPIKey, APIURL: url, ConnectTimeout: 2 * time.Second, Logger: testLogger(t)})
			start := time.Now()
			_, err := p.Create(context.Background(), sandbox.CreateOptions{})
			if !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "cannot reach the E2B API") {
				t.Fatalf("unreachable: %v", err)
			}
			t.Logf("gave way after %s: %v", time.Since(start).Round(time.Millisecond), err)
		})
	}
}

// A key the service refuses is the caller's to fix: the chain stops there.
func TestRefusedKeyStopsTheChain(t *testing.T) {
	f := startFake(t, byHeader, e2bfake.Config{})
	cfg := providerConfig(t, f, byHeader)
	cfg.APIKey = "e2b_wrong"
	loc := &countingProvider{Provider: localProvider(t)}
	c := sandbox.NewChain(testLogger(t), sandbox.Named{Name: "e2b", Provider: newProvider(t, cfg)}, sandbox.Named{Name: "local", Provider: loc})
	_, err := c.Create(context.Background(), sandbox.CreateOptions{})
	var ae *e2b.APIError
	if !errors.As(err, &ae) || ae.Status != http.StatusUnauthorized || errors.Is(err, sandbox.ErrUnavailable) || loc.calls != 0 {
		t.Fatalf("refused key: %v (local asked %d times)", err, loc.calls)
	}
	if !strings.Contains(err.Error(), "E2B refused the API key") {
		t.Errorf("the error does not say what to fix: %v", err)
	}
	// The same with an injected 401.
	f.Inject(e2bfake.Fault{On: "create", Status: http.StatusUnauthorized, Message: "Invalid API key"})
	c.Providers[0].Provider = newProvider(t, providerConfig(t, f, byHeader))
	if _, err := c.Create(context.Background(), sandbox.CreateOptions{}); !errors.As(err, &ae) || ae.Status != 401 || loc.calls != 0 {
		t.Fatalf("injected 401: %v", err)
	}
}

type countingProvider struct {
	sandbox.Provider
	calls int
}

func (c *countingProvider) Create(ctx context.Context, opts sandbox.CreateOptions) (sandbox.Sandbox, error) {
	c.calls++
	return c.Provider.Create(ctx, opts)
}

// 429 is retried after Retry-After within the request's deadline, and given way on when
// the wait would pass it.
func TestRateLimitRetried(t *testing.T) {
	f := startFake(t, byHeader, e2bfake.Config{})
	cfg := providerConfig(t, f, byHeader)
	cfg.RequestTimeout = 10 * time.Second
	p := newProvider(t, cfg)
	f.Inject(e2bfake.Fault{On: "create", Status: http.StatusTooManyRequests, RetryAfter: 1, Times: 2})
	sb := newSandbox(t, p, sandbox.CreateOptions{})
	if res := sh(t, sb, "echo created"); string(res.Stdout) != "created\n" {
		t.Fatalf("after two 429s: %q", res.Stdout)
	}
	f.Inject(e2bfake.Fault{On: "create", Status: http.StatusTooManyRequests, RetryAfter: 60})
	start := time.Now()
	_, err := p.Create(context.Background(), sandbox.CreateOptions{})
	if !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "Retry-After") {
		t.Fatalf("a wait past the deadline: %v", err)
	}
	if time.Since(start) > cfg.RequestTimeout {
		t.Errorf("waited %s for a Retry-After that passes the deadline", time.Since(start))
	}
	// The sandbox-level calls retry too.
	f.Inject(e2bfake.Fault{On: "timeout", Status: http.StatusTooManyRequests, RetryAfter: 1})
	if err := sb.SetTimeout(context.Background(), 2*time.Minute); err != nil {
		t.Fatalf("set timeout after a 429: %v", err)
	}
}

// A 5xx on create gives way to the next provider in the chain; the reason is logged.
func TestServerErrorGivesWay(t *testing.T) {
	f := startFake(t, byHeader, e2bfake.Config{})
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	for _, status := range []int{500, 502, 503, 504} {
		f.Inject(e2bfake.Fault{On: "create", Status: status, Message: "Failed to place sandbox"})
		c := sandbox.NewChain(log, sandbox.Named{Name: "e2b", Provider: newProvider(t, providerConfig(t, f, byHeader))},
			sandbox.Named{Name: "local", Provider: localProvider(t)})
		sb, err := c.Create(context.Background(), sandbox.CreateOptions{})
		if err != nil {
			t.Fatalf("%d: %v", status, err)
		}
		if _, ok := sb.(*local.Sandbox); !ok {
			t.Errorf("%d: the chain did not give way to local: %T", status, sb)
		}
		sb.Close(context.Background())
	}
	if !strings.Contains(logs.String(), "Failed to place sandbox") {
		t.Errorf("the reason was not logged:\n%s", logs.String())
	}
}

// The fallback chain both ways: e2b first (unavailable: no key; then available) and local
// first; and a chain of two e2b clusters.
func TestFallbackChain(t *testing.T) {
	t.Setenv("E2B_API_KEY", "")
	f := startFake(t, byHeader, e2bfake.Config{})
	ctx := context.Background()
	noKey := newProvider(t, e2b.Config{Logger: testLogger(t)})
	withKey := newProvider(t, providerConfig(t, f, byHeader))
	loc := localProvider(t)

	cases := []struct {
		name  string
		chain []sandbox.Named
		want  string // "e2b" or "local"
	}{
		{"e2b,local without a key", []sandbox.Named{{Name: "e2b", Provider: noKey}, {Name: "local", Provider: loc}}, "local"},
		{"e2b,local with a key", []sandbox.Named{{Name: "e2b", Provider: withKey}, {Name: "local", Provider: loc}}, "e2b"},
		{"local,e2b", []sandbox.Named{{Name: "local", Provider: loc}, {Name: "e2b", Provider: withKey}}, "local"},
		{"e2b,e2b", []sandbox.Named{{Name: "e2b-down", Provider: noKey}, {Name: "e2b", Provider: withKey}}, "e2b"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sb, err := sandbox.NewChain(testLogger(t), tc.chain...).Create(ctx, sandbox.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Close(ctx)
			got := "local"
			if _, ok := sb.(*e2b.Sandbox); ok {
				got = "e2b"
			}
			if got != tc.want {
				t.Fatalf("served by %s, want %s", got, tc.want)
			}
			if res := sh(t, sb, "echo works"); string(res.Stdout) != "works\n" {
				t.Errorf("the sandbox does not work: %q", res.Stdout)
			}
		})
	}
	// A caller's fault (a template that does not exist) stops the chain.
	cfg := providerConfig(t, f, byHeader)
	cfg.Template = "no-such-template"
	counting := &countingProvider{Provider: loc}
	_, err := sandbox.NewChain(testLogger(t), sandbox.Named{Name: "e2b", Provider: newProvider(t, cfg)}, sandbox.Named{Name: "local", Provider: counting}).Create(ctx, sandbox.CreateOptions{})
	if err == nil || counting.calls != 0 || !strings.Contains(err.Error(), "template") {
		t.Fatalf("bad template: %v (local asked %d times)", err, counting.calls)
	}
}

// A hang: the control plane's answer never comes (the request timeout gives way), or
// envd's (the idle bound ends the sandbox).
func TestHang(t *testing.T) {
	f := startFake(t, byHeader, e2bfake.Config{})
	cfg := providerConfig(t, f, byHeader)
	cfg.RequestTimeout = 2 * time.Second
	cfg.IdleTimeout = 2 * time.Second
	p := newProvider(t, cfg)
	f.Inject(e2bfake.Fault{On: "create", Hang: true})
	if _, err := p.Create(context.Background(), sandbox.CreateOptions{}); !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "no answer") {
		t.Fatalf("create that hangs: %v", err)
	}
	sb := newSandbox(t, p, sandbox.CreateOptions{})
	sh(t, sb, "echo x > f.txt")
	f.Inject(e2bfake.Fault{On: "envd", Hang: true, Sandbox: sb.ID()})
	_, err := sb.ReadFile(context.Background(), "f.txt", 0)
	if !errors.Is(err, sandbox.ErrUnresponsive) || !errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("envd that hangs: %v", err)
	}
	if !testenv.Eventually(func() bool { return !contains(f.SandboxIDs(), sb.ID()) }) {
		t.Error("a sandbox that stopped answering was not killed")
	}
}

// A stream cut mid-way fails the call; the command it ran is killed, whole group.
func TestCutStream(t *testing.T) {
	f := startFake(t, byHeader, e2bfake.Config{})
	p := newProvider(t, providerConfig(t, f, byHeader))
	sb := newSandbox(t, p, sandbox.CreateOptions{})
	ctx := context.Background()
	marker := uniqueMarker()
	f.Inject(e2bfake.Fault{On: "exec", CutAfter: 300, Sandbox: sb.ID()})
	_, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"bash", "-c", "seq 1 100000; sleep " + marker + " & sleep " + marker}, Timeout: time.Minute})
	if err == nil || errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("exec with its stream cut: %v", err)
	}
	t.Logf("cut exec: %v", err)
	if !testenv.Eventually(func() bool { return leftover(t, sb, marker) == "" }) {
		t.Fatalf("the command whose stream was cut still runs:\n%s", leftover(t, sb, marker))
	}
	sh(t, sb, "head -c 1000000 /dev/zero > big")
	f.Inject(e2bfake.Fault{On: "files", CutAfter: 5000, Sandbox: sb.ID()})
	if b, err := sb.ReadFile(ctx, "big", 0); err == nil {
		t.Fatalf("a cut download read %d bytes without error", len(b))
	}
	if b, err := sb.ReadFile(ctx, "big", 0); err != nil || len(b) != 1000000 {
		t.Fatalf("the next read: %d %v", len(b), err)
	}
}

// A sandbox that vanishes before its end time is closed, and says so.
func TestVanishedSandbox(t *testing.T) {
	f := startFake(t, byHeader, e2bfake.Config{})
	p := newProvider(t, providerConfig(t, f, byHeader))
	sb := newSandbox(t, p, sandbox.CreateOptions{})
	ctx := context.Background()
	if !f.Vanish(sb.ID()) {
		t.Fatal("no such sandbox")
	}
	_, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}})
	if !errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("exec in a vanished sandbox: %v", err)
	}
	if _, err := sb.ReadFile(ctx, "x", 0); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("read in a vanished sandbox: %v", err)
	}
	if err := sb.SetTimeout(ctx, time.Minute); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("set timeout of a vanished sandbox: %v", err)
	}
	if err := sb.Close(ctx); err != nil {
		t.Errorf("close of a vanished sandbox: %v", err)
	}
}

// CPU and memory belong to templates: a size picks a template, or fails naming the ones
// there are. Network none is no internet access.
func TestResourcesAndNetwork(t *testing.T) {
	f := startFake(t, byHost, e2bfake.Config{Templates: []e2bfake.Template{
		{ID: "base", CPUCount: 2, MemoryMB: 512},
		{ID: "big0000000000000000", Aliases: []string{"team/big"}, CPUCount: 4, MemoryMB: 8192},
		{ID: "huge", CPUCount: 8, MemoryMB: 16384},
	}})
	ctx := context.Background()
	cfg := providerConfig(t, f, byHost)
	cfg.CPUs, cfg.MemoryMB = 4, 4096
	p := newProvider(t, cfg)
	sb := newSandbox(t, p.ForProject("proj-a"), sandbox.CreateOptions{})
	if sb.Template() != "big0000000000000000" || sb.CPUs() != 4 || sb.MemoryMB() != 8192 {
		t.Errorf("4 CPUs and 4096 MB chose %s (%d CPUs, %d MB)", sb.Template(), sb.CPUs(), sb.MemoryMB())
	}
	_, detail := apiGet(t, f, sb.ID())
	meta, _ := detail["metadata"].(map[string]any)
	if detail["allowInternetAccess"] != false || meta["toolhost"] != "1" || meta["project"] != "proj-a" || meta["host"] == "" {
		t.Errorf("network none and metadata: %v %v", detail["allowInternetAccess"], meta)
	}
	if res := sh(t, sb, "grep -c : /proc/net/dev"); string(res.Stdout) != "1\n" {
		t.Errorf("network none: the sandbox has interfaces beyond lo: %q", res.Stdout)
	}
	host := newSandbox(t, p, sandbox.CreateOptions{Network: sandbox.NetworkHost})
	if _, d := apiGet(t, f, host.ID()); d["allowInternetAccess"] != true {
		t.Errorf("network host: allowInternetAccess %v", d["allowInternetAccess"])
	}

	cfg.CPUs, cfg.MemoryMB = 16, 1024
	_, err := newProvider(t, cfg).Create(ctx, sandbox.CreateOptions{})
	if err == nil || errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "no E2B template provides 16 CPUs") ||
		!strings.Contains(err.Error(), "huge (8 CPUs, 16384 MB)") {
		t.Errorf("16 CPUs: %v", err)
	}
	cfg.CPUs, cfg.MemoryMB, cfg.Template = 4, 0, "base"
	if _, err := newProvider(t, cfg).Create(ctx, sandbox.CreateOptions{}); err == nil || !strings.Contains(err.Error(), `template "base" has 2 CPUs`) {
		t.Errorf("a named template too small: %v", err)
	}
	cfg.Template = "team/big"
	if sb := newSandbox(t, newProvider(t, cfg), sandbox.CreateOptions{}); sb.CPUs() != 4 {
		t.Errorf("a template by alias: %d CPUs", sb.CPUs())
	}
	if _, err := p.Create(ctx, sandbox.CreateOptions{Network: "bridge"}); err == nil {
		t.Error("an unknown network mode was accepted")
	}
	if !strings.Contains(sb.Describe(), "ephemeral") {
		t.Errorf("Describe does not say the files are ephemeral: %s", sb.Describe())
	}
	fmt.Fprint(new(bytes.Buffer), sb.Describe())
}

// Network egress on E2B: the provider compiles the policy to allowOut/denyOut, and the
// fake's sandboxes honour them (through the egress gateway, on the test's internet).
func TestEgressPolicyOnE2B(t *testing.T) {
	n := testnet.New(t)
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello from %s", r.Host) })
	for _, name := range []string{"registry.test", "other.test"} {
		a, err := n.AddHost(name)
		if err != nil {
			t.Fatal(err)
		}
		l, err := n.Listen("tcp", netip.AddrPortFrom(a, 80).String())
		if err != nil {
			t.Fatal(err)
		}
		n.Serve(l, mux)
	}
	g := egress.New(egress.Config{Resolver: &egress.DNSResolver{Server: n.DNS(), Dialer: n}, Dialer: n, HostAddrs: n.HostAddrs()})
	f := startFake(t, byHost, e2bfake.Config{Egress: g})
	p := newProvider(t, providerConfig(t, f, byHost))
	sb := newSandbox(t, p, sandbox.CreateOptions{Network: sandbox.NetworkEgress,
		Egress: &sandbox.Egress{Policy: sandbox.EgressPolicy{Preset: "none", Allow: []string{"registry.test"}}}})
	if res := sh(t, sb, "curl -sS --max-time 30 http://registry.test/"); string(res.Stdout) != "hello from registry.test" {
		t.Errorf("allowed: %q %q", res.Stdout, res.Stderr)
	}
	if res := sh(t, sb, "curl -sS --max-time 30 http://other.test/"); !strings.Contains(string(res.Stdout), "egress: other.test is not an allowed domain") {
		t.Errorf("refused: %q %q", res.Stdout, res.Stderr)
	}
	if _, d := apiGet(t, f, sb.ID()); d["allowInternetAccess"] != true {
		t.Errorf("allowInternetAccess %v (allowOut needs it on)", d["allowInternetAccess"])
	}
}

// A control plane that accepts connections and never answers gives way in a chain within
// e2b.connect_timeout (default 10 s), not e2b.request_timeout: here the request timeout
// is ten minutes, so a create that waited for it would run into the test's hang bound.
func TestHungAPIGivesWayAtTheConnectTimeout(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	accepted := make(chan struct{})
	go func() { // owned by the test: ends when the listener closes
		defer close(accepted)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c) // read nothing, answer nothing
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-accepted
		for _, c := range conns {
			c.Close()
		}
	})
	p := newProvider(t, e2b.Config{APIKey: "e2b_hung", APIURL: "http://" + l.Addr().String(),
		RequestTimeout: 10 * time.Minute, Logger: testLogger(t)}) // ConnectTimeout: the default
	next := &memsandbox.Provider{}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // a hang bound
	defer cancel()
	sb, err := sandbox.NewChain(testLogger(t), sandbox.Named{Name: "e2b", Provider: p}, sandbox.Named{Name: "mem", Provider: next}).
		Create(ctx, sandbox.CreateOptions{})
	if err != nil {
		t.Fatalf("e2b,mem with a hung E2B API: %v (want the next provider's sandbox)", err)
	}
	defer sb.Close(context.Background())
	if _, ok := sb.(*e2b.Sandbox); ok {
		t.Fatal("served by e2b")
	}
	// Alone, the hung service is unavailable, and says it did not answer.
	short := newProvider(t, e2b.Config{APIKey: "e2b_hung", APIURL: "http://" + l.Addr().String(),
		RequestTimeout: 10 * time.Minute, ConnectTimeout: 500 * time.Millisecond, Logger: testLogger(t)})
	_, err = short.Create(ctx, sandbox.CreateOptions{})
	if !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "no answer within 500ms") {
		t.Fatalf("create against a hung API: %v (want unavailable, no answer within 500ms)", err)
	}
}
