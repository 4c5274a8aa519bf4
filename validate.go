package toolhost

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/egress"
	"github.com/toolhost/toolhost/internal/module"
	policyengine "github.com/toolhost/toolhost/internal/policy"
	"github.com/toolhost/toolhost/internal/snapshot"
	"github.com/toolhost/toolhost/internal/storekeys"
	"github.com/toolhost/toolhost/internal/webfetch"
)

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
	if c.Session.Autosave < 0 || (c.Session.Autosave > 0 && c.Session.Autosave < time.Second) {
		return bad("session.autosave", "must be 0 (off) or at least 1s, got %s", c.Session.Autosave)
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
	if err := c.validateModules(); err != nil {
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

// settings are the keys a module may honour or check against.
func (c *Config) settings() module.Settings {
	mib := func(v int64) int64 {
		if v < 0 {
			return -1 // no limit
		}
		return v << 20
	}
	sb := c.Sandbox
	pool := 0
	if v, err := c.Get("sandbox.pool"); err == nil { // the local module's key
		pool, _ = v.(int)
	}
	return module.Settings{
		Pool:        pool,
		Providers:   ProviderNamesOf(sb.Provider),
		StoreKind:   c.Store.Kind,
		Network:     sb.Network,
		MemoryBytes: mib(sb.MemoryMiB), Processes: sb.Processes, CPUs: sb.CPUs,
		TmpBytes: mib(sb.TmpMiB), ShmBytes: mib(sb.ShmMiB), DiskBytes: mib(sb.DiskMiB), OpenFiles: sb.OpenFiles,
		TTL: c.Session.TTL, MaxLifetime: c.Session.MaxLifetime, KeepaliveMargin: c.Session.KeepaliveMargin,
	}
}

// validateModules runs the Validate of every registered provider and store: a bad value
// is a mistake whether or not the module is chosen (each checks what matters only when it
// is chosen only then).
func (c *Config) validateModules() error {
	set := c.settings()
	for _, m := range append(module.Providers(), module.Stores()...) {
		if err := m.Validate(c.Module(m.Name), set); err != nil {
			return err
		}
	}
	return nil
}

// knownList is the registered modules' names for a message, or what to do when there are
// none: the root package registers no module of its own.
func knownList(names []string) string {
	if len(names) == 0 {
		return "none is registered: import github.com/toolhost/toolhost/modules/standard for the built-ins"
	}
	return strings.Join(names, ", ")
}

func (c *Config) validateSandbox(bad badKey) error {
	seen := map[string]bool{}
	for _, name := range ProviderNamesOf(c.Sandbox.Provider) {
		if _, ok := module.LookupProvider(name); !ok {
			return bad("sandbox.provider", "unknown provider %q (known: %s; several, tried in order, as a comma-separated list such as e2b,local)",
				name, knownList(ProviderNames()))
		}
		if seen[name] {
			return bad("sandbox.provider", "%q is listed twice in %q", name, c.Sandbox.Provider)
		}
		seen[name] = true
	}
	if err := c.validateEgress(bad); err != nil {
		return err
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
	return nil
}

// validateStorage checks project, store.* and snapshot.*.
func (c *Config) validateStorage(bad badKey) error {
	if err := storekeys.ValidProject(c.Project); err != nil {
		return bad("project", "%v", err)
	}
	if _, ok := module.LookupStore(c.Store.Kind); !ok {
		return bad("store.kind", "unknown store %q (known: %s)", c.Store.Kind, knownList(storeKinds()))
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
	// tar.gz is what older configurations may say: it loads, with a warning (openStorage).
	if f := c.Snapshot.Format; f != "" && f != snapshot.FormatChunked && f != snapshot.FormatTarGz {
		return bad("snapshot.format", "must be chunked (snapshots are stored chunked; `toolhost snapshot export` writes one as a tar.gz), got %q", f)
	}
	if c.Snapshot.Grace < 0 || (c.Snapshot.Grace > 0 && c.Snapshot.Grace < time.Minute) {
		return bad("snapshot.grace", "must be at least 1m, got %s", c.Snapshot.Grace)
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
	for _, k := range c.Registry.Keys {
		if !filepath.IsAbs(k) {
			return bad("registry.keys", "%q is not an absolute path (a key file relative to the working directory could be one a sandbox wrote)", k)
		}
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
		}{{p.Files != nil, abi.CapSandboxFiles}, {p.Exec != nil, abi.CapSandboxExec}, {p.Store != nil, abi.CapStore}, {p.Capture != nil, abi.CapCapture}, {p.Web != nil, abi.CapWeb}} {
			if s.set && !slices.Contains(p.Grants, s.c) {
				return bad(key+"."+string(s.c), "scopes a capability the plugin is not granted: add %s to its grants, or remove this", s.c)
			}
		}
		if _, err := policyengine.Compile(p.Scope); err != nil {
			return bad(key, "%v", err)
		}
		if p.Web != nil {
			if err := webfetch.Check(p.Web); err != nil {
				return bad(key+".web", "%v", err)
			}
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

func (c *Config) validateServe(bad badKey) error {
	s := &c.Serve
	if strings.TrimSpace(s.Listen) == "" {
		return bad("serve.listen", "is empty (e.g. 127.0.0.1:8750)")
	}
	for i, t := range s.Tokens {
		key := fmt.Sprintf("serve.tokens[%d]", i)
		if len(t.Token) < 16 {
			return bad(key+".token", "must be at least 16 characters (openssl rand -hex 32 makes one)")
		}
		for _, p := range t.Projects {
			if err := storekeys.ValidProject(p); err != nil {
				return bad(key+".projects", "%v", err)
			}
		}
		if t.Egress != nil {
			if c.Sandbox.Network != NetworkEgress {
				return bad(key+".egress", "narrows the egress policy, which needs sandbox.network egress (it is %s)", c.Sandbox.Network)
			}
			if err := c.checkNarrowing(t.Egress); err != nil {
				return bad(key+".egress", "%v", err)
			}
		}
	}
	for project, dir := range s.Workspaces {
		if err := storekeys.ValidProject(project); err != nil {
			return bad("serve.workspaces", "%v", err)
		}
		if !filepath.IsAbs(dir) {
			return bad("serve.workspaces."+project, "must be an absolute path, got %q", dir)
		}
	}
	if s.MaxSessions < 1 {
		return bad("serve.max_sessions", "must be at least 1, got %d", s.MaxSessions)
	}
	if s.IdleTimeout <= 0 {
		return bad("serve.idle_timeout", "must be positive, got %s", s.IdleTimeout)
	}
	switch s.Drain {
	case DrainClose, DrainHandoff:
	default:
		return bad("serve.drain", "must be %s or %s, got %q", DrainClose, DrainHandoff, s.Drain)
	}
	if err := validateFleet(&s.Fleet, bad); err != nil {
		return err
	}
	if s.MaxBodyBytes < 64<<10 {
		return bad("serve.max_body_bytes", "must be at least 65536, got %d", s.MaxBodyBytes)
	}
	return nil
}

func validateFleet(f *FleetConfig, bad badKey) error {
	if f.Advertise == "" {
		if f.SecretFile != "" || len(f.Peers) > 0 {
			return bad("serve.fleet.advertise", "is empty while serve.fleet.secret_file or serve.fleet.peers is set: a replica of a fleet says where the others reach it (http://ADDRESS:PORT)")
		}
		return nil
	}
	u, err := url.Parse(f.Advertise)
	if err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Host == "" || u.Path != "" && u.Path != "/" || u.User != nil || u.RawQuery != "" {
		return bad("serve.fleet.advertise", "must be a URL of the form http://ADDRESS:PORT, got %q", f.Advertise)
	}
	// The other replicas dial it, and check it against serve.fleet.peers, as an address:
	// a name (or a variable the shell did not expand, $(POD_IP)) is refused here.
	if _, err := netip.ParseAddr(strings.Trim(u.Hostname(), "[]")); err != nil || u.Port() == "" {
		return bad("serve.fleet.advertise", "must name this replica by IP address and port (http://10.1.2.3:8750), got %q", f.Advertise)
	}
	if f.SecretFile == "" {
		return bad("serve.fleet.secret_file", "is empty: the replicas of a fleet sign what they send each other with a shared secret (openssl rand -hex 32 > FILE; chmod 600 FILE)")
	}
	if !filepath.IsAbs(f.SecretFile) {
		return bad("serve.fleet.secret_file", "must be an absolute path, got %q", f.SecretFile)
	}
	if f.OrphanAfter < time.Second {
		return bad("serve.fleet.orphan_after", "must be at least 1s, got %s (how long the sandboxes of a project nobody holds wait for a replica to reconnect; default 15m)", f.OrphanAfter)
	}
	for _, p := range f.Peers {
		if _, err := netip.ParsePrefix(p); err != nil {
			return bad("serve.fleet.peers", "%q is not an address range (CIDR, e.g. 10.0.0.0/8)", p)
		}
	}
	return nil
}

func (c *Config) validateEgress(bad badKey) error {
	switch c.Sandbox.Network {
	case NetworkEgress, NetworkNone, NetworkHost:
	default:
		return bad("sandbox.network", "must be \"egress\", \"none\" or \"host\", got %q", c.Sandbox.Network)
	}
	e := &c.Sandbox.Egress
	if _, ok := egress.Preset(e.Preset); !ok {
		return bad("sandbox.egress.preset", "must be one of %s, got %q", strings.Join(egress.PresetNames(), ", "), e.Preset)
	}
	if _, err := c.hostPolicy(); err != nil {
		key := "sandbox.egress"
		if se, ok := errors.AsType[*egress.SpecError](err); ok {
			key += "." + se.Field // the Spec's fields are named as the keys are
		}
		return bad(key, "%v", err)
	}
	if e.MaxBytes == 0 || e.MaxBytes < -1 {
		return bad("sandbox.egress.max_bytes", "must be positive, or -1 for no bound, got %d", e.MaxBytes)
	}
	if e.MaxConns < 1 {
		return bad("sandbox.egress.max_conns", "must be at least 1, got %d", e.MaxConns)
	}
	if e.IdleTimeout <= 0 {
		return bad("sandbox.egress.idle_timeout", "must be positive, got %s", e.IdleTimeout)
	}
	if _, err := parseResolver(e.Resolver); err != nil {
		return bad("sandbox.egress.resolver", "%v", err)
	}
	if e.CAFile != "" && !filepath.IsAbs(e.CAFile) {
		return bad("sandbox.egress.ca_file", "must be an absolute path, got %q", e.CAFile)
	}
	for i, in := range e.Inject {
		key := fmt.Sprintf("sandbox.egress.inject[%d]", i)
		if in.Domain == "" || strings.HasPrefix(in.Domain, "*") {
			return bad(key+".domain", "must be one exact domain name, got %q", in.Domain)
		}
		if in.Header == "" {
			return bad(key+".header", "is empty (e.g. Authorization)")
		}
		if !strings.HasPrefix(in.Secret, "env:") && !strings.HasPrefix(in.Secret, "file:") {
			return bad(key+".secret", "must name where the value is, env:VAR or file:/abs/path (never the value itself), got %q", redactShort(in.Secret))
		}
	}
	return nil
}

// redactShort shows the kind of a secret reference, never what may be a value.
func redactShort(s string) string {
	if k, _, ok := strings.Cut(s, ":"); ok && len(k) <= 8 {
		return k + ":..."
	}
	return "[not shown]"
}

// parseResolver reads sandbox.egress.resolver: "system", or a DNS server "IP" or
// "IP:PORT".
func parseResolver(s string) (netip.AddrPort, error) {
	if s == "system" {
		return netip.AddrPort{}, nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return netip.AddrPortFrom(a, 53), nil
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("must be \"system\" or a DNS server's address (IP or IP:PORT), got %q", s)
	}
	return ap, nil
}
