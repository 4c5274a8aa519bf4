//go:build linux

package host_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/host"
	"github.com/toolhost/toolhost/internal/testplugins"
	"github.com/toolhost/toolhost/policy"
)

// agentToolsEnv is a host with the built-ins and the agenttools test plugin loaded twice,
// as "alpha" (its writes scoped to docs/**) and "beta", over one local sandbox; it opens
// two sessions on it.
func agentToolsEnv(t *testing.T) (a, b *env) {
	t.Helper()
	p, err := testplugins.Build("internal/host/testdata/agenttools")
	if err != nil {
		t.Fatal(err)
	}
	specs := append([]host.PluginSpec(nil), builtinPlugins(t)...)
	grants := []abi.Capability{abi.CapSandboxFiles, abi.CapSandboxExec}
	specs = append(specs,
		host.PluginSpec{Path: p, Grants: grants, Env: map[string]string{"AGENTTOOLS_NAME": "alpha"},
			Scope: policy.Scope{Files: &policy.Files{Read: []string{"**"}, Write: []string{"docs/**"}}}},
		host.PluginSpec{Path: p, Grants: grants, Env: map[string]string{"AGENTTOOLS_NAME": "beta"}})
	h, err := host.New(context.Background(), host.Config{DataDir: e2eDataDir, Plugins: specs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(context.Background()) })
	sb, ws := newSandbox(t, newProvider(t))
	return &env{t: t, s: h.OpenSession(sb), ws: ws}, &env{t: t, s: h.OpenSession(sb), ws: ws}
}

func jsonArg(kv ...string) string {
	m := map[string]any{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// Session state is per plugin and per session, and bounded.
func TestSessionStateIsolation(t *testing.T) {
	a, other := agentToolsEnv(t)
	a.expect("alpha_set", jsonArg("key", "k", "value", "v1"), false, "ok")
	a.expect("alpha_get", jsonArg("key", "k"), false, "v1")
	a.expect("beta_get", jsonArg("key", "k"), true, "status -2")      // another plugin
	other.expect("alpha_get", jsonArg("key", "k"), true, "status -2") // another session
	a.expect("alpha_set", jsonArg("key", "k", "value", ""), false, "ok")
	a.expect("alpha_get", jsonArg("key", "k"), true, "status -2") // deleted
	a.expect("alpha_set", jsonArg("key", "a b", "value", "v"), true, "status -22")
	a.expect("alpha_set", `{"key":"big","size":1048577}`, true, "status -27", "over the 1048576 limit")
	for i := range 3 {
		a.expect("alpha_set", `{"key":"k`+string(rune('0'+i))+`","size":1048576}`, false, "ok")
	}
	a.expect("alpha_set", `{"key":"k3","size":1048576}`, true, "status -27", "at most 4 MiB")
	a.expect("beta_set", `{"key":"k3","size":1048576}`, false, "ok") // each plugin has its own room
}

// remove is a write: a scoped plugin removes only what it may write, never a directory.
func TestRemoveIsDecidedAsAWrite(t *testing.T) {
	a, _ := agentToolsEnv(t)
	a.expect("write_file", `{"path":"docs/a.md","content":"a"}`, false)
	a.expect("write_file", `{"path":"src/b.go","content":"b"}`, false)
	a.expect("alpha_remove", jsonArg("path", "src/b.go"), true, "status -1", "policy: plugin alpha may not remove src/b.go (allowed: docs/**)")
	a.expect("alpha_remove", jsonArg("path", "docs"), true, "status -21", "is a directory")
	a.expect("alpha_remove", jsonArg("path", "docs/a.md"), false, "removed")
	a.expect("alpha_remove", jsonArg("path", "docs/a.md"), true, "status -2")
	a.expect("beta_remove", jsonArg("path", "../etc/passwd"), true, "status -18")
	a.expect("beta_remove", jsonArg("path", "src/b.go"), false, "removed")
	if _, err := os.Stat(filepath.Join(a.ws, "src/b.go")); !os.IsNotExist(err) {
		t.Errorf("src/b.go is still there: %v", err)
	}
}

// A plugin reaches only the background commands and terminals it started in its session.
func TestProcessesAndTerminalsAreTheirStarters(t *testing.T) {
	a, other := agentToolsEnv(t)
	out := a.expect("bash", `{"command":"sleep 1000","background":true}`, false, "Started in background")
	bg := regexp.MustCompile(`id (bg-[0-9a-f]+)`).FindStringSubmatch(out)[1]
	out = a.expect("exec_command", `{"cmd":"cat","yield_time_ms":500}`, false, "running")
	term := regexp.MustCompile(`session (term-[0-9a-f]+)`).FindStringSubmatch(out)[1]

	a.expect("beta_process", jsonArg("id", bg, "signal", "KILL"), true, "status -2", "no background command of this id was started by this plugin")
	a.expect("beta_terminal", jsonArg("id", term), true, "status -2", "no open terminal of this id")
	other.expect("bash_output", jsonArg("id", bg), true, "there is no background command")
	other.expect("write_stdin", jsonArg("session_id", term, "chars", "x"), true, "there is no open session")
	// The starter still has both, untouched.
	a.expect("bash_output", jsonArg("id", bg), false, "running, pid")
	out = a.expect("write_stdin", jsonArg("session_id", term, "chars", "hello\n"), false, "hello")
	if strings.Count(out, "hello") < 2 { // the terminal's echo, then cat's copy
		t.Errorf("cat did not answer: %q", out)
	}
	a.expect("bash_kill", jsonArg("id", term), false, "killed")
	a.expect("bash_kill", jsonArg("id", bg), false, "stopped")
}
