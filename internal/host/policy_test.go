package host

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/audit"
	"github.com/toolhost/toolhost/internal/memsandbox"
	"github.com/toolhost/toolhost/internal/policy"
	"github.com/toolhost/toolhost/internal/store/dir"
	"github.com/toolhost/toolhost/internal/testenv"
)

// probeSpec is the probe plugin with every grant, changed by mutate.
func probeHostWith(t *testing.T, mutate func(*PluginSpec), cfg func(*Config)) *Host {
	t.Helper()
	return newProbeHost(t, func(c *Config) {
		mutate(&c.Plugins[0])
		if cfg != nil {
			cfg(c)
		}
	})
}

func TestSecretsNeverShow(t *testing.T) {
	const secret = "s3cr3t-T0KEN-value"
	var logs bytes.Buffer
	rec := &audit.Recorder{}
	var lines bytes.Buffer
	w := audit.NewWriter(&lines)
	h := probeHostWith(t, func(s *PluginSpec) {
		s.Secrets = map[string]string{"API_TOKEN": secret}
	}, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		c.Audit = audit.Tee{rec, w}
	})
	sb := memsandbox.New()
	s := h.OpenSession(sb)

	// The command sees the secret; what it prints reaches the plugin without it.
	res, err := dispatch(t, s, "exec", `{"argv":["sh","-c","echo token=$API_TOKEN"]}`)
	if err != nil || res.IsError || !strings.Contains(testenv.ResultText(res), "token=[secret API_TOKEN]") {
		t.Fatalf("exec = %+v, %v; want the output with the secret replaced", res, err)
	}
	// A command that writes it to a file hands it to the plugin, which logs it, uses it as
	// a path (last_error and the audit see it) and returns it: none of those shows it.
	if res, err := dispatch(t, s, "exec", `{"argv":["sh","-c","echo $API_TOKEN > leak.txt"]}`); err != nil || res.IsError {
		t.Fatal(res, err)
	}
	if got, _ := sb.ReadFile(context.Background(), "/home/user/leak.txt", 0); !strings.Contains(string(got), secret) {
		t.Fatalf("the command did not get the secret: leak.txt = %q", got)
	}
	res, err = dispatch(t, s, "leak", `{"path":"leak.txt"}`)
	if err != nil {
		t.Fatal(err)
	}
	if got := testenv.ResultText(res); strings.Contains(got, secret) || !strings.Contains(got, "read [secret API_TOKEN]") || !strings.Contains(got, "read [secret API_TOKEN]: no such file") {
		t.Errorf("leak result %q: want the secret replaced in it and in the last_error it quotes", got)
	}
	// A plugin that dies printing it: its stderr is quoted in the error and the result.
	res, err = dispatch(t, s, "leak", `{"path":"leak.txt","panic":true}`)
	if !errors.Is(err, ErrPluginFailed) || strings.Contains(err.Error(), secret) || strings.Contains(testenv.ResultText(res), secret) ||
		!strings.Contains(err.Error(), "[secret API_TOKEN]") {
		t.Errorf("a plugin dying with the secret on its stderr: %v; result %q", err, testenv.ResultText(res))
	}
	if err := w.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	for what, b := range map[string]string{"logs": logs.String(), "audit": lines.String()} {
		if strings.Contains(b, secret) {
			t.Errorf("the %s show the secret:\n%s", what, b)
		}
	}
	if !strings.Contains(logs.String(), "the file says [secret API_TOKEN]") {
		t.Errorf("the plugin's log line is missing:\n%s", logs.String())
	}
	if !strings.Contains(lines.String(), `"path":"[secret API_TOKEN]"`) {
		t.Errorf("the audit does not show the redacted path:\n%s", lines.String())
	}
	// The plugin's own environment never holds it.
	for _, r := range rec.Records() {
		if slicesContain(r.Env, "API_TOKEN") {
			t.Errorf("the audit lists the secret among the variables the plugin set: %+v", r)
		}
	}
}

func slicesContain(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func TestSpecChecks(t *testing.T) {
	for _, c := range []struct {
		mutate func(*PluginSpec)
		want   string
	}{
		{func(s *PluginSpec) { s.Secrets = map[string]string{"T": "short"} }, "shorter than 8"},
		{func(s *PluginSpec) { s.Secrets = map[string]string{"1T": "long enough value"} }, "not an environment variable name"},
		{func(s *PluginSpec) {
			s.Grants = []abi.Capability{abi.CapLog, abi.CapSandboxFiles, abi.CapStore}
			s.Secrets = map[string]string{"T": "long enough value"}
		}, "not granted sandbox_exec"},
		{func(s *PluginSpec) {
			s.Grants = []abi.Capability{abi.CapLog, abi.CapSandboxExec, abi.CapSandboxFiles, abi.CapStore}
			s.Scope.Capture = &policy.Capture{Ports: []int{80}}
		}, "scopes capture, which it is not granted"},
		{func(s *PluginSpec) { s.Scope.Files = &policy.Files{Read: []string{"../x"}} }, "sandbox_files.read"},
		{func(s *PluginSpec) { s.MemoryLimitMiB = 5000 }, "memory limit"},
	} {
		spec := PluginSpec{Path: probePath(t), Grants: allGrants}
		c.mutate(&spec)
		_, err := New(context.Background(), Config{DataDir: dataDir, Plugins: []PluginSpec{spec}})
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "probe.wasm") {
			t.Errorf("err = %v, want one naming the plugin and saying %q", err, c.want)
		}
	}
}

func TestRefusalNamesEveryMissingImport(t *testing.T) {
	_, err := New(context.Background(), Config{DataDir: dataDir, Plugins: []PluginSpec{{
		Path: probePath(t), Grants: []abi.Capability{abi.CapLog},
	}}})
	if err == nil {
		t.Fatal("loaded")
	}
	for _, want := range []string{
		`imports toolhost_sandbox_exec.run but is not granted "sandbox_exec"`,
		`imports toolhost_sandbox_files.read, toolhost_sandbox_files.read_text, toolhost_sandbox_files.write but is not granted "sandbox_files"`,
		`imports toolhost_store.get, toolhost_store.list, toolhost_store.put but is not granted "store"`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("the refusal is not one line: %q", err)
	}
}

func TestPluginLimits(t *testing.T) {
	t.Run("call timeout", func(t *testing.T) {
		h := probeHostWith(t, func(s *PluginSpec) { s.CallTimeout = 300 * time.Millisecond }, nil)
		_, err := dispatch(t, h.OpenSession(memsandbox.New()), "spin", `{}`)
		if !errors.Is(err, ErrPluginTimeout) || !strings.Contains(err.Error(), "300ms") {
			t.Errorf("spin: %v, want the plugin's own 300ms budget", err)
		}
	})
	t.Run("memory", func(t *testing.T) {
		// 32 MiB for this plugin, 128 for the host: 64 MiB cannot be had. (Budgets of time
		// no loaded machine misses: a garbage-heavy call under -race at load 20 took over
		// 10 s, and memory is what is tested.)
		h := probeHostWith(t, func(s *PluginSpec) { s.MemoryLimitMiB = 32; s.CallTimeout = 2 * time.Minute }, nil)
		s := h.OpenSession(memsandbox.New())
		if _, err := dispatch(t, s, "garbage", `{"mb":64}`); !errors.Is(err, ErrPluginFailed) {
			t.Errorf("64 MiB under a 32 MiB limit: %v, want a plugin failure", err)
		}
		if res, err := dispatch(t, s, "garbage", `{"mb":4}`); err != nil || res.IsError {
			t.Errorf("4 MiB under a 32 MiB limit: %+v, %v", res, err)
		}
		// A plugin may have more than the host's default.
		h = probeHostWith(t, func(s *PluginSpec) { s.MemoryLimitMiB = 256; s.CallTimeout = 2 * time.Minute }, func(c *Config) { c.MemoryLimitMiB = 32 })
		if res, err := dispatch(t, h.OpenSession(memsandbox.New()), "garbage", `{"mb":64}`); err != nil || res.IsError {
			t.Errorf("64 MiB under the plugin's 256 MiB: %+v, %v", res, err)
		}
	})
	t.Run("calls per minute", func(t *testing.T) {
		rec := &audit.Recorder{}
		h := probeHostWith(t, func(s *PluginSpec) { s.CallsPerMinute = 2 }, func(c *Config) { c.Audit = rec })
		s := h.OpenSession(memsandbox.New())
		for i := range 2 {
			if res, err := dispatch(t, s, "echo", `{"text":"x"}`); err != nil || res.IsError {
				t.Fatalf("call %d: %+v, %v", i, res, err)
			}
		}
		res, err := dispatch(t, s, "echo", `{"text":"x"}`)
		if err != nil || !res.IsError || !strings.Contains(testenv.ResultText(res), "policy: plugin probe may make at most 2 calls a minute; try again in") {
			t.Errorf("third call: %+v, %v", res, err)
		}
		recs := rec.Records()
		if last := recs[len(recs)-1]; last.Decision != audit.Deny || last.Cap != audit.CapTool || last.Why != "calls_per_minute: 2" {
			t.Errorf("the refused call's record: %+v", last)
		}
	})
}

func TestRateLimiterWindow(t *testing.T) {
	l := newRateLimiter(3)
	t0 := time.Unix(1000, 0)
	for i := range 3 {
		if _, ok := l.admit(t0.Add(time.Duration(i) * time.Second)); !ok {
			t.Fatalf("call %d refused", i)
		}
	}
	if wait, ok := l.admit(t0.Add(30 * time.Second)); ok || wait != 30*time.Second {
		t.Errorf("fourth call in the minute: ok %v, wait %s; want a refusal for 30s", ok, wait)
	}
	if _, ok := l.admit(t0.Add(60 * time.Second)); !ok {
		t.Error("the oldest call's minute is over, yet refused")
	}
	if _, ok := l.admit(t0.Add(60*time.Second + 500*time.Millisecond)); ok {
		t.Error("a fourth call within the minute of the second was admitted")
	}
}

func TestStoreReadOnly(t *testing.T) {
	st, err := dir.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	h := probeHostWith(t, func(s *PluginSpec) { s.Scope.Store = &policy.Store{Access: policy.StoreRead} }, func(c *Config) { c.Store = st })
	s := h.OpenSession(memsandbox.New())
	res, _ := dispatch(t, s, "store", `{"op":"put","key":"a.txt","text":"x"}`)
	if !strings.Contains(testenv.ResultText(res), "status -1: policy: plugin probe may not put a.txt: its store is read-only") {
		t.Errorf("put: %q", testenv.ResultText(res))
	}
	res, _ = dispatch(t, s, "store", `{"op":"list","key":""}`)
	if testenv.ResultText(res) != `{"objects":[]}` {
		t.Errorf("list: %q", testenv.ResultText(res))
	}
}

func TestAuditOffCostsNothing(t *testing.T) {
	// With no audit and no scope, a host call allocates nothing for policy or audit.
	h := newProbeHost(t, nil)
	sb := memsandbox.New()
	sb.Put("f.txt", "hello")
	s := h.OpenSession(sb)
	if res, err := dispatch(t, s, "read", `{"path":"f.txt"}`); err != nil || testenv.ResultText(res) != "hello" {
		t.Fatal(res, err)
	}
	if h.audit != nil || h.secrets != nil || h.plugins[0].policy != nil || h.plugins[0].limiter != nil {
		t.Error("an unscoped host without audit or secrets carries policy state")
	}
}

func TestScopedPathDepth(t *testing.T) {
	h := probeHostWith(t, func(s *PluginSpec) {
		s.Scope.Files = &policy.Files{Read: []string{"**", "!**/.env"}}
	}, nil)
	deep := strings.Repeat("d/", 70) + "f.txt"
	res, _ := dispatch(t, h.OpenSession(memsandbox.New()), "read", `{"path":"`+deep+`"}`)
	if !strings.Contains(testenv.ResultText(res), "status -22: read "+deep+" is 71 levels deep, more than the 64") {
		t.Errorf("a 71-level scoped path: %q", testenv.ResultText(res))
	}
}
