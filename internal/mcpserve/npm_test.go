package mcpserve

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/internal/screenshot"
	"github.com/toolhost/toolhost/internal/testenv"
)

// npmClient finds node and the official MCP TypeScript SDK installed by
// scripts/setup-mcp-client.sh; without them the test skips, saying so (on CI it fails).
// npmRequestBound bounds one request of the JS client (MCP_REQUEST_TIMEOUT_MS, read by the
// scripts) and npmScriptBound a whole script: hang bounds, not timings.
const (
	npmRequestBound = 5 * time.Minute
	npmScriptBound  = 15 * time.Minute
)

var npmRequestEnv = "MCP_REQUEST_TIMEOUT_MS=" + strconv.FormatInt(npmRequestBound.Milliseconds(), 10)

func npmClient(t *testing.T) (node, dir string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		testenv.Skipf(t, "node is not installed (Node.js >= 20 runs the MCP SDK's client): %v", err)
	}
	pkg, err := os.ReadFile("testdata/npmclient/package.json")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`"@modelcontextprotocol/sdk": "([0-9.]+)"`).FindSubmatch(pkg)
	if m == nil {
		t.Fatal("testdata/npmclient/package.json pins no @modelcontextprotocol/sdk version")
	}
	version := string(m[1])
	dir = os.Getenv("TOOLHOST_MCP_CLIENT_DIR")
	if dir == "" {
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".cache", "toolhost", "mcp-client", version)
	}
	b, err := os.ReadFile(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk", "package.json"))
	if err != nil || !strings.Contains(string(b), `"version": "`+version+`"`) {
		testenv.Skipf(t, "the MCP SDK %s is not installed in %s (run scripts/setup-mcp-client.sh): %v", version, dir, err)
	}
	return node, dir
}

// TestNPMClient: an MCP client no one here wrote, the official TypeScript SDK's (pinned),
// over streamable HTTP with a bearer token: it lists the tools, calls bash, sees an error
// result, and receives a screenshot as image/webp content.
func TestNPMClient(t *testing.T) {
	node, dir := npmClient(t)
	shoot := screenshot.New(screenshot.Config{}).Check() == nil
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		shoot = false
	}
	if !shoot && testenv.CI() {
		t.Fatal("CI=true: the screenshot needs Chromium and /usr/bin/python3")
	}
	s, _ := newServer(t, testConfig(t), Options{Tokens: []Token{{Name: "node", Value: tokenA}}})
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	script, err := filepath.Abs("testdata/npmclient/check.cjs")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), npmScriptBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "TOOLHOST_MCP_CLIENT_DIR=" + dir, npmRequestEnv,
		"MCP_URL=" + srv.URL + "/mcp", "MCP_TOKEN=" + tokenA}
	if shoot {
		cmd.Env = append(cmd.Env, "MCP_SCREENSHOT=1")
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node check.cjs: %v\n%s", err, stderr.String())
	}
	var got struct {
		ProtocolVersion string
		Tools           []string
		BashSchemaType  string
		BashTimeout     map[string]any
		Annotations     map[string]struct {
			Title           string
			ReadOnlyHint    *bool
			DestructiveHint *bool
			IdempotentHint  *bool
			OpenWorldHint   *bool
		}
		OutputSchemas []string
		Bash, Missing struct {
			IsError    bool
			Text       string
			Structured map[string]any
		}
		Grep, GrepFiles, Glob, GlobNone struct {
			IsError    bool
			Text       string
			Structured map[string]any
		}
		Screenshot *struct {
			IsError bool
			Text    string
			Images  []struct {
				MIMEType string
				Bytes    int
				RIFF     string
			}
		}
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	t.Logf("protocol %s, tools %v", got.ProtocolVersion, got.Tools)
	for _, want := range []string{"bash", "read_file", "write_file", "take_screenshot", CommitTool} {
		if !slices.Contains(got.Tools, want) {
			t.Errorf("the npm client does not list %s: %v", want, got.Tools)
		}
	}
	if got.BashSchemaType != "object" {
		t.Errorf("bash's schema type: %q", got.BashSchemaType)
	}
	if got.BashTimeout["maximum"] == nil || got.BashTimeout["default"] == nil {
		t.Errorf("bash's timeout schema has no maximum or default: %v", got.BashTimeout)
	}
	// Titles and hints as a client that knows nothing of toolhost reads them: derived from
	// the plugins' grants (exec: destructive, open world; capture only: read-only).
	type hints struct {
		title                                    string
		readOnly, destructive, idempotent, world bool
	}
	flag := func(p *bool, def bool) bool {
		if p == nil {
			return def // the spec's defaults: destructive and open world when unsaid
		}
		return *p
	}
	for name, want := range map[string]hints{
		"bash":            {"Bash", false, true, false, true},
		"read_file":       {"Read file", false, true, false, true},
		"write_file":      {"Write file", false, true, false, true},
		"grep":            {"Grep", false, true, false, true},
		"take_screenshot": {"Take screenshot", true, false, true, false},
		CommitTool:        {"Commit the workspace", false, false, false, false},
		CheckpointsTool:   {"List checkpoints", true, false, false, false},
		RewindTool:        {"Rewind the workspace", false, true, false, false},
	} {
		a, ok := got.Annotations[name]
		if !ok {
			t.Errorf("the npm client sees no %s", name)
			continue
		}
		var ro bool
		if a.ReadOnlyHint != nil {
			ro = *a.ReadOnlyHint
		}
		have := hints{a.Title, ro, flag(a.DestructiveHint, true), flag(a.IdempotentHint, false), flag(a.OpenWorldHint, true)}
		if have != want {
			t.Errorf("%s as the npm client sees it: %+v, want %+v", name, have, want)
		}
	}
	if got.Bash.IsError || !strings.Contains(got.Bash.Text, "hello from node") {
		t.Errorf("bash: %+v", got.Bash)
	}
	// Structured results beside the text, validated by the client against the schemas.
	for _, want := range []string{"bash", "grep", "glob"} {
		if !slices.Contains(got.OutputSchemas, want) {
			t.Errorf("%s has no outputSchema: %v", want, got.OutputSchemas)
		}
	}
	if b := got.Bash.Structured; fmt.Sprint(b["exit_code"]) != "3" || b["stdout"] != "hello from node\n" || b["stderr"] != "oops\n" {
		t.Errorf("bash's structured result: %v", b)
	}
	matches, _ := got.Grep.Structured["matches"].([]any)
	if got.Grep.Structured["mode"] != "content" || len(matches) != 2 || fmt.Sprint(got.Grep.Structured["total"]) != "2" {
		t.Errorf("grep's structured result: %v", got.Grep.Structured)
	} else if m, _ := matches[0].(map[string]any); m["path"] != "g/one.txt" || fmt.Sprint(m["line"]) != "2" || m["text"] != "needle here" || m["context"] != false {
		t.Errorf("grep's first match: %v", m)
	}
	if f, _ := got.GrepFiles.Structured["files"].([]any); len(f) != 2 || f[0] != "g/one.txt" || f[1] != "g/two.md" {
		t.Errorf("grep files_with_matches' structured result: %v", got.GrepFiles.Structured)
	}
	if p, _ := got.Glob.Structured["paths"].([]any); len(p) != 1 || p[0] != "g/one.txt" || got.Glob.Structured["truncated"] != false {
		t.Errorf("glob's structured result: %v", got.Glob.Structured)
	}
	if p, ok := got.GlobNone.Structured["paths"].([]any); !ok || len(p) != 0 || got.GlobNone.IsError {
		t.Errorf("glob without matches: %+v", got.GlobNone)
	}
	if !got.Missing.IsError || got.Missing.Text == "" {
		t.Errorf("read_file of a missing file: %+v", got.Missing)
	}
	if !shoot {
		t.Log("no screenshot: Chromium or python3 is missing")
		return
	}
	if got.Screenshot == nil || got.Screenshot.IsError || len(got.Screenshot.Images) == 0 {
		t.Fatalf("screenshot: %+v", got.Screenshot)
	}
	for _, im := range got.Screenshot.Images {
		if im.MIMEType != "image/webp" || im.RIFF != "RIFF" || im.Bytes < 100 {
			t.Errorf("image content: %+v", im)
		}
	}
}
