package toolhost

import (
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/egress"
	"github.com/toolhost/toolhost/internal/host"
	"github.com/toolhost/toolhost/internal/module"
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
	Limits     LimitsConfig     `key:"limits"`
	Audit      AuditConfig      `key:"audit"`
	Registry   RegistryConfig   `key:"registry"`
	Serve      ServeConfig      `key:"serve"`
	LogLevel   string           `key:"log_level"`
	LogFormat  string           `key:"log_format"`

	// modules holds the configuration of every registered module (the e2b provider's
	// e2b.* keys, the s3 store's store.s3.* ...), each a value of the module's own type,
	// by moduleID. Get, Set and Module reach it; DefaultConfig fills it.
	modules map[string]any
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

// RegistryConfig is the registry.* keys: whom `toolhost plugin add` and `upgrade` trust
// to sign the plugins they install from OCI registries.
type RegistryConfig struct {
	Keys          []string `key:"keys"`
	AllowUnsigned []string `key:"allow_unsigned"`
}

// StoreConfig is the store.* keys that every store shares: which one, and where its keys
// are served publicly. Each store's own keys (store.dir, store.s3.*) are its module's.
type StoreConfig struct {
	Kind       string `key:"kind"`
	PublicBase string `key:"public_base"`
}

// SnapshotConfig is the snapshot.* keys.
type SnapshotConfig struct {
	Keep     int           `key:"keep"`
	Excludes []string      `key:"excludes"`
	Retries  int           `key:"retries"`
	Format   string        `key:"format"`
	Grace    time.Duration `key:"grace"`
}

// SessionConfig is the session.* keys: the lifetime policy of a session's sandboxes.
type SessionConfig struct {
	TTL             time.Duration `key:"ttl"`
	KeepaliveMargin time.Duration `key:"keepalive_margin"`
	LastCallMargin  time.Duration `key:"last_call_margin"`
	MaxLifetime     time.Duration `key:"max_lifetime"`
	Autosave        time.Duration `key:"autosave"`
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

// SandboxConfig is the sandbox.* keys that every provider honours: which providers, the
// network policy and what each sandbox may use. A provider's own keys (the local
// provider's sandbox.host_uid, run_dir and workspace_dir) are its module's.
type SandboxConfig struct {
	Provider        string  `key:"provider"`
	ContinueOnError bool    `key:"continue_on_error"`
	Network         string  `key:"network"`
	MemoryMiB       int64   `key:"memory_mib"`
	Processes       int64   `key:"processes"`
	CPUs            float64 `key:"cpus"`
	TmpMiB          int64   `key:"tmp_mib"`
	ShmMiB          int64   `key:"shm_mib"`
	DiskMiB         int64   `key:"disk_mib"`
	OpenFiles       int64   `key:"open_files"`

	// Egress is the sandbox.egress.* keys (EgressConfig): every provider honours the policy.
	Egress EgressConfig `key:"egress"`
}

// Secret is a configuration value that is a credential (e2b.api_key, a serve token). It
// never shows: fmt, slog and text encoders see "[redacted]" (or "" when it is empty), so
// a logged or dumped Config cannot leak it; string(s) is the value.
type Secret = module.Secret

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

// Level is the slog level of LogLevel (info when it does not parse; Validate refuses it).
func (c *Config) Level() slog.Level {
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return slog.LevelInfo
	}
	return l
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
		v, err := secretValue("secret "+name, p.Secrets[name])
		if err != nil {
			return nil, err
		}
		out[name] = v
	}
	return out, nil
}

// secretValue reads the value a secret reference names: "env:VAR" (a variable of this
// process) or "file:/abs/path" (the file's contents, less a final newline). what names the
// secret in errors, which never hold a value.
func secretValue(what, ref string) (string, error) {
	kind, arg, _ := strings.Cut(ref, ":")
	var v string
	switch kind {
	case "env":
		val, ok := os.LookupEnv(arg)
		if !ok || val == "" {
			return "", fmt.Errorf("%s: the variable %s is not set", what, arg)
		}
		v = val
	case "file":
		b, err := os.ReadFile(arg)
		if err != nil {
			return "", fmt.Errorf("%s: %w", what, err)
		}
		v = strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	default:
		return "", fmt.Errorf("%s: %q names neither an env: nor a file: source", what, ref)
	}
	if len(v) < host.MinSecretLen {
		return "", fmt.Errorf("%s: its value is shorter than %d characters, too short to keep out of results", what, host.MinSecretLen)
	}
	return v, nil
}

// ServeConfig is the serve.* keys: the MCP server over streamable HTTP (toolhost serve;
// package mcpserve).
type ServeConfig struct {
	Listen      string            `key:"listen"`
	Tokens      []ServeToken      `key:"tokens"`
	TokensFile  string            `key:"tokens_file"`
	Workspaces  map[string]string `key:"workspaces"`
	MaxSessions int               `key:"max_sessions"`
	IdleTimeout time.Duration     `key:"idle_timeout"`
	// DaemonCalls lets a plain `toolhost call` run in the session daemon, and start one.
	DaemonCalls  bool  `key:"daemon_calls"`
	MaxBodyBytes int64 `key:"max_body_bytes"`
	// Drain is what a stop does with open sessions: DrainClose or DrainHandoff.
	Drain string      `key:"drain"`
	Fleet FleetConfig `key:"fleet"`
}

// What serve.drain names.
const (
	DrainClose   = "close"
	DrainHandoff = "handoff"
)

// FleetConfig is the serve.fleet.* keys: the replicas of one fleet, which share a store
// and serve any project whichever of them holds it.
type FleetConfig struct {
	Advertise  string   `key:"advertise"`
	SecretFile string   `key:"secret_file"`
	Peers      []string `key:"peers"`
	// OrphanAfter is how long the sandboxes of a project nobody holds (its holder died,
	// or handed it over and no request came) wait for a replica to reconnect before any
	// replica kills them.
	OrphanAfter time.Duration `key:"orphan_after"`
}

// InFleet reports whether serve runs as a replica of a fleet (serve.fleet.advertise set).
func (s ServeConfig) InFleet() bool { return s.Fleet.Advertise != "" }

// ServeToken is a bearer token toolhost serve accepts (an entry of serve.tokens) and the
// projects it may open (none: any).
type ServeToken struct {
	Token    Secret   `key:"token"`
	Projects []string `key:"projects"`
	// Egress narrows what the sessions this token opens may reach (sandbox.network
	// egress); it can only take away from sandbox.egress.*.
	Egress *EgressPolicy `key:"egress"`
}

// EgressConfig is the sandbox.egress.* keys: what a sandbox with sandbox.network egress
// may reach through the host's gateway (package internal/egress), and its bounds.
type EgressConfig struct {
	Preset      string         `key:"preset"`
	Allow       []string       `key:"allow"`
	Deny        []string       `key:"deny"`
	Ports       []int          `key:"ports"`
	MaxBytes    int64          `key:"max_bytes"`
	MaxConns    int            `key:"max_conns"`
	IdleTimeout time.Duration  `key:"idle_timeout"`
	Resolver    string         `key:"resolver"`
	CAFile      string         `key:"ca_file"`
	Inject      []EgressInject `key:"inject"`
}

// EgressInject is a credential the gateway adds to the requests of one domain (an entry of
// sandbox.egress.inject): the header Header with the value Secret names ("env:VAR" or
// "file:/abs/path", as plugin secrets are named). The value never enters the sandbox.
type EgressInject struct {
	Domain string `key:"domain"`
	Header string `key:"header"`
	Secret string `key:"secret"`
}

// EgressPolicy narrows the host's egress policy (sandbox.egress.*) for a session
// (SessionOptions.Egress, a serve token's egress): a destination must be allowed by both,
// so it can only take away. Entries as in sandbox.egress.allow (name, *.name, name:port,
// CIDR, CIDR:port, :* for every port; docs/NETWORK.md). With no preset and no allow
// entries it narrows by its deny list and ports only.
type EgressPolicy struct {
	Preset string   `key:"preset" json:"preset,omitempty"`
	Allow  []string `key:"allow" json:"allow,omitempty"`
	Deny   []string `key:"deny" json:"deny,omitempty"`
	Ports  []int    `key:"ports" json:"ports,omitempty"`
}

func (p *EgressPolicy) spec() egress.Spec {
	return egress.Spec{Preset: p.Preset, Allow: p.Allow, Deny: p.Deny, Ports: p.Ports}
}

// checkNarrowing compiles a session's narrowing against the host's policy.
func (c *Config) checkNarrowing(p *EgressPolicy) error {
	host, err := c.hostPolicy()
	if err != nil {
		return err
	}
	_, err = host.Narrow(p.spec())
	return err
}

// Network modes of sandbox.network.
const (
	NetworkEgress = sandbox.NetworkEgress
	NetworkNone   = sandbox.NetworkNone
	NetworkHost   = sandbox.NetworkHost
)

// hostPolicy compiles the sandbox.egress.* policy.
func (c *Config) hostPolicy() (*egress.Policy, error) {
	e := &c.Sandbox.Egress
	return egress.Compile(egress.Spec{Preset: e.Preset, Allow: e.Allow, Deny: e.Deny, Ports: e.Ports})
}

// ProviderNamesOf splits a sandbox.provider value into the names of its providers, in the
// order a chain tries them: "e2b, local" is [e2b local].
func ProviderNamesOf(value string) []string {
	var names []string
	for n := range strings.SplitSeq(value, ",") {
		names = append(names, strings.TrimSpace(n))
	}
	return names
}
