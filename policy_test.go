//go:build linux

package toolhost

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/audit"
	"github.com/toolhost/toolhost/internal/testenv"
	"github.com/toolhost/toolhost/policy"
)

func TestValidatePluginPolicy(t *testing.T) {
	for _, c := range []struct {
		i      int // 1 editfile: sandbox_files, sandbox_exec, log; 3 screenshot: capture, log
		mutate func(*Plugin)
		want   string
	}{
		{1, func(p *Plugin) { p.Files = &policy.Files{Read: []string{"/etc/**"}} }, "plugins[1]: sandbox_files.read: pattern \"/etc/**\""},
		{3, func(p *Plugin) { p.Exec = &policy.Exec{Programs: []string{"git"}} }, "plugins[3].sandbox_exec: scopes a capability the plugin is not granted"},
		{1, func(p *Plugin) { p.Limits.MemoryMiB = 5000 }, "plugins[1].limits.memory_mib"},
		{1, func(p *Plugin) { p.Limits.CallsPerMinute = -1 }, "plugins[1].limits.calls_per_minute"},
		{3, func(p *Plugin) { p.Secrets = map[string]string{"TOKEN": "env:T"} }, "plugins[3].secrets: secrets reach the commands a plugin runs"},
	} {
		cfg := DefaultConfig()
		c.mutate(&cfg.Plugins[c.i])
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate = %v, want %q", err, c.want)
		}
	}
	cfg := DefaultConfig()
	cfg.Plugins[0].Secrets = map[string]string{"TOKEN": "ghp_actualvalue123"} // bash: sandbox_exec
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "not the value itself") {
		t.Errorf("a secret's value in the config: %v", err)
	}
}

// TestPolicyThroughTheConfig: a docs writer confined to docs/ and a read-only reviewer,
// set in a Config, hold in a session, and audit.file gets a line per call.
func TestPolicyThroughTheConfig(t *testing.T) {
	cfg := testConfig(t)
	cfg.Audit.File = filepath.Join(t.TempDir(), "audit.jsonl")
	cfg.Plugins[1].Files = &policy.Files{Read: []string{"**"}, Write: []string{"docs/**"}}
	cfg.Plugins[1].Limits = PluginLimits{CallTimeout: 2 * time.Second, CallsPerMinute: 100}
	t.Setenv("TOOLHOST_TEST_SECRET", "the-value-of-a-secret")
	cfg.Plugins[0].Secrets = map[string]string{"DEPLOY_TOKEN": "env:TOOLHOST_TEST_SECRET"}
	rec := &audit.Recorder{}
	th := newToolhost(t, cfg, WithAudit(rec))
	s := open(t, th, SessionOptions{}) // a real shell: bash's wrapper needs one
	ctx := context.Background()
	call := func(tool, input string) abi.Result {
		res, err := s.Dispatch(ctx, tool, json.RawMessage(input))
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := call("write_file", `{"path":"docs/a.md","content":"x"}`); res.IsError {
		t.Errorf("docs/a.md: %+v", res)
	}
	res := call("write_file", `{"path":"main.go","content":"x"}`)
	if !res.IsError || !strings.Contains(testenv.ResultText(res), "policy: plugin editfile may not write main.go (allowed: docs/**)") {
		t.Errorf("main.go: %+v", res)
	}
	if res := call("bash", `{"command":"echo $DEPLOY_TOKEN"}`); !strings.Contains(testenv.ResultText(res), "[secret DEPLOY_TOKEN]") || strings.Contains(testenv.ResultText(res), "the-value") {
		t.Errorf("the secret: %q", testenv.ResultText(res))
	}
	if got := th.Plugins()[0].Secrets; len(got) != 1 || got[0] != "DEPLOY_TOKEN" {
		t.Errorf("PluginInfo.Secrets = %v", got)
	}
	if err := th.Close(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(cfg.Audit.File)
	if err != nil {
		t.Fatal(err)
	}
	// Every call a line in both sinks: the three tool calls and the host calls they made
	// (how many depends on the tools: write_file reads before it writes).
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	tools := 0
	for _, r := range rec.Records() {
		if r.Cap == audit.CapTool {
			tools++
		}
	}
	if len(lines) != len(rec.Records()) || tools != 3 || len(lines) <= tools {
		t.Errorf("%d lines in audit.file, %d records in the other sink, %d of them tool calls; want the same count, three tool calls and their host calls:\n%s", len(lines), len(rec.Records()), tools, b)
	}
	if !strings.Contains(string(b), `"decision":"deny"`) || strings.Contains(string(b), "the-value") {
		t.Errorf("audit.file:\n%s", b)
	}
	// A workspace may not hold the audit.
	if err := cfg.CheckWorkspace(filepath.Dir(cfg.Audit.File), ""); err == nil || !strings.Contains(err.Error(), "audit file") {
		t.Errorf("a workspace holding the audit file: %v", err)
	}
}

func TestSecretSources(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "tok"), []byte("from-a-file-1234\n"), 0o600)
	t.Setenv("TOOLHOST_TEST_TOKEN", "from-the-env-1234")
	got, err := secretValues(Plugin{Secrets: map[string]string{"A": "file:" + filepath.Join(dir, "tok"), "B": "env:TOOLHOST_TEST_TOKEN"}})
	if err != nil || got["A"] != "from-a-file-1234" || got["B"] != "from-the-env-1234" {
		t.Errorf("secretValues = %v, %v", got, err)
	}
	if _, err := secretValues(Plugin{Secrets: map[string]string{"A": "env:TOOLHOST_TEST_UNSET_VAR"}}); err == nil || !strings.Contains(err.Error(), "is not set") {
		t.Errorf("an unset variable: %v", err)
	}
	t.Setenv("TOOLHOST_TEST_SHORT", "short")
	if _, err := secretValues(Plugin{Secrets: map[string]string{"A": "env:TOOLHOST_TEST_SHORT"}}); err == nil || !strings.Contains(err.Error(), "shorter than 8") {
		t.Errorf("a short value: %v", err)
	}
}
