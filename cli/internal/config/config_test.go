package config

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/sandbox/e2b"
	"github.com/toolhost/toolhost/internal/store/s3"
)

func flags(t *testing.T, args ...string) *pflag.FlagSet {
	t.Helper()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parse %v: %v", args, err)
	}
	return fs
}

func writeFile(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDefaults(t *testing.T) {
	l, err := Load(Sources{Flags: flags(t), Environ: []string{}, ConfigHome: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if l.File != "" {
		t.Errorf("File = %q, want none", l.File)
	}
	if !reflect.DeepEqual(l.Config, Default()) {
		t.Errorf("loaded defaults differ:\n got %+v\nwant %+v", l.Config, Default())
	}
}

// TestPrecedence: defaults < file < environment < flags, key by key.
func TestPrecedence(t *testing.T) {
	dir := t.TempDir()
	cfg := writeFile(t, dir, "c.yaml", `
log_level: warn
limits:
  pool_size: 3          # file only
  memory_mib: 64        # file, then env
  call_timeout: 5s      # file, env, then flag
sandbox:
  network: host
`)
	env := []string{
		"TOOLHOST_LIMITS_MEMORY_MIB=96",
		"TOOLHOST_LIMITS__CALL_TIMEOUT=7s", // the double-underscore spelling
		"TOOLHOST_DATA_DIR=/env/data",
		"TOOLHOST_BROWSER_PACKAGE=chromium", // not configuration, but toolhost's: accepted
		"HOME=/home/nobody",
	}
	fs := flags(t, "--config", cfg, "--call-timeout=9s", "--plugins-dir", "/flag/plugins")
	l, err := Load(Sources{Flags: fs, Environ: env, ConfigHome: dir})
	if err != nil {
		t.Fatal(err)
	}
	c := l.Config
	if l.File != cfg {
		t.Errorf("File = %q, want %q", l.File, cfg)
	}
	checks := []struct {
		key       string
		got, want any
	}{
		{"limits.pool_size (file)", c.Limits.PoolSize, 3},
		{"limits.memory_mib (env over file)", c.Limits.MemoryMiB, 96},
		{"limits.call_timeout (flag over env over file)", c.Limits.CallTimeout, 9 * time.Second},
		{"log_level (file)", c.LogLevel, "warn"},
		{"sandbox.network (file)", c.Sandbox.Network, "host"},
		{"data_dir (env)", c.DataDir, "/env/data"},
		{"plugins_dir (flag)", c.PluginsDir, "/flag/plugins"},
		{"limits.exec_timeout_max (default)", c.Limits.ExecTimeoutMax, 600 * time.Second},
		{"plugins (default)", len(c.Plugins), 4},
	}
	for _, ck := range checks {
		if !reflect.DeepEqual(ck.got, ck.want) {
			t.Errorf("%s = %v, want %v", ck.key, ck.got, ck.want)
		}
	}

	// Without the flag the environment wins; without the environment the file does.
	l, err = Load(Sources{Flags: flags(t, "--config", cfg), Environ: env, ConfigHome: dir})
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Limits.CallTimeout; got != 7*time.Second {
		t.Errorf("call_timeout without flag = %s, want 7s (env)", got)
	}
	l, err = Load(Sources{Flags: flags(t, "--config", cfg), Environ: []string{}, ConfigHome: dir})
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Limits.CallTimeout; got != 5*time.Second {
		t.Errorf("call_timeout from file only = %s, want 5s", got)
	}
	// A flag left at its default does not override the file.
	if got := l.LogLevel; got != "warn" {
		t.Errorf("log_level = %q, want the file's warn (unchanged flag must not win)", got)
	}
}

func TestConfigFileLookup(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "toolhost"), 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "toolhost"), DefaultFileName, "log_level: error\n")
	other := writeFile(t, dir, "other.yaml", "log_level: debug\n")
	third := writeFile(t, dir, "third.yaml", "log_level: warn\n")

	// toolhost/toolhost.yaml in the user's configuration directory.
	l, err := Load(Sources{Flags: flags(t), Environ: []string{}, ConfigHome: dir})
	if err != nil {
		t.Fatal(err)
	}
	if l.LogLevel != "error" {
		t.Errorf("user config file: log_level = %q, want error", l.LogLevel)
	}
	// TOOLHOST_CONFIG beats it.
	l, err = Load(Sources{Flags: flags(t), Environ: []string{"TOOLHOST_CONFIG=" + other}, ConfigHome: dir})
	if err != nil {
		t.Fatal(err)
	}
	if l.LogLevel != "debug" || l.File != other {
		t.Errorf("TOOLHOST_CONFIG: log_level = %q file %q, want debug from %s", l.LogLevel, l.File, other)
	}
	// --config beats both.
	l, err = Load(Sources{Flags: flags(t, "--config", third), Environ: []string{"TOOLHOST_CONFIG=" + other}, ConfigHome: dir})
	if err != nil {
		t.Fatal(err)
	}
	if l.LogLevel != "warn" {
		t.Errorf("--config: log_level = %q, want warn", l.LogLevel)
	}
	// A named file that does not exist is an error; the implicit one is optional.
	if _, err := Load(Sources{Flags: flags(t, "--config", filepath.Join(dir, "nope.yaml")), Environ: []string{}}); err == nil {
		t.Error("missing --config file: no error")
	}
}

func TestPluginsFromFile(t *testing.T) {
	dir := t.TempDir()
	cfg := writeFile(t, dir, "c.yaml", `
plugins:
  - path: bash.wasm
    grants: [sandbox_exec, log]
    env:
      TOOLHOST_BASH_MAX_TIMEOUT: 30
  - path: /opt/x.wasm
`)
	l, err := Load(Sources{Flags: flags(t, "--config", cfg), Environ: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	want := []toolhost.Plugin{
		{Path: "bash.wasm", Grants: []abi.Capability{abi.CapSandboxExec, abi.CapLog}, Env: map[string]string{"TOOLHOST_BASH_MAX_TIMEOUT": "30"}},
		{Path: "/opt/x.wasm"},
	}
	if !reflect.DeepEqual(l.Plugins, want) {
		t.Errorf("plugins = %+v, want %+v (the file's list replaces the built-ins)", l.Plugins, want)
	}
}

// TestUnknownVariables: a TOOLHOST_ variable that sets no key is refused like an unknown
// key in the file (a typo would otherwise be silently ignored), naming the variable.
func TestUnknownVariables(t *testing.T) {
	for _, v := range []string{
		"TOOLHOST_SANDBOX_NETWROK=host", // a typo
		"TOOLHOST_BASH_MAX_TIMEOUT=5",   // a plugin's variable: set it in plugins[].env
		"TOOLHOST_SOMETHING_ELSE=",      // even empty
		"TOOLHOST_PLUGINS=bash.wasm",    // plugins has no variable
		"TOOLHOST_LIMITS___POOL_SIZE=4", // neither spelling
	} {
		_, err := Load(Sources{Flags: flags(t), Environ: []string{v}, ConfigHome: t.TempDir()})
		name, _, _ := strings.Cut(v, "=")
		if err == nil || !strings.Contains(err.Error(), name) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: err = %v, want one line naming the variable", v, err)
		}
	}
	// Each key's variable, in both spellings, and toolhost's other variables are fine.
	for _, v := range []string{"TOOLHOST_LIMITS_POOL_SIZE=4", "TOOLHOST_LIMITS__POOL_SIZE=4", "TOOLHOST_SANDBOX_TIMEOUT=2h",
		"TOOLHOST_CONFIG=", "TOOLHOST_BROWSER_PACKAGE=chromium", "TOOLHOST_BENCH_DIR=/tmp"} {
		if _, err := Load(Sources{Flags: flags(t), Environ: []string{v}, ConfigHome: t.TempDir()}); err != nil {
			t.Errorf("%s: %v", v, err)
		}
	}
}

// TestBadConfig: every bad value gives one line that names the key.
func TestBadConfig(t *testing.T) {
	cases := []struct {
		name    string
		yaml    string
		env     []string
		args    []string
		wantKey string
	}{
		{name: "unknown key", yaml: "limits:\n  memry_mib: 3\n", wantKey: "limits.memry_mib"},
		{name: "unknown top key", yaml: "sandbx: {network: host}\n", wantKey: "sandbx.network"},
		{name: "not an int", yaml: "limits:\n  pool_size: lots\n", wantKey: "limits.pool_size"},
		{name: "bare duration", yaml: "limits:\n  call_timeout: 10\n", wantKey: "limits.call_timeout"},
		{name: "bad duration", yaml: "session:\n  ttl: soon\n", wantKey: "session.ttl"},
		{name: "bad duration, older name", yaml: "sandbox:\n  timeout: soon\n", wantKey: "session.ttl"},
		{name: "both names", yaml: "sandbox:\n  timeout: 1h\nsession:\n  ttl: 2h\n", wantKey: "sandbox.timeout"},
		{name: "project", args: []string{"--project", "../etc"}, wantKey: "project"},
		{name: "project empty", yaml: "project: \"\"\n", wantKey: "project"},
		{name: "store kind", env: []string{"TOOLHOST_STORE_KIND=gcs"}, wantKey: "store.kind"},
		{name: "s3 bucket", yaml: "store:\n  kind: s3\n", wantKey: "store.s3.bucket"},
		{name: "s3 endpoint", yaml: "store:\n  s3:\n    endpoint: localhost:9000\n", wantKey: "store.s3.endpoint"},
		{name: "s3 checksums", args: []string{"--s3-checksums", "never"}, wantKey: "store.s3.checksums"},
		{name: "s3 path style", env: []string{"TOOLHOST_STORE_S3_PATH_STYLE=maybe"}, wantKey: "store.s3.path_style"},
		{name: "public base", yaml: "store:\n  public_base: cdn.example.com\n", wantKey: "store.public_base"},
		{name: "keep", args: []string{"--snapshot-keep", "0"}, wantKey: "snapshot.keep"},
		{name: "excludes", env: []string{"TOOLHOST_SNAPSHOT_EXCLUDES=node_modules,src/gen"}, wantKey: "snapshot.excludes"},
		{name: "retries", yaml: "snapshot:\n  retries: -1\n", wantKey: "snapshot.retries"},
		{name: "margin", args: []string{"--session-ttl", "10m", "--keepalive-margin", "10m"}, wantKey: "session.keepalive_margin"},
		{name: "max lifetime", env: []string{"TOOLHOST_SESSION_MAX_LIFETIME=30m"}, wantKey: "session.max_lifetime"},
		{name: "screenshot port", args: []string{"--screenshot-port", "70000"}, wantKey: "screenshot.port"},
		{name: "idle wait", yaml: "screenshot:\n  idle_wait: 0s\n", wantKey: "screenshot.idle_wait"},
		{name: "chromium", env: []string{"TOOLHOST_SCREENSHOT_CHROMIUM=chromium"}, wantKey: "screenshot.chromium"},
		{name: "enabled", yaml: "screenshot:\n  enabled: sometimes\n", wantKey: "screenshot.enabled"},
		{name: "network", env: []string{"TOOLHOST_SANDBOX_NETWORK=bridge"}, wantKey: "sandbox.network"},
		{name: "memory", args: []string{"--memory-mib", "0"}, wantKey: "limits.memory_mib"},
		{name: "pool", env: []string{"TOOLHOST_LIMITS_POOL_SIZE=0"}, wantKey: "limits.pool_size"},
		{name: "log level", yaml: "log_level: loud\n", wantKey: "log_level"},
		{name: "exec max below default", args: []string{"--exec-timeout", "2m", "--exec-timeout-max", "1m"}, wantKey: "limits.exec_timeout_max"},
		{name: "grant", yaml: "plugins:\n  - path: a.wasm\n    grants: [root]\n", wantKey: "plugins[0].grants"},
		{name: "plugin key", yaml: "plugins:\n  - path: a.wasm\n    grantz: [log]\n", wantKey: "plugins[0]"},
		{name: "plugin path", yaml: "plugins:\n  - grants: [log]\n", wantKey: "plugins[0].path"},
		{name: "yaml syntax", yaml: "limits: [\n", wantKey: "c.yaml"},
		{name: "section not a map", yaml: "limits: 5\n", wantKey: "limits: must be a mapping of memory_mib"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			args := tc.args
			if tc.yaml != "" {
				args = append([]string{"--config", writeFile(t, dir, "c.yaml", tc.yaml)}, args...)
			}
			env := tc.env
			if env == nil {
				env = []string{}
			}
			_, err := Load(Sources{Flags: flags(t, args...), Environ: env, ConfigHome: dir})
			if err == nil {
				t.Fatal("no error")
			}
			msg := err.Error()
			t.Logf("%s", msg)
			if strings.Contains(msg, "\n") {
				t.Errorf("error spans lines: %q", msg)
			}
			if !strings.Contains(msg, tc.wantKey) {
				t.Errorf("error %q does not name %q", msg, tc.wantKey)
			}
		})
	}
}

var update = flag.Bool("update", false, "rewrite toolhost.example.yaml and docs/CONFIG.md from the key table")

// TestExampleFile: toolhost.example.yaml at the repository root is what the key table
// generates (go test -run TestExampleFile -update rewrites it), it loads, and it says the
// defaults.
func TestExampleFile(t *testing.T) {
	path := filepath.Join("..", "..", "..", "toolhost.example.yaml")
	want := Example()
	if *update {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	body, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(body) != string(want) {
		t.Errorf("toolhost.example.yaml is not what the key table generates: run go test ./cli/internal/config -run TestExampleFile -update")
	}
	l, err := Load(Sources{Flags: flags(t, "--config", path), Environ: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(l.Config, Default()) {
		t.Errorf("toolhost.example.yaml differs from the defaults:\n file %+v\n code %+v", l.Config, Default())
	}
	// Every key is in it, with its variable (the keys only a file sets have none).
	for _, k := range toolhost.ConfigKeys() {
		leaf := k.Name[strings.LastIndex(k.Name, ".")+1:]
		if !strings.Contains(string(body), "\n"+leaf+":") && !strings.Contains(string(body), " "+leaf+":") {
			t.Errorf("toolhost.example.yaml does not mention %s", k.Name)
		}
		if k.Env != "" && !strings.Contains(string(body), k.Env) {
			t.Errorf("toolhost.example.yaml does not name the variable %s", k.Env)
		}
	}
}

// TestProjectKeys: the keys of snapshots, sessions and screenshots go through the same
// layers as the others.
func TestProjectKeys(t *testing.T) {
	dir := t.TempDir()
	cfg := writeFile(t, dir, "c.yaml", `
project: from-file
store:
  kind: s3
  public_base: https://cdn.example.com
  s3:
    bucket: snaps
    endpoint: http://127.0.0.1:7070
    path_style: true
    checksums: when_required
snapshot:
  keep: 9
  excludes: [node_modules, target]
session:
  ttl: 2h
screenshot:
  port: 3000
`)
	env := []string{
		"TOOLHOST_PROJECT=from-env",
		"TOOLHOST_SNAPSHOT_EXCLUDES=vendor, .cache",
		"TOOLHOST_SESSION_KEEPALIVE_MARGIN=7m",
		"TOOLHOST_SCREENSHOT_ENABLED=false",
		"TOOLHOST_STORE_S3_REGION=eu-west-1",
	}
	fs := flags(t, "--config", cfg, "--project", "from-flag", "--snapshot-retries", "1", "--chromium", "/opt/chromium")
	l, err := Load(Sources{Flags: fs, Environ: env, ConfigHome: dir})
	if err != nil {
		t.Fatal(err)
	}
	c := l.Config
	checks := []struct {
		key       string
		got, want any
	}{
		{"project (flag over env over file)", c.Project, "from-flag"},
		{"store.kind (file)", c.Store.Kind, "s3"},
		{"store.s3 (file)", *sectionOf(toolhost.ModuleConfig[s3.Section](&c, "s3")), s3.Section{Bucket: "snaps", Region: "eu-west-1", Endpoint: "http://127.0.0.1:7070", PathStyle: true, Checksums: "when_required"}},
		{"store.public_base (file)", c.Store.PublicBase, "https://cdn.example.com"},
		{"snapshot.keep (file)", c.Snapshot.Keep, 9},
		{"snapshot.excludes (env list over file)", c.Snapshot.Excludes, []string{"vendor", ".cache"}},
		{"snapshot.retries (flag)", c.Snapshot.Retries, 1},
		{"session.ttl (file)", c.Session.TTL, 2 * time.Hour},
		{"session.keepalive_margin (env)", c.Session.KeepaliveMargin, 7 * time.Minute},
		{"session.max_lifetime (default)", c.Session.MaxLifetime, 24 * time.Hour},
		{"screenshot.enabled (env)", c.Screenshot.Enabled, false},
		{"screenshot.port (file)", c.Screenshot.Port, 3000},
		{"screenshot.chromium (flag)", c.Screenshot.Chromium, "/opt/chromium"},
	}
	for _, ck := range checks {
		if !reflect.DeepEqual(ck.got, ck.want) {
			t.Errorf("%s = %#v, want %#v", ck.key, ck.got, ck.want)
		}
	}

	// The flag form of a list, and the file's list without the environment.
	l, err = Load(Sources{Flags: flags(t, "--config", cfg), Environ: []string{}, ConfigHome: dir})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"node_modules", "target"}; !reflect.DeepEqual(l.Snapshot.Excludes, want) {
		t.Errorf("snapshot.excludes from the file = %q, want %q", l.Snapshot.Excludes, want)
	}
	l, err = Load(Sources{Flags: flags(t, "--snapshot-excludes", "a,b"), Environ: []string{}, ConfigHome: dir})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a", "b"}; !reflect.DeepEqual(l.Snapshot.Excludes, want) {
		t.Errorf("snapshot.excludes from the flag = %q, want %q", l.Snapshot.Excludes, want)
	}
	// An empty list in the file excludes nothing.
	empty := writeFile(t, dir, "e.yaml", "snapshot:\n  excludes: []\n")
	l, err = Load(Sources{Flags: flags(t, "--config", empty), Environ: []string{}, ConfigHome: dir})
	if err != nil {
		t.Fatal(err)
	}
	if l.Snapshot.Excludes == nil || len(l.Snapshot.Excludes) != 0 {
		t.Errorf("snapshot.excludes: [] = %#v, want an empty non-nil list", l.Snapshot.Excludes)
	}
}

// TestOlderSessionNames: sandbox.timeout and sandbox.max_lifetime, the names from before
// sessions, still set session.ttl and session.max_lifetime in every layer.
func TestOlderSessionNames(t *testing.T) {
	dir := t.TempDir()
	cfg := writeFile(t, dir, "c.yaml", "sandbox:\n  network: none\n  timeout: 2h\n  max_lifetime: 48h\n")
	l, err := Load(Sources{Flags: flags(t, "--config", cfg), Environ: []string{}, ConfigHome: dir})
	if err != nil {
		t.Fatal(err)
	}
	if l.Session.TTL != 2*time.Hour || l.Session.MaxLifetime != 48*time.Hour {
		t.Errorf("file: session = %+v, want ttl 2h, max_lifetime 48h", l.Session)
	}
	l, err = Load(Sources{Flags: flags(t, "--config", cfg), Environ: []string{"TOOLHOST_SANDBOX_TIMEOUT=3h"}, ConfigHome: dir})
	if err != nil {
		t.Fatal(err)
	}
	if l.Session.TTL != 3*time.Hour {
		t.Errorf("env TOOLHOST_SANDBOX_TIMEOUT: ttl = %s, want 3h", l.Session.TTL)
	}
	l, err = Load(Sources{Flags: flags(t, "--config", cfg, "--sandbox-timeout", "4h"), Environ: []string{"TOOLHOST_SESSION_TTL=3h"}, ConfigHome: dir})
	if err != nil {
		t.Fatal(err)
	}
	if l.Session.TTL != 4*time.Hour {
		t.Errorf("flag --sandbox-timeout: ttl = %s, want 4h", l.Session.TTL)
	}
}

// A toolhost.yaml in the working directory is never read: the CLI mounts directories as
// sandbox workspaces, and what a sandbox can write must not configure the host.
func TestWorkingDirectoryFileIsNotRead(t *testing.T) {
	wd := t.TempDir()
	writeFile(t, wd, DefaultFileName, "sandbox:\n  network: host\nscreenshot:\n  chromium: /home/user/evil\n")
	t.Chdir(wd)
	l, err := Load(Sources{Flags: flags(t), Environ: []string{}, ConfigHome: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if l.File != "" || l.Sandbox.Network != "egress" || l.Screenshot.Chromium != "" {
		t.Fatalf("the working directory's toolhost.yaml was read: file %q, network %q, chromium %q", l.File, l.Sandbox.Network, l.Screenshot.Chromium)
	}
}

// TestE2BKeys: the e2b keys through the layers: lists and mappings from the file only, the
// API key from a variable and never a flag, and never shown.
func TestE2BKeys(t *testing.T) {
	dir := t.TempDir()
	cfg := writeFile(t, dir, "c.yaml", `
sandbox:
  provider: e2b, local
e2b:
  domain: e2b.internal.example.com
  plan: pro
  templates:
    - id: team-dev
      cpu_count: 4
      memory_mb: 4096
  metadata:
    team: web
    cost_center: "42"
`)
	env := []string{"TOOLHOST_E2B_API_KEY=e2b_not_so_secret_0123456789", "TOOLHOST_E2B_REQUEST_TIMEOUT=30s"}
	l, err := Load(Sources{Flags: flags(t, "--config", cfg, "--e2b-cpu-count", "4"), Environ: env, ConfigHome: dir})
	if err != nil {
		t.Fatal(err)
	}
	sec := sectionOf(toolhost.ModuleConfig[e2b.Section](&l.Config, "e2b"))
	e := *sec
	want := e2b.Section{
		APIKey: "e2b_not_so_secret_0123456789", Domain: "e2b.internal.example.com", Plan: "pro", CPUCount: 4,
		Templates:      []e2b.SectionTemplate{{ID: "team-dev", CPUCount: 4, MemoryMB: 4096}},
		Metadata:       map[string]string{"team": "web", "cost_center": "42"},
		RequestTimeout: 30 * time.Second, ConnectTimeout: 10 * time.Second,
	}
	if !reflect.DeepEqual(e, want) {
		t.Errorf("e2b = %#v\nwant %#v", e, want)
	}
	if got := toolhost.ProviderNamesOf(l.Sandbox.Provider); !reflect.DeepEqual(got, []string{"e2b", "local"}) {
		t.Errorf("providers %v", got)
	}
	// The key never shows, however the configuration or its section is printed.
	var logged strings.Builder
	slog.New(slog.NewTextHandler(&logged, nil)).Info("config", "e2b", *sec, "key", sec.APIKey)
	for _, shown := range []string{fmt.Sprint(*sec), fmt.Sprintf("%+v", *sec), fmt.Sprintf("%#v", *sec),
		fmt.Sprintf("%q", sec.APIKey), logged.String(), string(must(json.Marshal(*sec)))} {
		if strings.Contains(shown, "not_so_secret") || !strings.Contains(shown, "[redacted]") {
			t.Errorf("the API key shows, or its redaction does not: %s", shown)
		}
	}
	for _, shown := range []string{fmt.Sprint(l.Config), fmt.Sprintf("%+v", l.Config), fmt.Sprintf("%#v", l.Config), string(must(json.Marshal(l.Config)))} {
		if strings.Contains(shown, "not_so_secret") {
			t.Errorf("the API key shows in the whole configuration: %s", shown)
		}
	}

	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"a mapping from a variable", []string{"TOOLHOST_E2B_METADATA=team=web"}, nil, "TOOLHOST_E2B_METADATA is not a toolhost variable"},
		{"an unknown provider in a list", []string{"TOOLHOST_SANDBOX_PROVIDER=e2b,lokal"}, nil, `unknown provider "lokal"`},
		{"a provider twice", []string{"TOOLHOST_SANDBOX_PROVIDER=local,e2b,local"}, nil, `"local" is listed twice`},
		{"an unknown plan", []string{"TOOLHOST_E2B_PLAN=enterprise"}, nil, "e2b.plan"},
		{"a URL for a domain", []string{"TOOLHOST_E2B_DOMAIN=https://e2b.app"}, nil, "e2b.domain"},
		{"a margin past the plan", []string{"TOOLHOST_SANDBOX_PROVIDER=e2b", "TOOLHOST_E2B_MAX_LIFETIME=4m"}, nil, "session.keepalive_margin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(Sources{Flags: flags(t, tc.args...), Environ: tc.env, ConfigHome: t.TempDir()})
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %v, want one line with %q", err, tc.want)
			}
		})
	}
	// A secret has no flag: a command line is visible to every user of the machine.
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	RegisterFlags(fs)
	if err := fs.Parse([]string{"--e2b-api-key", "e2b_x"}); err == nil {
		t.Error("--e2b-api-key is a flag")
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestReference: docs/CONFIG.md is what the key table generates (go test -run
// TestReference -update rewrites it), and it has a heading for every key.
func TestReference(t *testing.T) {
	path := filepath.Join("..", "..", "..", "docs", "CONFIG.md")
	want := Reference()
	if *update {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	body, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(body) != string(want) {
		t.Errorf("docs/CONFIG.md is not what the key table generates: run go test ./cli/internal/config -run TestReference -update")
	}
	for _, k := range toolhost.ConfigKeys() {
		if !strings.Contains(string(body), "\n### `"+k.Name+"`\n") {
			t.Errorf("docs/CONFIG.md has no heading for %s", k.Name)
		}
		if k.Env != "" && !strings.Contains(string(body), k.Env) {
			t.Errorf("docs/CONFIG.md does not name the variable %s", k.Env)
		}
	}
}

// The egress keys through the layers: lists from a variable (comma-separated, ports as
// numbers) and a flag, the inject list and a token's narrowing from the file only.
func TestEgressKeys(t *testing.T) {
	dir := t.TempDir()
	file := writeFile(t, dir, "c.yaml", "sandbox:\n  egress:\n    inject:\n      - {domain: registry.npmjs.org, header: Authorization, secret: env:NPM_AUTH}\nserve:\n  tokens:\n    - {token: 0123456789abcdef0123, egress: {allow: [registry.npmjs.org]}}\n")
	l, err := Load(Sources{Flags: flags(t, "--egress-deny", "bad.test,*.worse.test", "--config", file),
		Environ: []string{"TOOLHOST_SANDBOX_EGRESS_PORTS=80,443,8443", "TOOLHOST_SANDBOX_EGRESS_ALLOW=a.test,*.b.test"}, ConfigHome: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	e := l.Sandbox.Egress
	if l.Sandbox.Network != "egress" || e.Preset != "registries" || !slices.Equal(e.Ports, []int{80, 443, 8443}) ||
		!slices.Equal(e.Allow, []string{"a.test", "*.b.test"}) || !slices.Equal(e.Deny, []string{"bad.test", "*.worse.test"}) ||
		len(e.Inject) != 1 || e.Inject[0].Secret != "env:NPM_AUTH" {
		t.Errorf("egress keys: network %q %+v", l.Sandbox.Network, e)
	}
	if tok := l.Serve.Tokens; len(tok) != 1 || tok[0].Egress == nil || !slices.Equal(tok[0].Egress.Allow, []string{"registry.npmjs.org"}) {
		t.Errorf("serve.tokens[0].egress: %+v", tok)
	}
	if err := l.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	l.Sandbox.Egress.Allow = []string{"a test"}
	if err := l.Validate(); err == nil || !strings.Contains(err.Error(), "sandbox.egress.allow") {
		t.Errorf("a bad allow entry: %v", err)
	}
	l.Sandbox.Egress.Allow = nil
	l.Sandbox.Network = "none"
	if err := l.Validate(); err == nil || !strings.Contains(err.Error(), "serve.tokens[0].egress") {
		t.Errorf("a token's egress without network egress: %v", err)
	}
}

// sectionOf is a module's configuration that the test's build registers.
func sectionOf[C any](c *C, ok bool) *C {
	if !ok {
		panic("no such module in this build")
	}
	return c
}
