package mcpserve

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	_ "golang.org/x/image/webp" // image.DecodeConfig of the screenshots

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/internal/screenshot"
	"github.com/toolhost/toolhost/internal/testenv"
	"github.com/toolhost/toolhost/internal/testplugins"
)

// testConfig is the default configuration (the built-in plugins, the local bubblewrap
// sandbox, a directory store) with the shared compilation cache and a fresh store.
func testConfig(t testing.TB) toolhost.Config {
	cfg := toolhost.DefaultConfig()
	cfg.DataDir = testplugins.DataDir()
	if err := cfg.Set("store.dir", t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Set("sandbox.run_dir", testenv.RunDir(t)); err != nil {
		t.Fatal(err)
	}
	cfg.Project = "mcptest"
	return cfg
}

func quietLog() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// newServer is a Server of a real Toolhost; both are shut down when t ends.
func newServer(t testing.TB, cfg toolhost.Config, opts Options) (*Server, *toolhost.Toolhost) {
	t.Helper()
	testenv.NeedBwrap(t)
	th, err := toolhost.New(context.Background(), cfg, toolhost.WithLogger(quietLog()))
	if err != nil {
		t.Fatal(err)
	}
	if opts.Logger == nil {
		opts.Logger = quietLog()
	}
	s := New(th, opts)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		th.Close(ctx)
	})
	return s, th
}

// connectInMemory is an SDK client session on an in-memory transport to s.
func connectInMemory(t testing.TB, s *Server, copts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	st, ct := mcp.NewInMemoryTransports()
	if _, err := s.Connect(context.Background(), st, ""); err != nil {
		t.Fatal(err)
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, copts)
	cs, err := c.Connect(context.Background(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// bearer adds a static Authorization header.
type bearer struct {
	token, project string
	base           http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if b.token != "" {
		r.Header.Set("Authorization", "Bearer "+b.token)
	}
	if b.project != "" {
		r.Header.Set(ProjectHeader, b.project)
	}
	return b.base.RoundTrip(r)
}

// clientTransport is the test clients' HTTP transport: like a real client (a process of
// its own), each session keeps its connections; http.DefaultTransport would keep only
// two idle ones to the server for all of them and dial again for every other request.
var clientTransport = func() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 256
	return t
}()

// connectHTTP is an SDK client session over streamable HTTP to url.
func connectHTTP(ctx context.Context, url, token, project string, copts *mcp.ClientOptions) (*mcp.ClientSession, error) {
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, copts)
	tr := &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1,
		HTTPClient: &http.Client{Transport: bearer{token: token, project: project, base: clientTransport}}}
	return c.Connect(ctx, tr, &mcp.ClientSessionOptions{ProtocolVersion: statefulRevision})
}

// statefulRevision is the newest revision with sessions (the stateless one has tests of
// its own, TestTwoRevisions).
const statefulRevision = "2025-11-25"

func call(t testing.TB, cs *mcp.ClientSession, tool string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	return res
}

func text(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// exercise lists the tools and runs bash, an error, write_file and read_file, commit.
func exercise(t *testing.T, cs *mcp.ClientSession) {
	t.Helper()
	ctx := context.Background()
	lt, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*mcp.Tool{}
	for _, tl := range lt.Tools {
		got[tl.Name] = tl
		if tl.Title == "" {
			t.Errorf("tools/list: %s has no title", tl.Name)
		}
	}
	for _, want := range []string{"bash", "read_file", "write_file", "edit_file", "grep", "glob", "take_screenshot", CommitTool, CheckpointsTool, RewindTool} {
		if got[want] == nil {
			t.Errorf("tools/list lacks %s (has %d tools)", want, len(lt.Tools))
		}
	}
	// The hints follow the plugins' grants: bash (exec) and read_file (editfile: files
	// and exec) are neither read-only nor closed-world; take_screenshot (capture) is both.
	for name, readOnly := range map[string]bool{"bash": false, "read_file": false, "grep": false, "take_screenshot": true} {
		tl := got[name]
		if tl == nil {
			continue
		}
		a := tl.Annotations
		if a == nil || a.Title == "" || tl.Title == "" {
			t.Errorf("%s has no title or annotations: %+v", name, tl)
			continue
		}
		destructive := a.DestructiveHint == nil || *a.DestructiveHint
		openWorld := a.OpenWorldHint == nil || *a.OpenWorldHint
		if a.ReadOnlyHint != readOnly || destructive == readOnly || openWorld == readOnly {
			t.Errorf("%s: readOnly %v destructive %v openWorld %v; want readOnly %v", name, a.ReadOnlyHint, destructive, openWorld, readOnly)
		}
	}
	if tl := got["take_screenshot"]; tl != nil && tl.Title != "Take screenshot" {
		t.Errorf("take_screenshot's title is %q", tl.Title)
	}
	if b := got["bash"]; b != nil {
		schema, _ := b.InputSchema.(map[string]any)
		props, _ := schema["properties"].(map[string]any)
		if schema["type"] != "object" || props["command"] == nil {
			t.Errorf("bash's input schema is not the plugin's: %v", b.InputSchema)
		}
		// The bounds the description states are the schema's: "(default 60, at most 600)".
		timeout, _ := props["timeout"].(map[string]any)
		m := regexp.MustCompile(`timeout is in seconds \(default ([0-9]+), at most ([0-9]+)\)`).FindStringSubmatch(b.Description)
		if m == nil || fmt.Sprint(timeout["default"]) != m[1] || fmt.Sprint(timeout["maximum"]) != m[2] {
			t.Errorf("bash's description states %q, its timeout schema is %v", m, timeout)
		}
	}
	checkStatedDefaults(t, lt.Tools)

	res := call(t, cs, "bash", map[string]any{"command": "echo hello from $(whoami)"})
	if res.IsError || !strings.Contains(text(res), "hello from") {
		t.Errorf("bash: error %v, %q", res.IsError, text(res))
	}
	res = call(t, cs, "read_file", map[string]any{"path": "no/such/file.txt"})
	if !res.IsError || text(res) == "" {
		t.Errorf("read_file of a missing file: error %v, %q; want an error result with a message", res.IsError, text(res))
	}
	res = call(t, cs, "write_file", map[string]any{"path": "notes/a.txt", "content": "line one\nline two\n"})
	if res.IsError {
		t.Fatalf("write_file: %s", text(res))
	}
	res = call(t, cs, "read_file", map[string]any{"path": "notes/a.txt"})
	if res.IsError || !strings.Contains(text(res), "line two") {
		t.Errorf("read_file after write_file: error %v, %q", res.IsError, text(res))
	}
	res = call(t, cs, CommitTool, map[string]any{"label": "notes written"})
	if res.IsError || !strings.Contains(text(res), "saved snapshot") {
		t.Errorf("commit: error %v, %q", res.IsError, text(res))
	}
}

// checkStatedDefaults: a property whose description says "default N" (a number) has
// "default": N in its schema, so a client that fills in defaults and a model that reads
// the words agree.
func checkStatedDefaults(t *testing.T, tools []*mcp.Tool) {
	t.Helper()
	re := regexp.MustCompile(`default:? ([0-9]+)\b`)
	for _, tl := range tools {
		schema, _ := tl.InputSchema.(map[string]any)
		props, _ := schema["properties"].(map[string]any)
		for name, p := range props {
			p, _ := p.(map[string]any)
			desc, _ := p["description"].(string)
			if m := re.FindStringSubmatch(desc); m != nil && fmt.Sprint(p["default"]) != m[1] {
				t.Errorf("%s.%s: the description says %q, the schema's default is %v", tl.Name, name, m[0], p["default"])
			}
		}
	}
}

func snapshotCount(t testing.TB, th *toolhost.Toolhost, project string) int {
	t.Helper()
	l, err := th.Storage().Snapshots(context.Background(), project)
	if err != nil {
		t.Fatal(err)
	}
	return len(l)
}

// TestInMemory: the SDK's client on the in-memory transport lists the tools, runs them,
// sees a tool's failure as an error result, commits; closing the client commits the
// session and closes its sandbox.
func TestInMemory(t *testing.T) {
	s, th := newServer(t, testConfig(t), Options{})
	cs := connectInMemory(t, s, nil)
	exercise(t, cs)
	if n := s.OpenSessions(); n != 1 {
		t.Errorf("%d sessions open, want 1", n)
	}
	if n := snapshotCount(t, th, "mcptest"); n != 1 {
		t.Errorf("%d snapshots after the commit tool, want 1", n)
	}
	call(t, cs, "write_file", map[string]any{"path": "notes/b.txt", "content": "after the commit\n"})
	cs.Close()
	testenv.WaitFor(t, "the session to end after the client closed", func() bool { return s.OpenSessions() == 0 })
	if n := snapshotCount(t, th, "mcptest"); n != 2 {
		t.Errorf("%d snapshots after the client went, want 2 (its end commits)", n)
	}
	// A new session wakes from the snapshot: the file is there.
	cs = connectInMemory(t, s, nil)
	defer cs.Close()
	res := call(t, cs, "read_file", map[string]any{"path": "notes/b.txt"})
	if res.IsError || !strings.Contains(text(res), "after the commit") {
		t.Errorf("a new session does not see the file written before the last one ended: %q", text(res))
	}
	if c, e := s.Metrics().Calls("read_file"); c != 3 || e != 1 {
		t.Errorf("read_file metrics: %d calls, %d errors; want 3, 1", c, e)
	}
}

// waitFor polls cond until it holds, failing after a generous bound (a bound on a hang,
// not a measurement).

// TestProgress: a call made with a progress token gets progress notifications while it
// runs, over the in-memory transport and over streamable HTTP (down the call's own SSE
// stream).
func TestProgress(t *testing.T) {
	s, _ := newServer(t, testConfig(t), Options{ProgressInterval: 50 * time.Millisecond})
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	for _, transport := range []string{"in-memory", "http"} {
		t.Run(transport, func(t *testing.T) {
			var mu sync.Mutex
			var got []string
			copts := &mcp.ClientOptions{ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
				mu.Lock()
				got = append(got, r.Params.Message)
				mu.Unlock()
			}}
			var cs *mcp.ClientSession
			if transport == "http" {
				var err error
				if cs, err = connectHTTP(context.Background(), srv.URL+"/mcp", "", "progresshttp", copts); err != nil {
					t.Fatal(err)
				}
			} else {
				cs = connectInMemory(t, s, copts)
			}
			defer cs.Close()
			// The command runs twenty intervals: a notification is due long before it ends.
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "bash",
				Arguments: map[string]any{"command": "sleep 1; echo done"}, Meta: mcp.Meta{"progressToken": "p1"}})
			if err != nil {
				t.Fatal(err)
			}
			if res.IsError {
				t.Fatal(text(res))
			}
			mu.Lock()
			defer mu.Unlock()
			if len(got) == 0 || !strings.Contains(got[0], "bash still running") {
				t.Errorf("progress notifications during a 1s command at 50ms: %q", got)
			}
		})
	}
}

// TestCancelKillsProcess: cancelling a call kills the command it started, over the
// in-memory transport and over streamable HTTP.
func TestCancelKillsProcess(t *testing.T) {
	s, _ := newServer(t, testConfig(t), Options{})
	t.Run("in-memory", func(t *testing.T) {
		cs := connectInMemory(t, s, nil)
		defer cs.Close()
		cancelKills(t, cs)
	})
	t.Run("http", func(t *testing.T) {
		srv := httptest.NewServer(s.Handler())
		defer srv.Close()
		cs, err := connectHTTP(context.Background(), srv.URL+"/mcp", "", "cancelhttp", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		cancelKills(t, cs)
	})
}

func cancelKills(t *testing.T, cs *mcp.ClientSession) {
	call(t, cs, "bash", map[string]any{"command": "true"}) // the sandbox is up
	marker := fmt.Sprintf("1000.%d", time.Now().UnixNano()%1e9)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { // owned by the test: it returns when the call is cancelled
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"command": "sleep " + marker}})
		errc <- err
	}()
	testenv.WaitFor(t, "sleep "+marker+" to start", func() bool { return len(procsWith("sleep "+marker)) > 0 })
	cancel()
	if err := <-errc; err == nil {
		t.Error("the cancelled call returned no error")
	}
	testenv.WaitFor(t, "sleep "+marker+" to be killed", func() bool { return len(procsWith("sleep "+marker)) == 0 })
	// The session still works.
	if res := call(t, cs, "bash", map[string]any{"command": "echo still here"}); res.IsError {
		t.Errorf("after a cancelled call: %s", text(res))
	}
}

// procsWith lists the host's processes whose command line contains s.
func procsWith(s string) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if strings.Contains(strings.ReplaceAll(string(b), "\x00", " "), s) {
			out = append(out, pid)
		}
	}
	return out
}

const (
	tokenA = "token-a-0123456789abcdef"
	tokenB = "token-b-0123456789abcdef"
)

// TestHTTP: the SDK's client over real streamable HTTP on loopback, with tokens: the
// same calls; no token, a wrong one and a project the token does not name are refused;
// /healthz and /metrics answer.
func TestHTTP(t *testing.T) {
	s, _ := newServer(t, testConfig(t), Options{Tokens: []Token{
		{Name: "a", Value: tokenA},
		{Name: "b", Value: tokenB, Projects: []string{"alpha"}},
	}})
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	url := srv.URL + "/mcp"
	ctx := context.Background()

	cs, err := connectHTTP(ctx, url, tokenA, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	exercise(t, cs)
	cs.Close()

	for _, tc := range []struct{ name, token, project string }{
		{"no token", "", ""},
		{"wrong token", "token-c-0123456789abcdef", ""},
		{"a project the token does not name", tokenB, "beta"},
	} {
		if cs, err := connectHTTP(ctx, url, tc.token, tc.project, nil); err == nil {
			cs.Close()
			t.Errorf("%s: connected", tc.name)
		}
	}
	// Raw statuses.
	// A 401 carries its challenge (RFC 9110 section 11.6.1): a bearer token, and why the
	// one sent was refused (RFC 6750 section 3).
	for _, tc := range []struct {
		name, token, project string
		want                 int
		challenge            string
	}{
		{"no token", "", "", 401, `Bearer realm="toolhost"`},
		{"wrong token", tokenA + "x", "", 401, `Bearer realm="toolhost", error="invalid_token", error_description="the bearer token is not one of this server's"`},
		{"project not named", tokenB, "beta", 403, ""},
	} {
		req, _ := http.NewRequest("POST", url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		if tc.project != "" {
			req.Header.Set(ProjectHeader, tc.project)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s: status %d, want %d", tc.name, resp.StatusCode, tc.want)
		}
		if got := resp.Header.Values("WWW-Authenticate"); tc.challenge != "" && (len(got) != 1 || got[0] != tc.challenge) {
			t.Errorf("%s: WWW-Authenticate %q, want %q", tc.name, got, tc.challenge)
		}
	}
	// Token b may open alpha, its project.
	cs, err = connectHTTP(ctx, url, tokenB, "alpha", nil)
	if err != nil {
		t.Fatal(err)
	}
	if res := call(t, cs, "bash", map[string]any{"command": "echo alpha"}); res.IsError {
		t.Errorf("token b on alpha: %s", text(res))
	}
	cs.Close()

	resp, err := http.Get(srv.URL + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Errorf("healthz: %v %v", resp, err)
	}
	resp, err = http.Get(srv.URL + "/metrics")
	if err != nil || resp.StatusCode != 401 || resp.Header.Get("WWW-Authenticate") != `Bearer realm="toolhost"` {
		t.Errorf("metrics without a token: %v %v, want 401 with a challenge", resp, err)
	}
	req, _ := http.NewRequest("GET", srv.URL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+tokenA)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	if _, err := fmt.Fprint(&b, readAll(resp)); err != nil {
		t.Fatal(err)
	}
	m := b.String()
	if strings.Contains(m, "toolhost_mcp_project_refused_total 0") || strings.Contains(m, "toolhost_mcp_auth_refused_total 0") {
		t.Errorf("refusals not counted:\n%s", m)
	}
	for _, want := range []string{
		`toolhost_mcp_tool_calls_total{tool="bash"} 2`,
		`toolhost_mcp_tool_errors_total{tool="read_file"} 1`,
		`toolhost_mcp_tool_call_seconds_count{tool="write_file"} 1`,
		`toolhost_mcp_sessions_total 2`,
		`# TYPE toolhost_mcp_tool_call_seconds histogram`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q:\n%s", want, m)
		}
	}
}

func readAll(resp *http.Response) string {
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return b.String()
		}
	}
}

// TestCheckListen: a listener that is not loopback needs tokens.
func TestCheckListen(t *testing.T) {
	for _, tc := range []struct {
		addr   string
		tokens int
		ok     bool
	}{
		{"127.0.0.1:0", 0, true}, {"localhost:8750", 0, true}, {"[::1]:8750", 0, true},
		{":8750", 0, false}, {"0.0.0.0:8750", 0, false}, {"192.168.1.2:80", 0, false},
		{":8750", 1, true}, {"nohost", 1, false},
	} {
		err := CheckListen(tc.addr, tc.tokens)
		if (err == nil) != tc.ok {
			t.Errorf("CheckListen(%q, %d) = %v, want ok %v", tc.addr, tc.tokens, err, tc.ok)
		}
	}
	if err := CheckListen("0.0.0.0:1", 0); err == nil || !strings.Contains(err.Error(), "tokens") {
		t.Errorf("refusal does not say what to do: %v", err)
	}
}

// TestTokensFile: the file's format, and a file others may read is refused.
func TestTokensFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "tokens")
	os.WriteFile(p, []byte("# ops\n"+tokenA+"\n\n"+tokenB+" alpha beta\n"), 0o600)
	toks, err := ReadTokensFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(toks) != 2 || toks[0].Value != tokenA || len(toks[0].Projects) != 0 || strings.Join(toks[1].Projects, ",") != "alpha,beta" {
		t.Errorf("tokens: %+v", toks)
	}
	if err := CheckTokens(toks); err != nil {
		t.Error(err)
	}
	if err := CheckTokens([]Token{{Name: "x", Value: "short"}}); err == nil {
		t.Error("a short token was accepted")
	}
	os.Chmod(p, 0o644)
	if _, err := ReadTokensFile(p); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a world-readable tokens file: %v", err)
	}
}

// TestScreenshot: take_screenshot through MCP gives image/webp content beside the text.
func TestScreenshot(t *testing.T) {
	testenv.Require(t, "Chromium (scripts/setup-browser.sh installs it)", screenshot.New(screenshot.Config{}).Check())
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		testenv.Skipf(t, "no /usr/bin/python3 for the sandbox to serve a page (make setup installs it)")
	}
	s, _ := newServer(t, testConfig(t), Options{})
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	cs, err := connectHTTP(context.Background(), srv.URL+"/mcp", "", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	call(t, cs, "write_file", map[string]any{"path": "site/index.html", "content": "<h1>Hello over MCP</h1>"})
	call(t, cs, "bash", map[string]any{"command": "cd site && exec python3 -m http.server 8000", "background": true})
	call(t, cs, "bash", map[string]any{"command": "for i in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/8000) 2>/dev/null && exit 0; sleep 0.1; done; exit 1"})
	res := call(t, cs, "take_screenshot", map[string]any{"port": 8000})
	if res.IsError {
		t.Fatal(text(res))
	}
	var images int
	var datas [][]byte
	var links []*mcp.ResourceLink
	for _, c := range res.Content {
		if l, ok := c.(*mcp.ResourceLink); ok {
			links = append(links, l)
		}
		ic, ok := c.(*mcp.ImageContent)
		if !ok {
			continue
		}
		images++
		datas = append(datas, ic.Data)
		if ic.MIMEType != "image/webp" {
			t.Errorf("image content of type %s", ic.MIMEType)
		}
		cfg, format, err := image.DecodeConfig(strings.NewReader(string(ic.Data)))
		if err != nil || format != "webp" || cfg.Width == 0 {
			t.Errorf("image content does not decode as WebP: %v %s %v", err, format, cfg)
		}
	}
	if images == 0 || text(res) == "" {
		t.Errorf("take_screenshot: %d images, text %q", images, text(res))
	}
	// Each stored image is linked beside it (a URI of the host's store, never a host
	// path), and resources/read gives back the bytes of the image it links.
	if len(links) != 2 || len(datas) != 2 {
		t.Fatalf("take_screenshot: %d resource links for %d images, want 2 and 2", len(links), len(datas))
	}
	ctx := context.Background()
	for i, l := range links {
		if !strings.HasPrefix(l.URI, "toolhost://store/screenshots/mcptest/agent/") || l.MIMEType != "image/webp" || l.Size == nil || *l.Size != int64(len(datas[i])) {
			t.Errorf("resource link %d: %+v", i, l)
		}
		rr, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: l.URI})
		if err != nil || len(rr.Contents) != 1 || !bytes.Equal(rr.Contents[0].Blob, datas[i]) || rr.Contents[0].MIMEType != "image/webp" {
			t.Errorf("resources/read %s: %v (%d contents)", l.URI, err, len(rrContents(rr)))
		}
	}
	// The template is listed, so a client can tell what the links are.
	if lt, err := cs.ListResourceTemplates(ctx, nil); err != nil || len(lt.ResourceTemplates) != 1 || lt.ResourceTemplates[0].URITemplate != "toolhost://store/{+key}" {
		t.Errorf("resources/templates/list: %+v %v", lt, err)
	}
	// A session of another project cannot read them.
	cs2, err := connectHTTP(ctx, srv.URL+"/mcp", "", "other", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs2.Close()
	if rr, err := cs2.ReadResource(ctx, &mcp.ReadResourceParams{URI: links[0].URI}); err == nil {
		t.Errorf("a session of project other read %s (%d contents)", links[0].URI, len(rrContents(rr)))
	}
	// Nothing else of the store is read this way: another project's images, a path that
	// climbs out, a key outside the screenshots.
	other := strings.Replace(links[0].URI, "/screenshots/mcptest/", "/screenshots/other/", 1)
	for _, uri := range []string{other, links[0].URI + "/../../../other/agent/x.webp", "toolhost://store/screenshots/mcptest/agent/../../other/agent/x.webp",
		"toolhost://store/projects/mcptest/snapshots/x.snap", "toolhost://store/screenshots/mcptest/agent/%2e%2e/x.webp", "file:///etc/passwd"} {
		if rr, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri}); err == nil {
			t.Errorf("resources/read %s answered %d contents", uri, len(rrContents(rr)))
		}
	}
}

func rrContents(rr *mcp.ReadResourceResult) []*mcp.ResourceContents {
	if rr == nil {
		return nil
	}
	return rr.Contents
}

func TestStoredKey(t *testing.T) {
	for uri, want := range map[string]string{
		"toolhost://store/screenshots/shop/agent/20261126T040000Z_desktop.webp": "screenshots/shop/agent/20261126T040000Z_desktop.webp",
		"toolhost://store/screenshots/shop/auto/20261126T040000Z_mobile.webp":   "screenshots/shop/auto/20261126T040000Z_mobile.webp",
		"toolhost://store/screenshots/shopx/agent/a.webp":                       "",
		"toolhost://store/screenshots/other/agent/a.webp":                       "",
		"toolhost://store/screenshots/shop/agent/../../other/agent/a.webp":      "",
		"toolhost://store/screenshots/shop/agent/sub/a.webp":                    "",
		"toolhost://store/screenshots/shop/agent/":                              "",
		"toolhost://store/screenshots/shop/agent//a.webp":                       "",
		"toolhost://store/screenshots/shop/agent/%2e%2e":                        "",
		"toolhost://store/screenshots/shop/other/a.webp":                        "",
		"toolhost://store/projects/shop/snapshots/a.snap":                       "",
		"toolhost://store/":                     "",
		"file:///screenshots/shop/agent/a.webp": "",
	} {
		got, ok := storedKey(uri, "shop")
		if got != want || ok != (want != "") {
			t.Errorf("storedKey(%q) = %q, %v; want %q", uri, got, ok, want)
		}
	}
}

// TestNoSDKInHost: the host and the root package never link the MCP SDK.
func TestNoSDKInHost(t *testing.T) {
	for _, pkg := range []string{"github.com/toolhost/toolhost/internal/host", "github.com/toolhost/toolhost"} {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		if strings.Contains(string(out), "modelcontextprotocol") {
			t.Errorf("%s links the MCP SDK", pkg)
		}
	}
}

// TestBounds: a session past MaxSessions is refused with 503; a body past MaxBodyBytes
// gets 413; a session idle past IdleTimeout is committed and closed.
func TestBounds(t *testing.T) {
	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`
	post := func(url, body string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("POST", url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	ctx := context.Background()
	t.Run("sessions and body", func(t *testing.T) {
		s, _ := newServer(t, testConfig(t), Options{MaxSessions: 1, MaxBodyBytes: 64 << 10})
		srv := httptest.NewServer(s.Handler())
		defer srv.Close()
		cs, err := connectHTTP(ctx, srv.URL+"/mcp", "", "one", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		// Connected, no call yet (no sandbox): the slot is taken all the same.
		testenv.WaitFor(t, "the session to be counted", func() bool { return s.ConnectedSessions() == 1 })
		if resp := post(srv.URL+"/mcp", initialize); resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("a session past max_sessions, the first without a sandbox: status %d, want 503", resp.StatusCode)
		}
		if res := call(t, cs, "bash", map[string]any{"command": "true"}); res.IsError {
			t.Fatal(text(res))
		}
		if resp := post(srv.URL+"/mcp", initialize); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
			t.Errorf("a session past max_sessions: status %d, Retry-After %q; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
		big := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"pad":"` + strings.Repeat("x", 128<<10) + `"}}`
		cs.Close()
		testenv.WaitFor(t, "the session to end", func() bool { return s.OpenSessions() == 0 && s.ConnectedSessions() == 0 })
		if resp := post(srv.URL+"/mcp", big); resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("a 128 KiB body over a 64 KiB bound: status %d, want 413", resp.StatusCode)
		}
	})
	t.Run("idle", func(t *testing.T) {
		s, th := newServer(t, testConfig(t), Options{IdleTimeout: 5 * time.Second}) // long enough for a loaded machine between two requests
		srv := httptest.NewServer(s.Handler())
		defer srv.Close()
		cs, err := connectHTTP(ctx, srv.URL+"/mcp", "", "idle", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		if res := call(t, cs, "write_file", map[string]any{"path": "a.txt", "content": "kept\n"}); res.IsError {
			t.Fatal(text(res))
		}
		testenv.WaitFor(t, "the idle session to end", func() bool { return s.OpenSessions() == 0 })
		if n := snapshotCount(t, th, "idle"); n != 1 {
			t.Errorf("%d snapshots after the idle end, want 1", n)
		}
	})
}

// TestProjectOpenElsewhere: two servers on one store (two hosts behind a load balancer,
// say) never run one project at once: the second one's call is an error result naming
// where the project is open, and it opens once the first session ended.
func TestProjectOpenElsewhere(t *testing.T) {
	cfg := testConfig(t)
	s1, _ := newServer(t, cfg, Options{})
	s2, _ := newServer(t, cfg, Options{})
	cs1 := connectInMemory(t, s1, nil)
	if res := call(t, cs1, "write_file", map[string]any{"path": "first.txt", "content": "from the first host\n"}); res.IsError {
		t.Fatal(text(res))
	}
	cs2 := connectInMemory(t, s2, nil)
	defer cs2.Close()
	res := call(t, cs2, "read_file", map[string]any{"path": "first.txt"})
	if !res.IsError || !strings.Contains(text(res), "project mcptest is open on host") {
		t.Errorf("the same project on a second server: error %v, %q; want the lease holder named", res.IsError, text(res))
	}
	cs1.Close()
	testenv.WaitFor(t, "the first session to end", func() bool { return s1.OpenSessions() == 0 })
	res = call(t, cs2, "read_file", map[string]any{"path": "first.txt"})
	if res.IsError || !strings.Contains(text(res), "from the first host") {
		t.Errorf("after the first session ended: error %v, %q; want the committed file", res.IsError, text(res))
	}
}

// TestCheckpointsAndRewind: a client lists the checkpoints (labels and times), sees rewind
// marked destructive, rewinds the workspace (a shell command's change included) and
// undoes the rewind.
func TestCheckpointsAndRewind(t *testing.T) {
	s, _ := newServer(t, testConfig(t), Options{})
	cs := connectInMemory(t, s, nil)
	defer cs.Close()
	ctx := context.Background()
	lt, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tl := range lt.Tools {
		switch tl.Name {
		case CheckpointsTool:
			if tl.Annotations == nil || !tl.Annotations.ReadOnlyHint {
				t.Errorf("checkpoints is not marked read-only: %+v", tl.Annotations)
			}
		case RewindTool:
			if tl.Annotations == nil || tl.Annotations.DestructiveHint == nil || !*tl.Annotations.DestructiveHint {
				t.Errorf("rewind is not marked destructive: %+v", tl.Annotations)
			}
		}
	}
	call(t, cs, "bash", map[string]any{"command": "echo first > state.txt"})
	if res := call(t, cs, CommitTool, map[string]any{"label": "first state"}); res.IsError {
		t.Fatal(text(res))
	}
	call(t, cs, "bash", map[string]any{"command": "echo second > state.txt"})
	if res := call(t, cs, CommitTool, map[string]any{"label": "second state"}); res.IsError {
		t.Fatal(text(res))
	}
	res := call(t, cs, CheckpointsTool, map[string]any{})
	lines := strings.Split(strings.TrimSpace(text(res)), "\n")
	if res.IsError || len(lines) != 2 || !strings.HasSuffix(lines[0], "second state") || !strings.HasSuffix(lines[1], "first state") {
		t.Fatalf("checkpoints: %q", text(res))
	}
	first := strings.Fields(lines[1])[0]
	res = call(t, cs, RewindTool, map[string]any{"checkpoint": first})
	if res.IsError || !strings.Contains(text(res), "rewind to it to undo") {
		t.Fatalf("rewind: %q", text(res))
	}
	if got := text(call(t, cs, "read_file", map[string]any{"path": "state.txt"})); !strings.Contains(got, "first") {
		t.Fatalf("after the rewind: %q", got)
	}
	// The answer names the checkpoint that undoes it.
	undo := text(res)[strings.Index(text(res), "checkpoint ")+len("checkpoint "):]
	undo = strings.Fields(strings.SplitN(undo, "The state before the rewind is checkpoint ", 2)[1])[0]
	undo = strings.TrimSuffix(undo, ":")
	if res := call(t, cs, RewindTool, map[string]any{"checkpoint": undo}); res.IsError {
		t.Fatalf("undo: %q", text(res))
	}
	if got := text(call(t, cs, "read_file", map[string]any{"path": "state.txt"})); !strings.Contains(got, "second") {
		t.Fatalf("after the undo: %q", got)
	}
	if res := call(t, cs, RewindTool, map[string]any{"checkpoint": "no-such"}); !res.IsError || !strings.Contains(text(res), "call checkpoints") {
		t.Errorf("rewind to nothing: %q", text(res))
	}
}
