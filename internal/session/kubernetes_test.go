//go:build k8s

package session_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/internal/sandbox/kubernetes"
	"github.com/toolhost/toolhost/internal/screenshot"
	"github.com/toolhost/toolhost/internal/session"
	"github.com/toolhost/toolhost/internal/session/sessiontest"
	"github.com/toolhost/toolhost/internal/testenv"
)

// TestKubernetesSeedFlow is the seed's flow on the kubernetes provider, on the cluster
// make test-k8s brings up (TOOLHOST_TEST_K8S_DIR): the agent writes a page, serves it in
// the background, the page is previewed and shot through the agent, edited, the sandbox
// is rotated (a remote provider restores the snapshot into a new Sandbox, and the server
// is started again there), committed, and a new session wakes from the snapshot.
func TestKubernetesSeedFlow(t *testing.T) {
	dir := os.Getenv("TOOLHOST_TEST_K8S_DIR")
	if dir == "" {
		testenv.Skipf(t, "no test cluster: TOOLHOST_TEST_K8S_DIR is not set (make test-k8s brings one up and sets it)")
	}
	ref, err := os.ReadFile(filepath.Join(dir, "images", "agent.ref"))
	if err != nil {
		t.Fatal(err)
	}
	kp, err := kubernetes.New(kubernetes.Config{
		Kubeconfig: filepath.Join(dir, "pki", "toolhost.kubeconfig"), Namespace: "toolhost",
		Image: strings.TrimSpace(string(ref)), ImagePullPolicy: "Never",
		NetworkPolicy: true, RequestRatio: 0.01, Limits: kubernetes.Limits{MemoryBytes: 512 << 20, CPUs: 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	clk := sessiontest.NewClock(time.Now())
	logs := &logBuf{}
	cfg := session.Config{
		Provider: &sessiontest.Provider{Inner: kp, Clock: clk, MaxLifetime: 10 * time.Minute}, Clock: clk,
		ProjectID: "k8s-seed", Snapshots: snapshots(t),
		TTL: 10 * time.Minute, MaxLifetime: 10 * time.Minute, KeepaliveMargin: 2 * time.Minute, RetryInterval: 10 * time.Second,
		RestoreOnRotate: true,
		Logger:          slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	s := open(t, cfg)
	hs := toolHost(t).OpenSession(s)
	ctx := context.Background()
	call := func(tool string, in map[string]any) string {
		t.Helper()
		b, _ := json.Marshal(in)
		res, err := hs.Dispatch(ctx, tool, b)
		if err != nil || res.IsError {
			t.Fatalf("%s %s: %q %v\n%s", tool, b, testenv.ResultText(res), err, logs)
		}
		return testenv.ResultText(res)
	}
	const port = 8080
	served := func(want string) {
		t.Helper()
		client := &http.Client{Timeout: 10 * time.Second}
		var body string
		if !testenv.Eventually(func() bool {
			u, err := s.PreviewURL(ctx, port)
			if err != nil {
				return false
			}
			resp, err := client.Get(u.String() + "index.html")
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			body = string(b)
			return strings.Contains(body, want)
		}) {
			t.Fatalf("the preview never served %q (last %q)\n%s", want, body, logs)
		}
	}

	call("write_file", map[string]any{"path": "web/index.html", "content": "<h1 style=\"color:#00ff00\">v1</h1>\n"})
	call("bash", map[string]any{"command": "cd web && exec python3 -m http.server " + "8080", "background": true})
	served("v1")
	if c := screenshot.New(screenshot.Config{}); c.Check() == nil {
		u, err := s.PreviewURL(ctx, port)
		if err != nil {
			t.Fatal(err)
		}
		shot, err := c.Capture(ctx, u, "/index.html", screenshot.Desktop)
		if err != nil || shot.Status != http.StatusOK || len(shot.WebP) == 0 {
			t.Errorf("a screenshot of the preview: %v %+v", err, shot)
		}
		c.Close(ctx)
	} else {
		t.Log("no browser here: the page is fetched, not shot")
	}
	call("read_file", map[string]any{"path": "web/index.html"})
	call("edit_file", map[string]any{"path": "web/index.html", "old_string": "v1", "new_string": "v2"})
	served("v2")

	// Past the keepalive margin of a sandbox that cannot be extended: the next call
	// rotates, restoring the snapshot into a new Sandbox and starting the server again.
	first := s.SandboxID()
	clk.Advance(9 * time.Minute)
	if out := call("bash", map[string]any{"command": "cat web/index.html"}); !strings.Contains(out, "v2") {
		t.Errorf("after the rotation the page reads %q", out)
	}
	if s.Rotations() != 1 || s.SandboxID() == first {
		t.Fatalf("rotations %d, sandbox %s (was %s)\n%s", s.Rotations(), s.SandboxID(), first, logs)
	}
	served("v2")
	if _, err := s.Commit(ctx, "seed"); err != nil {
		t.Fatal(err)
	}
	s.Close(ctx)

	cfg.Clock, cfg.Provider = nil, kp
	s2 := open(t, cfg)
	if b, err := s2.ReadFile(ctx, "/home/user/web/index.html", 0); err != nil || !strings.Contains(string(b), "v2") {
		t.Errorf("the woken session reads %q, %v; want the edited page", b, err)
	}
}
