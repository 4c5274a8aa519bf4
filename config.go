package toolhost

import (
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/host"
	policyengine "github.com/toolhost/toolhost/internal/policy"
	"github.com/toolhost/toolhost/internal/sandbox/e2b"
	"github.com/toolhost/toolhost/internal/snapshot"
	"github.com/toolhost/toolhost/policy"
)

// Config is toolhost's whole configuration: what the CLI reads from its YAML file,
// TOOLHOST_ variables and flags, and what a program fills to embed toolhost. Start from
// DefaultConfig and change what differs: a zero value means zero (and Validate refuses the
// zeros that make no sense), never "the default".
//
// Each field is one key of the configuration (its tag names it); what every key means,
// its default, variable and flag are in one table, ConfigKeys, which toolhost.example.yaml
// is generated from.
type Config struct {
	DataDir    string           `key:"data_dir"`
	PluginsDir string           `key:"plugins_dir"`
	Plugins    []Plugin         `key:"plugins"`
	Project    string           `key:"project"`
	Store      StoreConfig      `key:"store"`
	Snapshot   SnapshotConfig   `key:"snapshot"`
	Session    SessionConfig    `key:"session"`
	Lease      LeaseConfig      `key:"lease"`
	Screenshot ScreenshotConfig `key:"screenshot"`
	Sandbox    SandboxConfig    `key:"sandbox"`
	E2B        E2BConfig        `key:"e2b"`
	Limits     LimitsConfig     `key:"limits"`
	Audit      AuditConfig      `key:"audit"`
	Serve      ServeConfig      `key:"serve"`
	LogLevel   string           `key:"log_level"`
	LogFormat  string           `key:"log_format"`
}

// Plugin is one plugin to load (an entry of the plugins key).
type Plugin struct {
	// Path of the .wasm file. An absolute path is that file; a relative one resolves
	// against plugins_dir, or, when plugins_dir is empty, names a built-in plugin
	// (bash.wasm, editfile.wasm, grepglob.wasm, screenshot.wasm: embedded in the binary).
	Path string `key:"path"`
	// Grants are the capabilities the plugin may import.
	Grants []abi.Capability `key:"grants"`
	// Env is the plugin's configuration, visible to it as environment variables.
	Env map[string]string `key:"env"`
	// Scope narrows the grants: the paths it may read and write (sandbox_files), the
	// programs it may run (sandbox_exec), its store's access, the ports it may capture.
	// Each is optional; left out, a grant reaches everything it can (policy.Scope).
	policy.Scope `key:",squash"`
	// Limits are the plugin's own; zero values take limits.*.
	Limits PluginLimits `key:"limits"`
	// Secrets name the variables the commands the plugin runs get, and where each value
	// comes from: "env:VAR" (a variable of the toolhost process) or "file:/abs/path" (the
	// file's contents, less a final newline). Never a value itself: a config file holds no
	// secret. Values never appear in results, logs or the audit.
	Secrets map[string]string `key:"secrets"`
}

// PluginLimits are the limits of one plugin (an entry's limits key).
type PluginLimits struct {
	// MemoryMiB caps each instance's linear memory (1 to 4096); 0: limits.memory_mib.
	MemoryMiB int `key:"memory_mib"`
	// CallTimeout is the deadline for its own work per call; 0: limits.call_timeout.
	CallTimeout time.Duration `key:"call_timeout"`
	// CallsPerMinute bounds the tool calls into it in any minute; 0: no bound.
	CallsPerMinute int `key:"calls_per_minute"`
}

// AuditConfig is the audit.* keys.
type AuditConfig struct {
	File string `key:"file"`
}

// StoreConfig is the store.* keys: the object store of snapshots and screenshots.
type StoreConfig struct {
	Kind       string   `key:"kind"`
	Dir        string   `key:"dir"`
	PublicBase string   `key:"public_base"`
	S3         S3Config `key:"s3"`
}

// S3Config is the store.s3.* keys.
type S3Config struct {
	Bucket       string `key:"bucket"`
	Region       string `key:"region"`
	Endpoint     string `key:"endpoint"`
	PathStyle    bool   `key:"path_style"`
	CreateBucket bool   `key:"create_bucket"`
	Checksums    string `key:"checksums"`
}

// SnapshotConfig is the snapshot.* keys.
type SnapshotConfig struct {
	Keep     int      `key:"keep"`
	Excludes []string `key:"excludes"`
	Retries  int      `key:"retries"`
}

// SessionConfig is the session.* keys: the lifetime policy of a session's sandboxes.
type SessionConfig struct {
	TTL             time.Duration `key:"ttl"`
	KeepaliveMargin time.Duration `key:"keepalive_margin"`
	LastCallMargin  time.Duration `key:"last_call_margin"`
	MaxLifetime     time.Duration `key:"max_lifetime"`
}

// LeaseConfig is the lease.* keys: the project lease that keeps two hosts sharing a store
// from running one project at once (package internal/lease).
type LeaseConfig struct {
	Enabled bool          `key:"enabled"`
	TTL     time.Duration `key:"ttl"`
	Renew   time.Duration `key:"renew"`
}

// ScreenshotConfig is the screenshot.* keys.
type ScreenshotConfig struct {
	Enabled  bool          `key:"enabled"`
	Port     int           `key:"port"`
	IdleWait time.Duration `key:"idle_wait"`
	Chromium string        `key:"chromium"`
}

// SandboxConfig is the sandbox.* keys: the provider and what each sandbox may use.
type SandboxConfig struct {
	Provider     string  `key:"provider"`
	Network      string  `key:"network"`
	MemoryMiB    int64   `key:"memory_mib"`
	Processes    int64   `key:"processes"`
	CPUs         float64 `key:"cpus"`
	TmpMiB       int64   `key:"tmp_mib"`
	ShmMiB       int64   `key:"shm_mib"`
	DiskMiB      int64   `key:"disk_mib"`
	OpenFiles    int64   `key:"open_files"`
	HostUID      int     `key:"host_uid"`
	RunDir       string  `key:"run_dir"`
	WorkspaceDir string  `key:"workspace_dir"`
}

// E2BConfig is the e2b.* keys: the E2B provider (sandbox.provider: e2b, alone or in a
// list). Empty strings take the variables E2B's official SDKs read (E2B_API_KEY,
// E2B_DOMAIN, E2B_API_URL, E2B_SANDBOX_URL), then E2B's defaults.
type E2BConfig struct {
	APIKey            Secret            `key:"api_key"`
	Domain            string            `key:"domain"`
	APIURL            string            `key:"api_url"`
	SandboxURL        string            `key:"sandbox_url"`
	Template          string            `key:"template"`
	Templates         []E2BTemplate     `key:"templates"`
	CPUCount          int               `key:"cpu_count"`
	MemoryMB          int               `key:"memory_mb"`
	Plan              string            `key:"plan"`
	MaxLifetime       time.Duration     `key:"max_lifetime"`
	MonthlyCPUMinutes float64           `key:"monthly_cpu_minutes"`
	PrivatePreviews   bool              `key:"private_previews"`
	Metadata          map[string]string `key:"metadata"`
	RequestTimeout    time.Duration     `key:"request_timeout"`
	ConnectTimeout    time.Duration     `key:"connect_timeout"`
	ContinueOnError   bool              `key:"continue_on_error"`
}

// E2BTemplate is an E2B template and its size (an entry of e2b.templates).
type E2BTemplate struct {
	ID       string `key:"id"`
	CPUCount int    `key:"cpu_count"`
	MemoryMB int    `key:"memory_mb"`
}

// Secret is a configuration value that is a credential. It never shows: fmt, slog and
// text encoders see "[redacted]" (or "" when it is empty), so a logged or dumped Config
// cannot leak it; string(s) is the value.
type Secret string

func (s Secret) redacted() string {
	if s == "" {
		return ""
	}
	return "[redacted]"
}

// String is "[redacted]", or "" when s is empty.
func (s Secret) String() string { return s.redacted() }

// GoString is what %#v shows.
func (s Secret) GoString() string { return strconv.Quote(s.redacted()) }

// LogValue is what slog records.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.redacted()) }

// MarshalText is what text, JSON and YAML encoders write.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.redacted()), nil }

// LimitsConfig is the limits.* keys: what plugins and commands may use.
type LimitsConfig struct {
	MemoryMiB          int           `key:"memory_mib"`
	CallTimeout        time.Duration `key:"call_timeout"`
	PoolSize           int           `key:"pool_size"`
	ExecTimeoutDefault time.Duration `key:"exec_timeout_default"`
	ExecTimeoutMax     time.Duration `key:"exec_timeout_max"`
	ReadMaxBytes       int64         `key:"read_max_bytes"`
	ExecOutputMaxBytes int           `key:"exec_output_max_bytes"`
}

// DefaultConfig is the configuration of ConfigKeys' defaults: the built-in plugins, the
// local sandbox provider, a directory store under the data dir.
func DefaultConfig() Config {
	var c Config
	v := reflect.ValueOf(&c).Elem()
	for _, k := range keyTable {
		f, err := fieldOf(v, k.name)
		if err != nil {
			panic(err) // TestConfigKeys keeps the table and the struct in step
		}
		d := k.defaultValue()
		if d == nil {
			continue
		}
		f.Set(reflect.ValueOf(d).Convert(f.Type()))
	}
	return c
}

// fieldOf finds the field of v (a Config) that the dotted key names.
func fieldOf(v reflect.Value, key string) (reflect.Value, error) {
	for part := range strings.SplitSeq(key, ".") {
		if v.Kind() != reflect.Struct {
			return reflect.Value{}, fmt.Errorf("config key %s: %s is not a section", key, part)
		}
		found := false
		for i := range v.NumField() {
			if v.Type().Field(i).Tag.Get("key") == part {
				v, found = v.Field(i), true
				break
			}
		}
		if !found {
			return reflect.Value{}, fmt.Errorf("config key %s: no field for %q", key, part)
		}
	}
	return v, nil
}

// Level is the slog level of LogLevel (info when it does not parse; Validate refuses it).
func (c *Config) Level() slog.Level {
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return slog.LevelInfo
	}
	return l
}

// storeDir is store.dir, or data_dir/store when it is empty.
func (c *Config) storeDir() string {
	if c.Store.Dir != "" {
		return c.Store.Dir
	}
	return filepath.Join(c.DataDir, "store")
}

// Validate checks every value; the error names the key and fits on one line.
func (c *Config) Validate() error {
	bad := func(key, format string, args ...any) error {
		return fmt.Errorf("config: %s: %s", key, fmt.Sprintf(format, args...))
	}
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return bad("log_level", "must be debug, info, warn or error, got %q", c.LogLevel)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		return bad("log_format", "must be text or json, got %q", c.LogFormat)
	}
	if strings.TrimSpace(c.DataDir) == "" {
		return bad("data_dir", "is empty (DefaultConfig sets it)")
	}
	if err := c.validateSandbox(bad); err != nil {
		return err
	}
	if err := c.validateStorage(bad); err != nil {
		return err
	}
	if c.Session.TTL <= 0 {
		return bad("session.ttl", "must be positive, got %s", c.Session.TTL)
	}
	if c.Session.KeepaliveMargin <= 0 || c.Session.KeepaliveMargin >= c.Session.TTL {
		return bad("session.keepalive_margin", "must be positive and less than session.ttl (%s), got %s", c.Session.TTL, c.Session.KeepaliveMargin)
	}
	if c.Session.LastCallMargin < 0 || c.Session.LastCallMargin >= c.Session.KeepaliveMargin {
		return bad("session.last_call_margin", "must be less than session.keepalive_margin (%s), or 0 for half of it, got %s", c.Session.KeepaliveMargin, c.Session.LastCallMargin)
	}
	if c.Lease.Enabled && (c.Lease.TTL <= 0 || c.Lease.Renew <= 0 || c.Lease.Renew >= c.Lease.TTL) {
		return bad("lease.renew", "must be positive and less than lease.ttl (%s), got %s", c.Lease.TTL, c.Lease.Renew)
	}
	if c.Session.MaxLifetime < c.Session.TTL {
		return bad("session.max_lifetime", "must be at least session.ttl (%s), got %s", c.Session.TTL, c.Session.MaxLifetime)
	}
	if c.Screenshot.Port < 0 || c.Screenshot.Port > 65535 {
		return bad("screenshot.port", "must be a TCP port (1-65535) or 0 for none, got %d", c.Screenshot.Port)
	}
	if c.Screenshot.IdleWait <= 0 {
		return bad("screenshot.idle_wait", "must be positive, got %s", c.Screenshot.IdleWait)
	}
	if c.Screenshot.Chromium != "" && !filepath.IsAbs(c.Screenshot.Chromium) {
		return bad("screenshot.chromium", "must be an absolute path, got %q", c.Screenshot.Chromium)
	}
	if err := c.validateE2B(bad); err != nil {
		return err
	}
	if err := c.validateServe(bad); err != nil {
		return err
	}
	if err := c.validateLimits(bad); err != nil {
		return err
	}
	return c.validatePlugins(bad)
}

type badKey func(key, format string, args ...any) error

// ProviderNamesOf splits a sandbox.provider value into the names of its providers, in the
// order a chain tries them: "e2b, local" is [e2b local].
func ProviderNamesOf(value string) []string {
	var names []string
	for n := range strings.SplitSeq(value, ",") {
		names = append(names, strings.TrimSpace(n))
	}
	return names
}

func (c *Config) validateSandbox(bad badKey) error {
	seen := map[string]bool{}
	for _, name := range ProviderNamesOf(c.Sandbox.Provider) {
		if _, ok := providers.lookup(name); !ok {
			return bad("sandbox.provider", "unknown provider %q (known: %s; several, tried in order, as a comma-separated list such as e2b,local)",
				name, strings.Join(providers.names(), ", "))
		}
		if seen[name] {
			return bad("sandbox.provider", "%q is listed twice in %q", name, c.Sandbox.Provider)
		}
		seen[name] = true
	}
	switch c.Sandbox.Network {
	case "none", "host":
	default:
		return bad("sandbox.network", "must be \"none\" or \"host\", got %q", c.Sandbox.Network)
	}
	for _, l := range []struct {
		key string
		v   int64
	}{
		{"sandbox.memory_mib", c.Sandbox.MemoryMiB}, {"sandbox.processes", c.Sandbox.Processes},
		{"sandbox.disk_mib", c.Sandbox.DiskMiB}, {"sandbox.open_files", c.Sandbox.OpenFiles},
	} {
		if l.v == 0 || l.v < -1 {
			return bad(l.key, "must be positive, or -1 for no limit, got %d", l.v)
		}
	}
	for _, l := range []struct {
		key string
		v   int64
	}{{"sandbox.tmp_mib", c.Sandbox.TmpMiB}, {"sandbox.shm_mib", c.Sandbox.ShmMiB}} {
		if l.v <= 0 {
			return bad(l.key, "must be positive, got %d", l.v)
		}
	}
	if c.Sandbox.MemoryMiB > 0 && c.Sandbox.TmpMiB+c.Sandbox.ShmMiB >= c.Sandbox.MemoryMiB {
		return bad("sandbox.memory_mib", "must be more than sandbox.tmp_mib + sandbox.shm_mib (%d MiB): tmpfs pages count against it, and files alone must not fill it",
			c.Sandbox.TmpMiB+c.Sandbox.ShmMiB)
	}
	if c.Sandbox.CPUs < 0 {
		return bad("sandbox.cpus", "must be a number of cores, or 0 for all, got %g", c.Sandbox.CPUs)
	}
	if c.Sandbox.HostUID <= 0 {
		return bad("sandbox.host_uid", "must be an unprivileged uid (not 0), got %d", c.Sandbox.HostUID)
	}
	return nil
}

// validateStorage checks project, store.* and snapshot.*.
func (c *Config) validateStorage(bad badKey) error {
	if err := snapshot.ValidProjectID(c.Project); err != nil {
		return bad("project", "%v", err)
	}
	switch c.Store.Kind {
	case "dir":
		if c.Store.Dir != "" && strings.TrimSpace(c.Store.Dir) == "" {
			return bad("store.dir", "is blank")
		}
	case "s3":
		if c.Store.S3.Bucket == "" {
			return bad("store.s3.bucket", "is required when store.kind is s3")
		}
	default:
		return bad("store.kind", "must be \"dir\" or \"s3\", got %q", c.Store.Kind)
	}
	if e := c.Store.S3.Endpoint; e != "" {
		if u, err := url.Parse(e); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return bad("store.s3.endpoint", "must be an http or https URL, got %q", e)
		}
	}
	switch c.Store.S3.Checksums {
	case "when_supported", "when_required":
	default:
		return bad("store.s3.checksums", "must be \"when_supported\" or \"when_required\", got %q", c.Store.S3.Checksums)
	}
	if b := c.Store.PublicBase; b != "" {
		if u, err := url.Parse(b); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
			return bad("store.public_base", "must be an http or https origin such as https://cdn.example.com, got %q", b)
		}
	}
	if c.Snapshot.Keep == 0 {
		return bad("snapshot.keep", "must be at least 1 (or negative to keep every snapshot), got 0")
	}
	for _, e := range c.Snapshot.Excludes {
		if e == "" || e == "." || e == ".." || strings.ContainsAny(e, "/\x00") {
			return bad("snapshot.excludes", "%q is not a base name (no slashes; it matches a file or directory name at any depth)", e)
		}
	}
	if c.Snapshot.Retries < 0 || c.Snapshot.Retries > 20 {
		return bad("snapshot.retries", "must be between 0 and 20, got %d", c.Snapshot.Retries)
	}
	return nil
}

// usesE2B reports whether sandbox.provider names e2b.
func (c *Config) usesE2B() bool { return slices.Contains(ProviderNamesOf(c.Sandbox.Provider), "e2b") }

// e2bPlan is the plan e2b.plan names, with e2b.max_lifetime and e2b.monthly_cpu_minutes.
func (c *Config) e2bPlan() e2b.Plan {
	plan, _ := e2b.PlanNamed(c.E2B.Plan)
	if c.E2B.MaxLifetime > 0 {
		plan.MaxLifetime = c.E2B.MaxLifetime
	}
	plan.MonthlyCPUMinutes = c.E2B.MonthlyCPUMinutes
	return plan
}

func (c *Config) validateE2B(bad badKey) error {
	e := &c.E2B
	if _, ok := e2b.PlanNamed(e.Plan); !ok {
		return bad("e2b.plan", "must be \"hobby\" or \"pro\" (set e2b.max_lifetime and e2b.monthly_cpu_minutes for what a plan of your own allows), got %q", e.Plan)
	}
	if strings.ContainsAny(e.Domain, "/: ") {
		return bad("e2b.domain", "must be a domain name such as e2b.app (no scheme, port or path), got %q", e.Domain)
	}
	for _, u := range []struct{ key, v string }{{"e2b.api_url", e.APIURL}, {"e2b.sandbox_url", e.SandboxURL}} {
		if u.v == "" {
			continue
		}
		if pu, err := url.Parse(u.v); err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" || pu.User != nil {
			return bad(u.key, "must be an http or https URL such as https://api.e2b.app, got %q", u.v)
		}
	}
	if e.CPUCount < 0 || e.MemoryMB < 0 {
		return bad("e2b.cpu_count", "e2b.cpu_count and e2b.memory_mb must be 0 (the template's) or positive, got %d and %d", e.CPUCount, e.MemoryMB)
	}
	for i, t := range e.Templates {
		if strings.TrimSpace(t.ID) == "" || t.CPUCount < 1 || t.MemoryMB < 1 {
			return bad(fmt.Sprintf("e2b.templates[%d]", i), "needs an id, a cpu_count and a memory_mb (positive), got %+v", t)
		}
	}
	if e.MaxLifetime < 0 {
		return bad("e2b.max_lifetime", "must be positive, or 0 for the plan's, got %s", e.MaxLifetime)
	}
	if e.MonthlyCPUMinutes < 0 {
		return bad("e2b.monthly_cpu_minutes", "must be positive, or 0 for no limit, got %g", e.MonthlyCPUMinutes)
	}
	for _, k := range slices.Sorted(maps.Keys(e.Metadata)) {
		if strings.TrimSpace(k) == "" {
			return bad("e2b.metadata", "has an empty name")
		}
	}
	if e.RequestTimeout <= 0 {
		return bad("e2b.request_timeout", "must be positive, got %s", e.RequestTimeout)
	}
	if e.ConnectTimeout <= 0 {
		return bad("e2b.connect_timeout", "must be positive, got %s", e.ConnectTimeout)
	}
	// A session on E2B lives within the plan's maximum lifetime (Open cuts its ttl and
	// max_lifetime to it): the keepalive margin must leave it room to extend and rotate.
	if max := c.e2bPlan().MaxLifetime; c.usesE2B() && c.Session.KeepaliveMargin >= max {
		return bad("session.keepalive_margin", "must be less than the E2B plan's maximum sandbox lifetime (%s, e2b.plan and e2b.max_lifetime), got %s", max, c.Session.KeepaliveMargin)
	}
	return nil
}

func (c *Config) validateLimits(bad badKey) error {
	if c.Limits.MemoryMiB < 1 || c.Limits.MemoryMiB > 4096 {
		return bad("limits.memory_mib", "must be between 1 and 4096 (a wasm32 memory is at most 4 GiB), got %d", c.Limits.MemoryMiB)
	}
	if c.Limits.CallTimeout <= 0 {
		return bad("limits.call_timeout", "must be positive, got %s", c.Limits.CallTimeout)
	}
	if c.Limits.PoolSize < 1 {
		return bad("limits.pool_size", "must be at least 1, got %d", c.Limits.PoolSize)
	}
	if c.Limits.ExecTimeoutDefault <= 0 {
		return bad("limits.exec_timeout_default", "must be positive, got %s", c.Limits.ExecTimeoutDefault)
	}
	if c.Limits.ExecTimeoutMax < c.Limits.ExecTimeoutDefault {
		return bad("limits.exec_timeout_max", "must be at least limits.exec_timeout_default (%s), got %s", c.Limits.ExecTimeoutDefault, c.Limits.ExecTimeoutMax)
	}
	if c.Limits.ExecTimeoutMax%time.Second != 0 {
		return bad("limits.exec_timeout_max", "must be whole seconds, got %s", c.Limits.ExecTimeoutMax)
	}
	if c.Limits.ReadMaxBytes < 1 {
		return bad("limits.read_max_bytes", "must be positive, got %d", c.Limits.ReadMaxBytes)
	}
	if c.Limits.ExecOutputMaxBytes < 1024 {
		return bad("limits.exec_output_max_bytes", "must be at least 1024, got %d", c.Limits.ExecOutputMaxBytes)
	}
	return nil
}

func (c *Config) validatePlugins(bad badKey) error {
	var names []string
	for _, cp := range abi.Capabilities() {
		names = append(names, string(cp))
	}
	if c.Audit.File != "" && strings.TrimSpace(c.Audit.File) == "" {
		return bad("audit.file", "is blank")
	}
	for i, p := range c.Plugins {
		key := fmt.Sprintf("plugins[%d]", i)
		if strings.TrimSpace(p.Path) == "" {
			return bad(key+".path", "is empty")
		}
		for _, g := range p.Grants {
			if !slices.Contains(names, string(g)) {
				return bad(key+".grants", "unknown capability %q (known: %s)", g, strings.Join(names, ", "))
			}
		}
		for _, name := range slices.Sorted(maps.Keys(p.Env)) {
			if name == "" || strings.ContainsAny(name, "=\x00") {
				return bad(key+".env", "invalid variable name %q", name)
			}
		}
		for _, s := range []struct {
			set bool
			c   abi.Capability
		}{{p.Files != nil, abi.CapSandboxFiles}, {p.Exec != nil, abi.CapSandboxExec}, {p.Store != nil, abi.CapStore}, {p.Capture != nil, abi.CapCapture}} {
			if s.set && !slices.Contains(p.Grants, s.c) {
				return bad(key+"."+string(s.c), "scopes a capability the plugin is not granted: add %s to its grants, or remove this", s.c)
			}
		}
		if _, err := policyengine.Compile(p.Scope); err != nil {
			return bad(key, "%v", err)
		}
		l := p.Limits
		switch {
		case l.MemoryMiB < 0 || l.MemoryMiB > 4096:
			return bad(key+".limits.memory_mib", "must be between 1 and 4096, or 0 for limits.memory_mib, got %d", l.MemoryMiB)
		case l.CallTimeout < 0:
			return bad(key+".limits.call_timeout", "must be positive, or 0 for limits.call_timeout, got %s", l.CallTimeout)
		case l.CallsPerMinute < 0:
			return bad(key+".limits.calls_per_minute", "must be positive, or 0 for no bound, got %d", l.CallsPerMinute)
		}
		if len(p.Secrets) > 0 && !slices.Contains(p.Grants, abi.CapSandboxExec) {
			return bad(key+".secrets", "secrets reach the commands a plugin runs: grant it sandbox_exec, or remove them")
		}
		for _, name := range slices.Sorted(maps.Keys(p.Secrets)) {
			if err := checkSecretRef(name, p.Secrets[name]); err != nil {
				return bad(key+".secrets."+name, "%v", err)
			}
		}
	}
	return nil
}

// checkSecretRef checks where a secret comes from: env:VAR or file:/abs/path.
func checkSecretRef(name, ref string) error {
	if !secretNameRE.MatchString(name) {
		return fmt.Errorf("%q is not a variable name (letters, digits and _, not starting with a digit)", name)
	}
	kind, arg, _ := strings.Cut(ref, ":")
	switch {
	case kind == "env" && secretNameRE.MatchString(arg):
	case kind == "file" && filepath.IsAbs(arg):
	default:
		return fmt.Errorf("must say where the value comes from, as env:VARIABLE or file:/absolute/path, not the value itself (a config file holds no secret)")
	}
	return nil
}

var secretNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// secretValues reads the values of a plugin's secrets from where they come from.
func secretValues(p Plugin) (map[string]string, error) {
	if len(p.Secrets) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(p.Secrets))
	for _, name := range slices.Sorted(maps.Keys(p.Secrets)) {
		kind, arg, _ := strings.Cut(p.Secrets[name], ":")
		var v string
		switch kind {
		case "env":
			val, ok := os.LookupEnv(arg)
			if !ok || val == "" {
				return nil, fmt.Errorf("secret %s: the variable %s is not set", name, arg)
			}
			v = val
		case "file":
			b, err := os.ReadFile(arg)
			if err != nil {
				return nil, fmt.Errorf("secret %s: %w", name, err)
			}
			v = strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
		default:
			return nil, fmt.Errorf("secret %s: %q names neither an env: nor a file: source", name, p.Secrets[name])
		}
		if len(v) < host.MinSecretLen {
			return nil, fmt.Errorf("secret %s: its value is shorter than %d characters, too short to keep out of results", name, host.MinSecretLen)
		}
		out[name] = v
	}
	return out, nil
}
