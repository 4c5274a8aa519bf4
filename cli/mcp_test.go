package cli

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolhost/toolhost"
)

// cliEnv is the environment runCLI gives the binary: no TOOLHOST_ variables of the
// caller, the shared compilation cache, no user config file, plus env.
func cliEnv(t testing.TB, env ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TOOLHOST_") && !strings.HasPrefix(kv, "XDG_CONFIG_HOME=") {
			out = append(out, kv)
		}
	}
	out = append(out, "TOOLHOST_DATA_DIR="+testDataDir, "XDG_CONFIG_HOME="+t.TempDir())
	return append(out, env...)
}

// snapshots counts a project's snapshots in the directory store dir.
func snapshots(t *testing.T, dir, project string) int {
	t.Helper()
	cfg := toolhost.DefaultConfig()
	cfg.DataDir = testDataDir
	if err := cfg.Set("store.dir", dir); err != nil {
		t.Fatal(err)
	}
	st, err := toolhost.OpenStorage(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	l, err := st.Snapshots(context.Background(), project)
	if err != nil {
		t.Fatal(err)
	}
	return len(l)
}

func mcpText(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// TestMCPStdio: an MCP client that starts toolhost mcp lists the tools and runs them over
// stdio (nothing but the protocol on stdout, or the client would choke); when the client
// closes, the session's work is committed.
func TestMCPStdio(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	trackSources()
	store := t.TempDir()
	cmd := exec.Command(toolBin, "mcp", "--project", "stdio", "--store-dir", store, "--log-level", "debug")
	cmd.Env = cliEnv(t)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	ctx := context.Background()
	cs, err := c.Connect(ctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: time.Minute}, nil)
	if err != nil {
		t.Fatal(err)
	}
	lt, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(lt.Tools) < 8 {
		t.Errorf("%d tools over stdio", len(lt.Tools))
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"command": "echo made > made.txt && cat made.txt"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError || !strings.Contains(mcpText(res), "made") {
		t.Errorf("bash over stdio: %q", mcpText(res))
	}
	if err := cs.Close(); err != nil {
		t.Errorf("closing: %v\n%s", err, stderr.String())
	}
	if n := snapshots(t, store, "stdio"); n != 1 {
		t.Errorf("%d snapshots after the client closed, want 1\n%s", n, stderr.String())
	}
	if !strings.Contains(stderr.String(), "mcp: session committed") {
		t.Errorf("no commit in the log on stderr:\n%s", stderr.String())
	}
}

// startServe starts toolhost serve on a loopback port and returns it, its /mcp URL, its
// stderr so far, and the channel its exit arrives on.
func startServe(t testing.TB, env []string, args ...string) (*exec.Cmd, string, *syncBuilder, <-chan error) {
	t.Helper()
	cmd := exec.Command(toolBin, append([]string{"serve", "--listen", "127.0.0.1:0"}, args...)...)
	cmd.Env = cliEnv(t, env...)
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); pw.Close() }() // owned by the test: ends with the process
	t.Cleanup(func() {
		cmd.Process.Kill()
		select {
		case err := <-exited:
			exited <- err
		default:
		}
	})
	log := &syncBuilder{done: make(chan struct{})}
	urlc := make(chan string, 1)
	go func() { // owned by the test: ends when the process closes stderr
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			log.WriteString(line + "\n")
			if u, ok := strings.CutPrefix(line, "toolhost serve: listening on "); ok {
				urlc <- u
			}
		}
		close(log.done)
	}()
	select {
	case u := <-urlc:
		return cmd, u, log, exited
	case <-time.After(60 * time.Second):
		t.Fatalf("toolhost serve never listened")
	}
	return nil, "", nil, nil
}

// syncBuilder is a strings.Builder safe for one writer and concurrent readers; done is
// closed when the writer is finished.
type syncBuilder struct {
	mu   sync.Mutex
	b    strings.Builder
	done chan struct{}
}

func (s *syncBuilder) WriteString(v string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b.WriteString(v)
}

func (s *syncBuilder) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type headers struct {
	h    map[string]string
	base http.RoundTripper
}

func (h headers) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h.h {
		r.Header.Set(k, v)
	}
	return h.base.RoundTrip(r)
}

// TestServeSIGTERM: toolhost serve with three open sessions (three projects) gets
// SIGTERM: it commits each, closes every sandbox and exits 0, leaving three new
// snapshots.
func TestServeSIGTERM(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	trackSources()
	store := t.TempDir()
	tokens := filepath.Join(t.TempDir(), "tokens")
	const token = "serve-test-token-0123456789"
	os.WriteFile(tokens, []byte(token+" p1 p2 p3\n"), 0o600)
	cmd, url, log, exited := startServe(t, nil, "--store-dir", store, "--tokens-file", tokens)
	ctx := context.Background()
	for _, p := range []string{"p1", "p2", "p3"} {
		c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
		cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1,
			HTTPClient: &http.Client{Transport: headers{map[string]string{"Authorization": "Bearer " + token, "Toolhost-Project": p}, http.DefaultTransport}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "write_file", Arguments: map[string]any{"path": "work.txt", "content": "work of " + p}})
		if err != nil || res.IsError {
			t.Fatalf("write_file in %s: %v %s", p, err, mcpText(res))
		}
		if n := snapshots(t, store, p); n != 0 {
			t.Errorf("project %s has %d snapshots before the signal", p, n)
		}
	}
	// Without a token: refused.
	resp, err := http.Post(url, "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("no token: status %d, want 401", resp.StatusCode)
	}

	cmd.Process.Signal(syscall.SIGTERM)
	if err := <-exited; err != nil {
		t.Errorf("toolhost serve after SIGTERM: %v (want exit 0)\n%s", err, log.String())
	}
	<-log.done // the process exited: its stderr is read to the end
	for _, p := range []string{"p1", "p2", "p3"} {
		if n := snapshots(t, store, p); n != 1 {
			t.Errorf("project %s has %d snapshots after SIGTERM, want 1\n%s", p, n, log.String())
		}
	}
	if got := strings.Count(log.String(), "mcp: session committed"); got != 3 {
		t.Errorf("%d commits logged, want 3:\n%s", got, log.String())
	}
}

// TestServeRefusesOpenListen: a listener that is not loopback without tokens is refused
// at start, with one line saying what to do.
func TestServeRefusesOpenListen(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "serve", "--listen", "0.0.0.0:0")
	oneLineError(t, r, exitUsage, "without bearer tokens")
	// A short token is refused too.
	cfg := writeConfig(t, "serve:\n  listen: 0.0.0.0:0\n  tokens:\n    - token: short\n")
	r = runCLI(t, nil, "serve", "--config", cfg)
	oneLineError(t, r, exitUsage, "serve.tokens[0].token")
}

// TestMCPStdioSIGTERM: toolhost mcp gets SIGTERM with its session open: it commits the
// session's work and exits 0.
func TestMCPStdioSIGTERM(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	trackSources()
	store := t.TempDir()
	cmd := exec.Command(toolBin, "mcp", "--project", "stdioterm", "--store-dir", store)
	cmd.Env = cliEnv(t)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	out := bufio.NewScanner(stdout)
	out.Buffer(nil, 1<<20)
	// The JSON-RPC lines of a client: the handshake, then a write_file.
	send := func(line string) {
		if _, err := io.WriteString(stdin, line+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	reply := func(id string) string {
		for out.Scan() {
			if strings.Contains(out.Text(), `"id":`+id) {
				return out.Text()
			}
		}
		t.Fatalf("no reply %s on stdout (%v)\n%s", id, out.Err(), stderr.String())
		return ""
	}
	send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	reply("1")
	send(`{"jsonrpc":"2.0","method":"notifications/initialized","params":{}}`)
	send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"write_file","arguments":{"path":"w.txt","content":"work\n"}}}`)
	if r := reply("2"); strings.Contains(r, `"isError":true`) || !strings.Contains(r, `"result"`) {
		t.Fatalf("write_file: %s", r)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Errorf("toolhost mcp after SIGTERM: %v (want exit 0)\n%s", err, stderr.String())
	}
	if n := snapshots(t, store, "stdioterm"); n != 1 {
		t.Errorf("%d snapshots after SIGTERM, want 1\n%s", n, stderr.String())
	}
}
