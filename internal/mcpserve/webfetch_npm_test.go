//go:build linux

package mcpserve

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/testhooks"
	"github.com/toolhost/toolhost/internal/testnet"
	"github.com/toolhost/toolhost/policy"
)

// TestNPMClientWebFetch: web_fetch through MCP, driven by the official TypeScript SDK's
// client, on the test's own internet (internal/testnet: network namespaces, TEST-NET
// hosts, its DNS): a page of an allowed domain comes back as Markdown; a domain outside
// the plugin's web scope is refused with the gateway's reason, though it answers (its
// marker never reaches the model).
func TestNPMClientWebFetch(t *testing.T) {
	node, dir := npmClient(t)
	n := testnet.New(t)
	serve := func(name string, h http.HandlerFunc) {
		a, err := n.AddHost(name)
		if err != nil {
			t.Fatal(err)
		}
		l, err := n.Listen("tcp", netip.AddrPortFrom(a, 80).String())
		if err != nil {
			t.Fatal(err)
		}
		n.Serve(l, h)
	}
	serve("docs.test", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, `<html><body><h1>Release notes</h1><p>Version <b>2.0</b> is out.</p><a href="/v2">details</a></body></html>`)
	})
	serve("evil.test", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "EVIL-MARKER") })

	cfg := testConfig(t)
	cfg.Sandbox.Network = toolhost.NetworkEgress
	cfg.Sandbox.Egress.Preset = "none"
	cfg.Sandbox.Egress.Resolver = n.DNS().String()
	cfg.Plugins = append(cfg.Plugins, toolhost.Plugin{
		Path:   "webfetch.wasm",
		Grants: []abi.Capability{abi.CapWeb, abi.CapLog},
		Scope:  policy.Scope{Web: &policy.Web{Preset: "none", Allow: []string{"docs.test"}}},
	})
	th, err := toolhost.New(context.Background(), cfg, toolhost.WithLogger(quietLog()),
		testhooks.EgressNet(n.DialContext, n.HostAddrs()).(toolhost.Option))
	if err != nil {
		t.Fatal(err)
	}
	s := New(th, Options{Tokens: []Token{{Name: "node", Value: tokenA}}, Logger: quietLog()})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		th.Close(ctx)
	})
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	script, err := filepath.Abs("testdata/npmclient/webfetch.cjs")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), npmScriptBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "TOOLHOST_MCP_CLIENT_DIR=" + dir, npmRequestEnv,
		"MCP_URL=" + srv.URL + "/mcp", "MCP_TOKEN=" + tokenA,
		"WEB_URL=http://docs.test/notes", "WEB_REFUSED_URL=http://evil.test/"}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node webfetch.cjs: %v\n%s", err, stderr.String())
	}
	var got struct {
		Tool *struct {
			Title       string
			Annotations struct {
				ReadOnlyHint  bool
				OpenWorldHint *bool
			}
		}
		Web, WebRefused toolReply
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got.Tool == nil || got.Tool.Title != "Web fetch" || !got.Tool.Annotations.ReadOnlyHint ||
		got.Tool.Annotations.OpenWorldHint == nil || !*got.Tool.Annotations.OpenWorldHint {
		t.Errorf("web_fetch as the npm client lists it (want read-only, open world): %+v", got.Tool)
	}
	if got.Web.IsError || !strings.Contains(got.Web.Text, "# Release notes") || !strings.Contains(got.Web.Text, "**2.0**") ||
		!strings.Contains(got.Web.Text, "http://docs.test/v2") {
		t.Errorf("web_fetch of an allowed page: %+v", got.Web)
	}
	if !got.WebRefused.IsError || !strings.Contains(got.WebRefused.Text, "evil.test is not an allowed domain") ||
		strings.Contains(got.WebRefused.Text, "EVIL-MARKER") {
		t.Errorf("web_fetch of a refused domain: %+v", got.WebRefused)
	}
}
