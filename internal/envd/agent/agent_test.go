//go:build linux

package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/envd"
	"github.com/toolhost/toolhost/internal/envd/client"
	"github.com/toolhost/toolhost/internal/testenv"
)

// agent serves a Server over a unix socket for a temp workspace; wrap may alter requests
// (to play a real envd that ignores the toolhost extensions).
func agent(t *testing.T, wrap func(http.Handler) http.Handler) (ws string, c *client.Client, sock string) {
	return agentWith(t, Config{}, wrap)
}

func agentWith(t *testing.T, cfg Config, wrap func(http.Handler) http.Handler) (ws string, c *client.Client, sock string) {
	t.Helper()
	ws = cfg.Workspace
	if ws == "" {
		ws = t.TempDir()
	}
	cfg.Workspace, cfg.LogDir = ws, filepath.Join(t.TempDir(), "logs")
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sock = filepath.Join(t.TempDir(), "envd.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	if wrap == nil {
		go func() { done <- srv.Serve(ctx, l) }()
	} else {
		hs := &http.Server{Handler: wrap(srv)}
		go func() { done <- hs.Serve(l) }()
		t.Cleanup(func() { hs.Close(); srv.Close() })
	}
	t.Cleanup(func() {
		cancel()
		if wrap == nil {
			if err := <-done; err != nil {
				t.Errorf("Serve: %v", err)
			}
		}
	})
	c, err = client.New(client.Config{SocketPath: sock})
	if err != nil {
		t.Fatal(err)
	}
	return ws, c, sock
}

func rawClient(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
}

func readAllEnvelopes(t *testing.T, r io.Reader) (msgs []string, end string) {
	t.Helper()
	for {
		flags, payload, err := envd.ReadEnvelope(r)
		if err != nil {
			t.Fatalf("stream ended without end-of-stream: %v (got %q)", err, msgs)
		}
		if flags&envd.FlagEndStream != 0 {
			return msgs, string(payload)
		}
		msgs = append(msgs, string(payload))
	}
}

// TestWireFormat checks the bytes a real envd client would see.
func TestWireFormat(t *testing.T) {
	ws, _, sock := agent(t, nil)
	hc := rawClient(sock)
	if err := os.WriteFile(filepath.Join(ws, "f.txt"), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}

	resp, err := hc.Get("http://x/health")
	if err != nil || resp.StatusCode != 204 {
		t.Fatalf("health: %v %v", resp, err)
	}
	resp.Body.Close()

	resp, err = hc.Get("http://x/files?path=missing.txt")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var fe map[string]any
	if resp.StatusCode != 404 || json.Unmarshal(body, &fe) != nil || fe["code"] != float64(404) {
		t.Fatalf("files 404: %d %s", resp.StatusCode, body)
	}

	post := func(p, ct string, body []byte, hdr map[string]string) *http.Response {
		req, _ := http.NewRequest("POST", "http://x"+p, bytes.NewReader(body))
		req.Header.Set("Content-Type", ct)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp = post(envd.PathFilesystemStat, "application/json", []byte(`{"path":"f.txt","unknownField":1}`), nil)
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"size":"5"`) || !strings.Contains(string(body), `"type":"FILE_TYPE_FILE"`) ||
		!strings.Contains(string(body), `"path":"/home/user/f.txt"`) {
		t.Fatalf("stat: %d %s", resp.StatusCode, body)
	}
	resp = post(envd.PathFilesystemStat, "application/json", nil, nil)
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(body), `"code":"invalid_argument"`) {
		t.Fatalf("empty unary body: %d %s", resp.StatusCode, body)
	}
	resp = post(envd.PathFilesystemRm, "application/json", []byte(`{"path":"nothing-here"}`), nil)
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "{}" {
		t.Fatalf("remove: %d %q", resp.StatusCode, body)
	}

	start := func(req string, hdr map[string]string) ([]string, string) {
		var env bytes.Buffer
		_ = envd.WriteEnvelope(&env, 0, []byte(req))
		resp := post(envd.PathProcessStart, "application/connect+json", env.Bytes(), hdr)
		defer resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/connect+json" {
			t.Fatalf("start: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		return readAllEnvelopes(t, resp.Body)
	}
	msgs, end := start(`{"process":{"cmd":"/bin/sh","args":["-c","printf hi; exit 3"]},"stdin":false}`, nil)
	if len(msgs) != 3 || !strings.HasPrefix(msgs[0], `{"event":{"start":{"pid":`) ||
		msgs[1] != `{"event":{"data":{"stdout":"aGk="}}}` ||
		msgs[2] != `{"event":{"end":{"exitCode":3,"exited":true,"status":"exit status 3","error":"exit status 3"}}}` || end != "{}" {
		t.Fatalf("start stream: %q end %q", msgs, end)
	}
	msgs, end = start(`{"process":{"cmd":"true"}}`, nil)
	if msgs[len(msgs)-1] != `{"event":{"end":{"exited":true,"status":"exit status 0"}}}` || end != "{}" {
		t.Fatalf("exit 0 omits the default: %q", msgs)
	}
	msgs, end = start(`{"process":{"cmd":"sleep","args":["30"]}}`, map[string]string{envd.HeaderTimeoutMs: "200"})
	if !strings.Contains(end, `"code":"deadline_exceeded"`) || len(msgs) != 1 {
		t.Fatalf("timeout: %q end %q", msgs, end)
	}
	_, end = start(`{"process":{"cmd":"true","cwd":"/no/such/dir"}}`, nil)
	if !strings.Contains(end, `"code":"invalid_argument"`) || !strings.Contains(end, "does not exist") {
		t.Fatalf("bad cwd: %q", end)
	}
	// The cap: head forwarded, then the tail with the dropped count.
	msgs, _ = start(`{"process":{"cmd":"seq","args":["1","1000"]}}`, map[string]string{envd.HeaderMaxOutputBytes: "20"})
	if msgs[1] != `{"event":{"data":{"stdout":"MQoyCjMKNAo1Cg=="}}}` || // "1\n2\n3\n4\n5\n": 10-byte head
		msgs[2] != `{"event":{"data":{"stdout":"Cjk5OQoxMDAwCg==","toolhostDropped":"3873"}}}` { // "\n999\n1000\n"
		t.Fatalf("capped stream: %q", msgs)
	}
}

// TestClientCapsWithoutAgentCap plays a real envd, which ignores the cap header: the
// client still keeps head and tail and counts the cut.
func TestClientCapsWithoutAgentCap(t *testing.T) {
	_, c, _ := agent(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r.Header.Del(envd.HeaderMaxOutputBytes)
			h.ServeHTTP(w, r)
		})
	})
	res, err := c.Exec(context.Background(), sandbox.ExecRequest{Argv: []string{"seq", "1", "100000"}, MaxOutputBytes: 16})
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Stdout) != "1\n2\n3\n4\n\n100000\n" || res.StdoutCut != 588895-16 || res.ExitCode != 0 {
		t.Fatalf("client cap: %q cut %d", res.Stdout, res.StdoutCut)
	}
}

func TestDisconnectDoesNotKill(t *testing.T) {
	ws, c, sock := agent(t, nil)
	_ = ws
	hc := rawClient(sock)
	var env bytes.Buffer
	_ = envd.WriteEnvelope(&env, 0, []byte(`{"process":{"cmd":"sleep","args":["30"]},"tag":"t1"}`))
	req, _ := http.NewRequest("POST", "http://x"+envd.PathProcessStart, &env)
	req.Header.Set("Content-Type", "application/connect+json")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := envd.ReadEnvelope(resp.Body); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close() // walk away
	hc.CloseIdleConnections()
	ctx := context.Background()
	time.Sleep(100 * time.Millisecond)
	procs, err := c.Processes(ctx)
	if err != nil || len(procs) != 1 || procs[0].Tag != "t1" {
		t.Fatalf("after disconnect: %+v %v", procs, err)
	}
	if err := c.Signal(ctx, procs[0].Pid, envd.SignalKill); err != nil {
		t.Fatal(err)
	}
	if !testenv.Eventually(func() bool { procs, _ = c.Processes(ctx); return len(procs) == 0 }) {
		t.Fatalf("still running after SIGKILL: %+v", procs)
	}
	if err := c.Signal(ctx, 999999, envd.SignalKill); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("signal unknown pid: %v", err)
	}
}

// TestExecCancelBeforeStart: a cancel that lands before the start event still kills the
// process (the agent kills it with the dropped stream).
func TestExecCancelBeforeStart(t *testing.T) {
	_, c, _ := agent(t, nil)
	for range 5 {
		ctx, cancel := context.WithCancel(context.Background())
		go func() { time.Sleep(time.Millisecond); cancel() }()
		res, err := c.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sleep", "30"}})
		if !res.TimedOut || !errors.Is(err, context.Canceled) {
			t.Fatalf("canceled exec: %+v %v", res, err)
		}
	}
	var procs []envd.ProcessInfo
	if !testenv.Eventually(func() bool { procs, _ = c.Processes(context.Background()); return len(procs) == 0 }) {
		t.Fatalf("processes left after canceled execs: %+v", procs)
	}
}

func TestClientErrorsAndClose(t *testing.T) {
	ws, c, _ := agent(t, nil)
	ctx := context.Background()
	if err := os.Symlink("/etc/hostname", filepath.Join(ws, "out")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReadFile(ctx, "out", 0); !errors.Is(err, sandbox.ErrOutside) {
		t.Fatalf("escaping link: %v", err)
	}
	if err := c.MakeDir(ctx, "d/e"); err != nil {
		t.Fatal(err)
	}
	if err := c.MakeDir(ctx, "d/e"); !errors.Is(err, sandbox.ErrExists) {
		t.Fatalf("MakeDir existing: %v", err)
	}
	if err := c.Remove(ctx, "d"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stat(ctx, "d"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("after Remove: %v", err)
	}
	c.Close()
	if _, err := c.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// TestDrainKeepsBufferedOutput: even when the drain deadline has passed before a reader
// ran, what the process wrote before exiting is delivered.
func TestDrainKeepsBufferedOutput(t *testing.T) {
	_, c, _ := agentWith(t, Config{DrainTimeout: time.Nanosecond}, nil)
	for i := range 20 {
		res, err := c.Exec(context.Background(), sandbox.ExecRequest{Argv: []string{"sh", "-c", "seq 1 5000; seq 1 3000 >&2"}})
		if err != nil || len(res.Stdout) != 23893 || len(res.Stderr) != 13893 {
			t.Fatalf("run %d: %d/%d bytes, %v", i, len(res.Stdout), len(res.Stderr), err)
		}
	}
}

// A listing whose reply would pass the client's frame bound (the glob over 120,000
// entries) comes back truncated and says so; it never fails to decode, and on a loaded
// machine under -race it keeps the client's progress bound (DefaultIdleTimeout) fed: the
// agent streams it as it walks.
func TestListPastTheFrameBoundIsTruncated(t *testing.T) {
	ws, c, _ := agent(t, nil)
	const dirs, files = 120, 1000 // 120,120 entries, ~200 bytes each encoded: past 16 MiB
	name := strings.Repeat("n", 40)
	for d := range dirs {
		dir := filepath.Join(ws, "d"+strconv.Itoa(d))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for f := range files {
			fd, err := unix.Open(filepath.Join(dir, name+strconv.Itoa(f)), unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			unix.Close(fd)
		}
	}
	{
		res, err := c.List(t.Context(), sandbox.ListRequest{Path: sandbox.WorkspaceRoot, Recursive: true})
		if err != nil {
			t.Fatalf("List of %d entries: %v (want a truncated listing)", dirs*files+dirs, err)
		}
		if !res.Truncated {
			t.Fatalf("List returned %d entries and did not say it was truncated", len(res.Entries))
		}
		if n := len(res.Entries); n < 10000 || n >= dirs*files {
			t.Fatalf("List returned %d entries; want many, and fewer than all", n)
		}
		t.Logf("%d of %d entries, truncated", len(res.Entries), dirs*files+dirs)
	}
}
