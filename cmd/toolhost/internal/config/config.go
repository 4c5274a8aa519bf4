// Package config loads the toolhost CLI's configuration: built-in defaults, then a YAML
// file, then TOOLHOST_ environment variables, then command-line flags, each layer
// overriding the one before. It knows nothing of the host library; cmd/toolhost turns a
// Config into a host.Config.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/providers/posflag"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/archive"
	"github.com/toolhost/toolhost/core/snapshot"
)

// EnvPrefix prefixes every environment variable the loader reads.
const EnvPrefix = "TOOLHOST_"

// EnvConfigFile names the config file when --config is not given.
const EnvConfigFile = "TOOLHOST_CONFIG"

// DefaultFileName is the config file looked for in the user's configuration directory
// (ConfigHome/toolhost/toolhost.yaml) when neither --config nor TOOLHOST_CONFIG names one.
//
// Never in the working directory: the CLI mounts directories as sandbox workspaces, and a
// file a sandbox can write must never configure the host (a sandbox that could write
// ./toolhost.yaml could give the next command the host's network, or a browser of its
// choosing).
const DefaultFileName = "toolhost.yaml"

// UserConfigFile is the default config file under configHome (os.UserConfigDir when
// empty): configHome/toolhost/toolhost.yaml.
func UserConfigFile(configHome string) string {
	if configHome == "" {
		d, err := os.UserConfigDir()
		if err != nil {
			return ""
		}
		configHome = d
	}
	return filepath.Join(configHome, "toolhost", DefaultFileName)
}

// Config is the CLI's whole configuration. Keys are lower-case snake_case.
type Config struct {
	// DataDir holds the compilation cache and whatever else the host keeps. Empty means
	// the host's default (host.DefaultDataDir).
	DataDir string `koanf:"data_dir"`
	// PluginsDir is where relative plugin paths resolve. Empty means "plugins" next to the
	// executable, falling back to ./bin/plugins.
	PluginsDir string   `koanf:"plugins_dir"`
	Plugins    []Plugin `koanf:"plugins"`
	// Project names the project whose snapshots and screenshots the commands use.
	Project    string     `koanf:"project"`
	Store      Store      `koanf:"store"`
	Snapshot   Snapshot   `koanf:"snapshot"`
	Session    Session    `koanf:"session"`
	Screenshot Screenshot `koanf:"screenshot"`
	Sandbox    Sandbox    `koanf:"sandbox"`
	Limits     Limits     `koanf:"limits"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `koanf:"log_level"`
}

// Plugin is one plugin to load.
type Plugin struct {
	// Path of the .wasm file; relative paths resolve against PluginsDir.
	Path string `koanf:"path"`
	// Grants are the capabilities the plugin may import.
	Grants []string `koanf:"grants"`
	// Env is the plugin's configuration, passed as WASI environment variables.
	Env map[string]string `koanf:"env"`
}

// Sandbox configures the sandboxes the CLI creates. Their lifetime is Session's. The
// limits bound each sandbox; -1 means no limit (0 for cpus: all cores).
type Sandbox struct {
	// Network is "none" or "host".
	Network      string  `koanf:"network"`
	MemoryMiB    int64   `koanf:"memory_mib"`
	Processes    int64   `koanf:"processes"`
	CPUs         float64 `koanf:"cpus"`
	TmpMiB       int64   `koanf:"tmp_mib"`
	ShmMiB       int64   `koanf:"shm_mib"`
	DiskMiB      int64   `koanf:"disk_mib"`
	OpenFiles    int64   `koanf:"open_files"`
	HostUID      int     `koanf:"host_uid"`
	RunDir       string  `koanf:"run_dir"`
	WorkspaceDir string  `koanf:"workspace_dir"`
}

// Store is the object store that holds snapshots and screenshots.
type Store struct {
	// Kind is "dir" (a directory on this machine) or "s3".
	Kind string `koanf:"kind"`
	// Dir is the directory store's root; empty means data_dir/store.
	Dir string `koanf:"dir"`
	S3  S3     `koanf:"s3"`
	// PublicBase, when set, is the origin (a CDN) the store's keys are served under;
	// screenshot URLs are PublicBase/key.
	PublicBase string `koanf:"public_base"`
}

// S3 configures the S3 (or S3-compatible) store.
type S3 struct {
	Bucket    string `koanf:"bucket"`
	Region    string `koanf:"region"`
	Endpoint  string `koanf:"endpoint"`
	PathStyle bool   `koanf:"path_style"`
	// Checksums is "when_supported" (the SDK's default) or "when_required" (for
	// S3-compatible stores that refuse the newer checksum headers).
	Checksums string `koanf:"checksums"`
}

// Snapshot configures workspace snapshots.
type Snapshot struct {
	// Keep is how many snapshots per project retention keeps.
	Keep int `koanf:"keep"`
	// Excludes are base names left out of snapshots, at any depth.
	Excludes []string `koanf:"excludes"`
	// Retries is how many times a failed upload or download is retried.
	Retries int `koanf:"retries"`
}

// Session is the lifetime policy of the sandboxes a session runs tools in.
type Session struct {
	// TTL is how long a sandbox lives unless extended, and each extension.
	TTL time.Duration `koanf:"ttl"`
	// KeepaliveMargin: with less than this left, the session extends or rotates.
	KeepaliveMargin time.Duration `koanf:"keepalive_margin"`
	// MaxLifetime is the longest one sandbox may live; the session rotates before it.
	MaxLifetime time.Duration `koanf:"max_lifetime"`
}

// Screenshot configures take_screenshot and auto-capture.
type Screenshot struct {
	Enabled bool `koanf:"enabled"`
	// Port is take_screenshot's default port when no dev server was seen; 0 for none.
	Port int `koanf:"port"`
	// IdleWait is the longest wait for network idle before a page is shot anyway.
	IdleWait time.Duration `koanf:"idle_wait"`
	// Chromium is the browser binary; empty means the first one installed of Debian's.
	Chromium string `koanf:"chromium"`
}

// Limits bound what plugins and commands may use.
type Limits struct {
	MemoryMiB          int           `koanf:"memory_mib"`
	CallTimeout        time.Duration `koanf:"call_timeout"`
	PoolSize           int           `koanf:"pool_size"`
	ExecTimeoutDefault time.Duration `koanf:"exec_timeout_default"`
	ExecTimeoutMax     time.Duration `koanf:"exec_timeout_max"`
	ReadMaxBytes       int64         `koanf:"read_max_bytes"`
	ExecOutputMaxBytes int           `koanf:"exec_output_max_bytes"`
}

// Level returns the slog level of LogLevel (info if it does not parse; Load validates it).
func (c *Config) Level() slog.Level {
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return slog.LevelInfo
	}
	return l
}

// BuiltinPlugins are the plugins loaded when the configuration names none.
func BuiltinPlugins() []Plugin {
	return []Plugin{
		{Path: "bash.wasm", Grants: []string{string(abi.CapSandboxExec), string(abi.CapLog)}},
		{Path: "editfile.wasm", Grants: []string{string(abi.CapSandboxFiles), string(abi.CapLog)}},
		{Path: "grepglob.wasm", Grants: []string{string(abi.CapSandboxExec), string(abi.CapSandboxFiles), string(abi.CapLog)}},
		{Path: "screenshot.wasm", Grants: []string{string(abi.CapCapture), string(abi.CapLog)}},
	}
}

// Default returns the built-in defaults.
func Default() Config {
	return Config{
		Plugins: BuiltinPlugins(),
		Project: "default",
		Store:   Store{Kind: "dir", S3: S3{Checksums: "when_supported"}},
		Snapshot: Snapshot{
			Keep:     snapshot.DefaultKeep,
			Excludes: slices.Clone(archive.DefaultExcludes),
			Retries:  snapshot.DefaultRetries,
		},
		Session: Session{
			TTL:             time.Hour,
			KeepaliveMargin: 5 * time.Minute,
			MaxLifetime:     24 * time.Hour,
		},
		Screenshot: Screenshot{Enabled: true, IdleWait: 3 * time.Second},
		Sandbox: Sandbox{Network: "none", MemoryMiB: 2048, Processes: 512, TmpMiB: 512, ShmMiB: 512,
			DiskMiB: 10240, OpenFiles: 16384, HostUID: 2100000000},
		Limits: Limits{
			MemoryMiB:          128,
			CallTimeout:        10 * time.Second,
			PoolSize:           8,
			ExecTimeoutDefault: 60 * time.Second,
			ExecTimeoutMax:     600 * time.Second,
			ReadMaxBytes:       16 << 20,
			ExecOutputMaxBytes: 64 << 10,
		},
		LogLevel: "info",
	}
}

// scalar keys, the env/flag-settable ones. plugins is a list and comes from the file only.
var scalarKeys = []string{
	"data_dir",
	"plugins_dir",
	"log_level",
	"project",
	"store.kind",
	"store.dir",
	"store.public_base",
	"store.s3.bucket",
	"store.s3.region",
	"store.s3.endpoint",
	"store.s3.path_style",
	"store.s3.checksums",
	"snapshot.keep",
	"snapshot.excludes",
	"snapshot.retries",
	"session.ttl",
	"session.keepalive_margin",
	"session.max_lifetime",
	"screenshot.enabled",
	"screenshot.port",
	"screenshot.idle_wait",
	"screenshot.chromium",
	"sandbox.network",
	"sandbox.memory_mib",
	"sandbox.processes",
	"sandbox.cpus",
	"sandbox.tmp_mib",
	"sandbox.shm_mib",
	"sandbox.disk_mib",
	"sandbox.open_files",
	"sandbox.host_uid",
	"sandbox.run_dir",
	"sandbox.workspace_dir",
	"limits.memory_mib",
	"limits.call_timeout",
	"limits.pool_size",
	"limits.exec_timeout_default",
	"limits.exec_timeout_max",
	"limits.read_max_bytes",
	"limits.exec_output_max_bytes",
}

// Keys lists every configuration key, in a stable order.
func Keys() []string {
	return append(append([]string{}, scalarKeys...), "plugins")
}

// aliases are older names of keys, still accepted everywhere: sandbox.timeout and
// sandbox.max_lifetime were the sandbox lifetime before sessions took it over.
var aliases = map[string]string{
	"sandbox.timeout":      "session.ttl",
	"sandbox.max_lifetime": "session.max_lifetime",
}

// listKeys are the keys whose environment variable holds a comma-separated list.
var listKeys = map[string]bool{"snapshot.excludes": true}

func knownKey(k string) bool {
	return slices.Contains(Keys(), k) || aliases[k] != ""
}

// EnvName returns the environment variable that sets key, e.g. TOOLHOST_LIMITS_MEMORY_MIB.
// A double underscore may stand for the dot as well (TOOLHOST_LIMITS__MEMORY_MIB).
func EnvName(key string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// envKeys maps both spellings of every scalar key's variable to the key.
func envKeys() map[string]string {
	m := make(map[string]string, 2*len(scalarKeys))
	for _, k := range scalarKeys {
		m[EnvName(k)] = k
		m[EnvPrefix+strings.ToUpper(strings.ReplaceAll(k, ".", "__"))] = k
	}
	for old, k := range aliases {
		m[EnvName(old)] = k
		m[EnvPrefix+strings.ToUpper(strings.ReplaceAll(old, ".", "__"))] = k
	}
	return m
}

// flag names of the config keys. Only these flags feed the configuration.
var flagKeys = map[string]string{
	"data-dir":              "data_dir",
	"plugins-dir":           "plugins_dir",
	"log-level":             "log_level",
	"project":               "project",
	"store":                 "store.kind",
	"store-dir":             "store.dir",
	"store-public-base":     "store.public_base",
	"s3-bucket":             "store.s3.bucket",
	"s3-region":             "store.s3.region",
	"s3-endpoint":           "store.s3.endpoint",
	"s3-path-style":         "store.s3.path_style",
	"s3-checksums":          "store.s3.checksums",
	"snapshot-keep":         "snapshot.keep",
	"snapshot-excludes":     "snapshot.excludes",
	"snapshot-retries":      "snapshot.retries",
	"session-ttl":           "session.ttl",
	"keepalive-margin":      "session.keepalive_margin",
	"session-max-lifetime":  "session.max_lifetime",
	"sandbox-timeout":       "session.ttl",          // older name
	"sandbox-max-lifetime":  "session.max_lifetime", // older name
	"screenshots":           "screenshot.enabled",
	"screenshot-port":       "screenshot.port",
	"screenshot-idle-wait":  "screenshot.idle_wait",
	"chromium":              "screenshot.chromium",
	"network":               "sandbox.network",
	"sandbox-memory-mib":    "sandbox.memory_mib",
	"sandbox-processes":     "sandbox.processes",
	"sandbox-cpus":          "sandbox.cpus",
	"sandbox-tmp-mib":       "sandbox.tmp_mib",
	"sandbox-shm-mib":       "sandbox.shm_mib",
	"sandbox-disk-mib":      "sandbox.disk_mib",
	"sandbox-open-files":    "sandbox.open_files",
	"sandbox-host-uid":      "sandbox.host_uid",
	"run-dir":               "sandbox.run_dir",
	"workspace-dir":         "sandbox.workspace_dir",
	"memory-mib":            "limits.memory_mib",
	"call-timeout":          "limits.call_timeout",
	"pool-size":             "limits.pool_size",
	"exec-timeout":          "limits.exec_timeout_default",
	"exec-timeout-max":      "limits.exec_timeout_max",
	"read-max-bytes":        "limits.read_max_bytes",
	"exec-output-max-bytes": "limits.exec_output_max_bytes",
}

// RegisterFlags adds --config and one flag per scalar key to fs. The defaults shown are
// the built-in ones; a flag only counts when it is given.
func RegisterFlags(fs *pflag.FlagSet) {
	d := Default()
	fs.String("config", "", "config file (default $"+EnvConfigFile+", else ~/.config/toolhost/"+DefaultFileName+" if present; never ./"+DefaultFileName+")")
	fs.String("data-dir", "", "data directory: compilation cache and host state (default $TOOLHOST_DATA_DIR, else $XDG_DATA_HOME/toolhost, else ~/.local/share/toolhost)")
	fs.String("plugins-dir", "", "where relative plugin paths resolve (default: plugins next to the executable, else ./bin/plugins)")
	fs.String("log-level", d.LogLevel, "log level: debug, info, warn or error")
	fs.String("project", d.Project, "project whose snapshots and screenshots are used")
	fs.String("store", d.Store.Kind, "object store for snapshots and screenshots: dir or s3")
	fs.String("store-dir", "", "directory store's root (default data_dir/store)")
	fs.String("store-public-base", "", "public origin (CDN) that serves the store's keys, for screenshot URLs")
	fs.String("s3-bucket", "", "S3 bucket (store s3)")
	fs.String("s3-region", "", "S3 region (default: the AWS SDK's, else us-east-1)")
	fs.String("s3-endpoint", "", "S3-compatible endpoint URL (default: AWS)")
	fs.Bool("s3-path-style", false, "address buckets as endpoint/bucket (most S3-compatible servers)")
	fs.String("s3-checksums", d.Store.S3.Checksums, "request checksums: when_supported or when_required")
	fs.Int("snapshot-keep", d.Snapshot.Keep, "snapshots kept per project (the newest)")
	fs.StringSlice("snapshot-excludes", d.Snapshot.Excludes, "base names left out of snapshots (comma-separated)")
	fs.Int("snapshot-retries", d.Snapshot.Retries, "retries of a failed snapshot upload or download")
	fs.Duration("session-ttl", d.Session.TTL, "how long a sandbox lives unless extended")
	fs.Duration("keepalive-margin", d.Session.KeepaliveMargin, "extend or rotate a sandbox when less than this is left")
	fs.Duration("session-max-lifetime", d.Session.MaxLifetime, "the longest one sandbox may live; sessions rotate before it")
	fs.Duration("sandbox-timeout", d.Session.TTL, "older name of --session-ttl")
	fs.Duration("sandbox-max-lifetime", d.Session.MaxLifetime, "older name of --session-max-lifetime")
	fs.MarkHidden("sandbox-timeout")
	fs.MarkHidden("sandbox-max-lifetime")
	fs.Bool("screenshots", d.Screenshot.Enabled, "take_screenshot and auto-capture (--screenshots=false turns them off)")
	fs.Int("screenshot-port", d.Screenshot.Port, "take_screenshot's default port when no dev server was seen (0: none)")
	fs.Duration("screenshot-idle-wait", d.Screenshot.IdleWait, "longest wait for network idle before a page is shot")
	fs.String("chromium", "", "Chromium binary for screenshots (default: Debian's chromium-headless-shell or chromium)")
	fs.String("network", d.Sandbox.Network, "sandbox network: none or host")
	fs.Int64("sandbox-memory-mib", d.Sandbox.MemoryMiB, "memory per sandbox, MiB, /tmp and /dev/shm included (-1: no limit)")
	fs.Int64("sandbox-processes", d.Sandbox.Processes, "processes and threads per sandbox (-1: no limit)")
	fs.Float64("sandbox-cpus", d.Sandbox.CPUs, "CPU quota per sandbox in cores (0: all cores)")
	fs.Int64("sandbox-tmp-mib", d.Sandbox.TmpMiB, "size of a sandbox's /tmp, MiB")
	fs.Int64("sandbox-shm-mib", d.Sandbox.ShmMiB, "size of a sandbox's /dev/shm, MiB")
	fs.Int64("sandbox-disk-mib", d.Sandbox.DiskMiB, "size of a sandbox's private workspace, MiB (-1: no limit)")
	fs.Int64("sandbox-open-files", d.Sandbox.OpenFiles, "open files per process in a sandbox")
	fs.Int("sandbox-host-uid", d.Sandbox.HostUID, "host uid and gid of the sandbox user when toolhost runs as root")
	fs.String("run-dir", "", "private directory of the sandboxes' sockets (default $TMPDIR/toolhost-run-UID)")
	fs.String("workspace-dir", "", "directory of the private workspaces (default /var/tmp/toolhost-workspaces-UID)")
	fs.Int("memory-mib", d.Limits.MemoryMiB, "memory limit per plugin instance, MiB")
	fs.Duration("call-timeout", d.Limits.CallTimeout, "deadline for a plugin's own work per call")
	fs.Int("pool-size", d.Limits.PoolSize, "maximum instances per plugin")
	fs.Duration("exec-timeout", d.Limits.ExecTimeoutDefault, "default timeout of a sandbox command")
	fs.Duration("exec-timeout-max", d.Limits.ExecTimeoutMax, "maximum timeout of a sandbox command")
	fs.Int64("read-max-bytes", d.Limits.ReadMaxBytes, "largest file a plugin may read, bytes")
	fs.Int("exec-output-max-bytes", d.Limits.ExecOutputMaxBytes, "what a command's stdout and stderr each keep (head and tail), bytes")
}

// Sources says where Load reads from.
type Sources struct {
	// Flags is a parsed flag set that RegisterFlags was called on; nil for none.
	Flags *pflag.FlagSet
	// Environ is the environment as KEY=VALUE strings; nil means os.Environ().
	Environ []string
	// ConfigHome is the user's configuration directory, where toolhost/toolhost.yaml is
	// read from when no file is named; empty means os.UserConfigDir ($XDG_CONFIG_HOME, else
	// ~/.config).
	ConfigHome string
}

// Loaded is a configuration and where it came from.
type Loaded struct {
	Config
	// File is the config file read, or "" when none was.
	File string
}

// Load builds the configuration: defaults, then the YAML file, then TOOLHOST_ variables,
// then the flags that were given. Errors name the offending key and fit on one line.
func Load(src Sources) (*Loaded, error) {
	environ := src.Environ
	if environ == nil {
		environ = os.Environ()
	}
	getenv := func(name string) (string, bool) {
		for _, kv := range environ {
			if k, v, ok := strings.Cut(kv, "="); ok && k == name {
				return v, true
			}
		}
		return "", false
	}

	k := koanf.New(".")
	if err := k.Load(confmap.Provider(defaultMap(), "."), nil); err != nil {
		return nil, fmt.Errorf("config: loading defaults: %w", err)
	}

	// 1. The file.
	path, explicit := "", false
	if src.Flags != nil {
		if f := src.Flags.Lookup("config"); f != nil && f.Changed {
			path, explicit = f.Value.String(), true
		}
	}
	if !explicit {
		if v, ok := getenv(EnvConfigFile); ok && v != "" {
			path, explicit = v, true
		}
	}
	if !explicit {
		if cand := UserConfigFile(src.ConfigHome); cand != "" {
			if st, err := os.Stat(cand); err == nil && st.Mode().IsRegular() {
				path = cand
			}
		}
	}
	if path != "" {
		if err := loadFile(k, path); err != nil {
			return nil, err
		}
	}

	// 2. The environment, mapped against the known keys; other TOOLHOST_ variables (the
	// plugins' own, the sandbox agent's) are not configuration and are left alone.
	ek := envKeys()
	err := k.Load(env.Provider(".", env.Opt{
		Prefix:      EnvPrefix,
		EnvironFunc: func() []string { return environ },
		TransformFunc: func(name, v string) (string, any) {
			key, ok := ek[name]
			if !ok || v == "" {
				return "", nil
			}
			if listKeys[key] {
				var list []any
				for _, item := range strings.Split(v, ",") {
					if item = strings.TrimSpace(item); item != "" {
						list = append(list, item)
					}
				}
				return key, list
			}
			return key, v
		},
	}), nil)
	if err != nil {
		return nil, fmt.Errorf("config: reading the environment: %w", err)
	}

	// 3. The flags that were given.
	if src.Flags != nil {
		err := k.Load(posflag.ProviderWithFlag(src.Flags, ".", k, func(f *pflag.Flag) (string, any) {
			key, ok := flagKeys[f.Name]
			if !ok || !f.Changed {
				return "", nil
			}
			return key, posflag.FlagVal(src.Flags, f)
		}), nil)
		if err != nil {
			return nil, fmt.Errorf("config: reading flags: %w", err)
		}
	}

	var c Config
	if err := decode(k, &c); err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &Loaded{Config: c, File: path}, nil
}

// loadFile merges a YAML file into k after checking it names only known keys.
func loadFile(k *koanf.Koanf, path string) error {
	fk := koanf.New(".")
	if err := fk.Load(file.Provider(path), yaml.Parser()); err != nil {
		return fmt.Errorf("config file %s: %s", path, oneLine(err))
	}
	for old, key := range aliases {
		if !fk.Exists(old) {
			continue
		}
		if fk.Exists(key) {
			return fmt.Errorf("config file %s: %s and %s are the same setting (%s is its older name): set only %s", path, key, old, old, key)
		}
		fk.Set(key, fk.Get(old))
		fk.Delete(old)
	}
	for _, key := range fk.Keys() {
		if knownKey(key) {
			continue
		}
		var section []string
		for _, k := range Keys() {
			if strings.HasPrefix(k, key+".") {
				section = append(section, strings.TrimPrefix(k, key+"."))
			}
		}
		if len(section) > 0 {
			return fmt.Errorf("config file %s: %s: must be a mapping of %s, got %v", path, key, strings.Join(section, ", "), fk.Get(key))
		}
		return fmt.Errorf("config file %s: unknown key %q (known: %s)", path, key, strings.Join(Keys(), ", "))
	}
	if err := k.Merge(fk); err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	return nil
}

// defaultMap is Default() as a flat koanf map.
func defaultMap() map[string]any {
	d := Default()
	plugins := make([]any, 0, len(d.Plugins))
	for _, p := range d.Plugins {
		grants := make([]any, len(p.Grants))
		for i, g := range p.Grants {
			grants[i] = g
		}
		plugins = append(plugins, map[string]any{"path": p.Path, "grants": grants})
	}
	excludes := make([]any, len(d.Snapshot.Excludes))
	for i, e := range d.Snapshot.Excludes {
		excludes[i] = e
	}
	return map[string]any{
		"data_dir":                     d.DataDir,
		"plugins_dir":                  d.PluginsDir,
		"plugins":                      plugins,
		"log_level":                    d.LogLevel,
		"project":                      d.Project,
		"store.kind":                   d.Store.Kind,
		"store.dir":                    d.Store.Dir,
		"store.public_base":            d.Store.PublicBase,
		"store.s3.bucket":              d.Store.S3.Bucket,
		"store.s3.region":              d.Store.S3.Region,
		"store.s3.endpoint":            d.Store.S3.Endpoint,
		"store.s3.path_style":          d.Store.S3.PathStyle,
		"store.s3.checksums":           d.Store.S3.Checksums,
		"snapshot.keep":                d.Snapshot.Keep,
		"snapshot.excludes":            excludes,
		"snapshot.retries":             d.Snapshot.Retries,
		"session.ttl":                  d.Session.TTL,
		"session.keepalive_margin":     d.Session.KeepaliveMargin,
		"session.max_lifetime":         d.Session.MaxLifetime,
		"screenshot.enabled":           d.Screenshot.Enabled,
		"screenshot.port":              d.Screenshot.Port,
		"screenshot.idle_wait":         d.Screenshot.IdleWait,
		"screenshot.chromium":          d.Screenshot.Chromium,
		"sandbox.network":              d.Sandbox.Network,
		"sandbox.memory_mib":           d.Sandbox.MemoryMiB,
		"sandbox.processes":            d.Sandbox.Processes,
		"sandbox.cpus":                 d.Sandbox.CPUs,
		"sandbox.tmp_mib":              d.Sandbox.TmpMiB,
		"sandbox.shm_mib":              d.Sandbox.ShmMiB,
		"sandbox.disk_mib":             d.Sandbox.DiskMiB,
		"sandbox.open_files":           d.Sandbox.OpenFiles,
		"sandbox.host_uid":             d.Sandbox.HostUID,
		"sandbox.run_dir":              d.Sandbox.RunDir,
		"sandbox.workspace_dir":        d.Sandbox.WorkspaceDir,
		"limits.memory_mib":            d.Limits.MemoryMiB,
		"limits.call_timeout":          d.Limits.CallTimeout,
		"limits.pool_size":             d.Limits.PoolSize,
		"limits.exec_timeout_default":  d.Limits.ExecTimeoutDefault,
		"limits.exec_timeout_max":      d.Limits.ExecTimeoutMax,
		"limits.read_max_bytes":        d.Limits.ReadMaxBytes,
		"limits.exec_output_max_bytes": d.Limits.ExecOutputMaxBytes,
	}
}

var durationType = reflect.TypeFor[time.Duration]()

// durationHook decodes "10s"-style strings into durations and refuses bare numbers, which
// would otherwise silently mean nanoseconds.
func durationHook(from, to reflect.Type, data any) (any, error) {
	if to != durationType {
		return data, nil
	}
	switch from.Kind() {
	case reflect.String:
		d, err := time.ParseDuration(strings.TrimSpace(data.(string)))
		if err != nil {
			return nil, fmt.Errorf("not a duration: %q (write it with a unit, e.g. \"30s\", \"10m\")", data)
		}
		return d, nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		if from == durationType {
			return data, nil
		}
		return nil, fmt.Errorf("a duration needs a unit: got %v (write e.g. \"%vs\")", data, data)
	}
	return data, nil
}

func decode(k *koanf.Koanf, c *Config) error {
	err := k.UnmarshalWithConf("", c, koanf.UnmarshalConf{
		Tag: "koanf",
		DecoderConfig: &mapstructure.DecoderConfig{
			DecodeHook:       durationHook,
			ErrorUnused:      true,
			WeaklyTypedInput: true,
			TagName:          "koanf",
			Result:           c,
		},
	})
	if err == nil {
		return nil
	}
	if de := firstDecodeError(err); de != nil {
		return fmt.Errorf("config: %s: %s", de.Name(), oneLine(describeDecode(de.Unwrap())))
	}
	return fmt.Errorf("config: %s", oneLine(err))
}

// firstDecodeError finds the first mapstructure error that names a field.
func firstDecodeError(err error) *mapstructure.DecodeError {
	var de *mapstructure.DecodeError
	if errors.As(err, &de) {
		return de
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if d := firstDecodeError(e); d != nil {
				return d
			}
		}
	}
	return nil
}

func describeDecode(err error) error {
	var pe *mapstructure.ParseError
	if errors.As(err, &pe) {
		return fmt.Errorf("not a valid %s: %v", pe.Expected.Type(), pe.Value)
	}
	var ue *mapstructure.UnconvertibleTypeError
	if errors.As(err, &ue) {
		return fmt.Errorf("expected a %s, got %v", ue.Expected.Type(), ue.Value)
	}
	return err
}

// oneLine folds an error message onto one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// validateStorage checks project, store.* and snapshot.*.
func (c *Config) validateStorage(bad func(key, format string, args ...any) error) error {
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

// Validate checks every value; the error names the key.
func (c *Config) Validate() error {
	bad := func(key, format string, args ...any) error {
		return fmt.Errorf("config: %s: %s", key, fmt.Sprintf(format, args...))
	}
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return bad("log_level", "must be debug, info, warn or error, got %q", c.LogLevel)
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
	if err := c.validateStorage(bad); err != nil {
		return err
	}
	if c.Session.TTL <= 0 {
		return bad("session.ttl", "must be positive, got %s", c.Session.TTL)
	}
	if c.Session.KeepaliveMargin <= 0 || c.Session.KeepaliveMargin >= c.Session.TTL {
		return bad("session.keepalive_margin", "must be positive and less than session.ttl (%s), got %s", c.Session.TTL, c.Session.KeepaliveMargin)
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
	known := map[string]bool{}
	var names []string
	for _, cp := range abi.Capabilities() {
		known[string(cp)] = true
		names = append(names, string(cp))
	}
	for i, p := range c.Plugins {
		key := fmt.Sprintf("plugins[%d]", i)
		if strings.TrimSpace(p.Path) == "" {
			return bad(key+".path", "is empty")
		}
		for _, g := range p.Grants {
			if !known[g] {
				return bad(key+".grants", "unknown capability %q (known: %s)", g, strings.Join(names, ", "))
			}
		}
		envNames := make([]string, 0, len(p.Env))
		for name := range p.Env {
			envNames = append(envNames, name)
		}
		sort.Strings(envNames)
		for _, name := range envNames {
			if name == "" || strings.ContainsAny(name, "=\x00") {
				return bad(key+".env", "invalid variable name %q", name)
			}
		}
	}
	return nil
}
