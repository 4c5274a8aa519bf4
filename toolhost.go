// Package toolhost assembles everything an AI coding agent's tools need from one Config:
// the plugin host with its plugins (the built-ins are embedded), a sandbox provider chosen
// by name, the object store, snapshots, screenshots, and sessions that keep a project's
// workspace alive across sandboxes. The toolhost CLI is a thin layer over it; so is any
// program that embeds toolhost.
//
//	cfg := toolhost.DefaultConfig()
//	cfg.Project = "shop"
//	th, err := toolhost.New(ctx, cfg)
//	...
//	defer th.Close(ctx)
//	sess, err := th.Open(ctx, toolhost.SessionOptions{})
//	...
//	defer sess.Close(ctx)
//	res, err := sess.Dispatch(ctx, "bash", json.RawMessage(`{"command": "ls -la"}`))
//
// A session dispatches tool calls (tool_use blocks in, tool_result content out), lists the
// tools to send to the model, commits snapshots of its workspace, lists its screenshots
// and closes. The runnable Example shows a whole session: a page served from the sandbox,
// its screenshot, a commit.
//
// The providers and stores a Config names are modules the program links: this package
// registers none, and importing modules/standard registers the built-ins (providers local,
// e2b and kubernetes, stores dir and s3):
//
//	import _ "github.com/toolhost/toolhost/modules/standard"
//
// The local provider runs the sandbox's agent by re-executing the program's own binary:
// main calls Reexec first.
package toolhost

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/audit"
	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/builtins"
	"github.com/toolhost/toolhost/internal/capture"
	"github.com/toolhost/toolhost/internal/egress"
	"github.com/toolhost/toolhost/internal/host"
	"github.com/toolhost/toolhost/internal/lease"
	"github.com/toolhost/toolhost/internal/module"
	"github.com/toolhost/toolhost/internal/reexec"
	"github.com/toolhost/toolhost/internal/rootapi"
	"github.com/toolhost/toolhost/internal/screenshot"
	"github.com/toolhost/toolhost/internal/snapshot"
	"github.com/toolhost/toolhost/internal/webfetch"
	"github.com/toolhost/toolhost/policy"
)

// Option sets what is not configuration: where logs go, who watches transfers.
type Option func(*options)

type options struct {
	log        *slog.Logger
	snapLog    *slog.Logger
	progress   func(SnapshotProgress)
	configFile string
	audit      audit.Sink
	egressNet  *egressNet // tests: the internet the gateway reaches (withEgressNet)
	onDemand   bool       // host.Config.OnDemand (experimental.OneShot)
}

// WithLogger sends the logs of the host, the plugins, the sandbox provider, the browser
// and the sessions to l (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithSnapshotLogger sends the snapshot manager's records (a line per save, retry,
// retention delete and restore) to l instead of the logger.
func WithSnapshotLogger(l *slog.Logger) Option { return func(o *options) { o.snapLog = l } }

// WithSnapshotProgress calls fn as snapshot transfers move bytes.
func WithSnapshotProgress(fn func(SnapshotProgress)) Option {
	return func(o *options) { o.progress = fn }
}

// WithConfigFile names the file the configuration was read from: like the data dir and the
// plugins, it may never lie in a workspace a sandbox can write (see CheckWorkspace).
func WithConfigFile(path string) Option { return func(o *options) { o.configFile = path } }

// WithAudit sends a record of every host call and tool call of the plugins to s (package
// audit; an audit.Recorder keeps them in memory), besides audit.file when that is
// set.
func WithAudit(s audit.Sink) Option { return func(o *options) { o.audit = s } }

func newOptions(opts []Option) options {
	var o options
	for _, f := range opts {
		f(&o)
	}
	if o.log == nil {
		o.log = slog.Default()
	}
	if o.snapLog == nil {
		o.snapLog = o.log
	}
	return o
}

// Storage is the object store of a configuration and what sits on it: the projects'
// snapshots and stored screenshots. It needs no plugins and no sandbox: the CLI's
// snapshot and screenshot commands use it alone.
type Storage struct {
	cfg    Config
	store  store.Store
	where  string
	shared bool // several hosts may share the store (module.Opened.Shared)
	snaps  *snapshot.Manager
	rec    *screenshot.Recorder // its Capturer is the Toolhost's, or nil
	close  func() error
}

// OpenStorage opens the configured store (store.*) and the snapshot manager on it
// (snapshot.*).
func OpenStorage(ctx context.Context, cfg Config, opts ...Option) (*Storage, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return openStorage(ctx, &cfg, newOptions(opts))
}

func openStorage(ctx context.Context, cfg *Config, o options) (*Storage, error) {
	s := &Storage{cfg: cloneConfig(*cfg), close: func() error { return nil }}
	m, ok := module.LookupStore(cfg.Store.Kind)
	if !ok { // Validate checked; the registry cannot shrink
		return nil, fmt.Errorf("store %q is not registered", cfg.Store.Kind)
	}
	opened, err := m.Open(ctx, cfg.Module(cfg.Store.Kind), module.Env{Logger: o.log, DataDir: cfg.DataDir, Settings: cfg.settings()})
	if err != nil {
		return nil, err
	}
	s.store, s.where, s.shared = opened.Store, opened.Where, opened.Shared
	if opened.Close != nil {
		s.close = opened.Close
	}
	if cfg.Snapshot.Format == snapshot.FormatTarGz {
		o.log.Warn("snapshot.format: tar.gz is no longer a storage format: new snapshots are stored chunked " +
			"(tar.gz snapshots already stored still restore, and a project's are converted on its next wake); " +
			"`toolhost snapshot export` writes a snapshot as a tar.gz. Remove snapshot.format from the configuration.")
	}
	// snapshot.Config reads a zero Retries as its default; here zero means none.
	retries := cfg.Snapshot.Retries
	if retries == 0 {
		retries = -1
	}
	snaps, err := snapshot.New(snapshot.Config{
		Store:    s.store,
		Keep:     cfg.Snapshot.Keep,
		Grace:    cfg.Snapshot.Grace,
		Excludes: cfg.Snapshot.Excludes,
		Retries:  retries,
		Logger:   o.snapLog,
		Progress: progressOf(o.progress),
	})
	if err != nil {
		s.close()
		return nil, fmt.Errorf("snapshots: %w", err)
	}
	s.snaps = snaps
	s.rec = &screenshot.Recorder{Store: s.store, PublicBase: cfg.Store.PublicBase, Logger: o.log}
	return s, nil
}

// Store is the object store.
func (s *Storage) Store() store.Store { return s.store }

// Where names the store for people: its directory, or s3://BUCKET.
func (s *Storage) Where() string { return s.where }

// Shared reports whether several hosts may share the store (an S3 bucket), so records
// that hosts add up belong in it.
func (s *Storage) Shared() bool { return s.shared }

// Close releases the store.
func (s *Storage) Close() error { return s.close() }

// Toolhost is the host, its plugins, the store, snapshots and screenshots of one Config,
// and the sandbox provider its sessions run in. It is safe for concurrent use; open as
// many sessions as needed.
type Toolhost struct {
	cfg      Config
	opts     options
	instance string // names this process in session records and sandbox labels
	storage  *Storage
	host     *host.Host
	capt     *screenshot.Capturer // nil when screenshot.enabled is false
	rec      *screenshot.Recorder // nil when screenshot.enabled is false
	audit    *audit.Writer        // audit.file's, or nil
	sink     audit.Sink           // every audit record goes here: audit.file's and WithAudit's, or nil

	egress gatewayState // the egress gateway, made with the first session that needs it

	provMu   sync.Mutex
	provider sandbox.Provider // made on the first Open (or Provider): members alone or chained
	lifeCap  time.Duration    // the provider's lifetime bound (E2B's plan's), or 0

	leaseMu  sync.Mutex
	leaseOK  bool                     // the store was checked: it keeps leases (see takeLease)
	leaseOff bool                     // the store cannot keep leases
	leases   map[string]*projectLease // by project: the lease its open sessions share
	fleet    *rootapi.FleetMember     // set when serving as a replica of a fleet (rootapi.SetFleet)

	claimMu sync.Mutex
	claimed map[string]bool // "project/session": records a session of this process took over
	// left are "project/session" of this process's sessions handed over (handoff): their
	// records may be taken over by a later session of this very process, as by another's.
	left map[string]bool

	closeOnce sync.Once
	closeErr  error
}

// Reexec runs this process as one of toolhost's helpers when toolhost started it as one
// and then exits; otherwise it returns at once. The local sandbox's agent and the browser
// sandbox's wrapper and forwarder are the program's own binary, re-executed: call Reexec
// first in main (and in TestMain of tests that open sessions or take screenshots). Without
// it the local provider and the sandboxed browser refuse to start, rather than run the
// program's main in the helper's place.
func Reexec() { reexec.Main() }

// New validates cfg, opens the store and loads the plugins. The sandbox provider is made
// when the first session opens (so listing tools needs no sandbox), and the browser when
// the first screenshot is taken.
func New(ctx context.Context, cfg Config, opts ...Option) (*Toolhost, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	o := newOptions(opts)
	t := &Toolhost{cfg: cloneConfig(cfg), opts: o, instance: newInstance()}
	specs, err := t.pluginSpecs()
	if err != nil {
		return nil, err
	}
	st, err := openStorage(ctx, &t.cfg, o)
	if err != nil {
		return nil, err
	}
	t.storage = st
	hc := host.Config{
		DataDir:            cfg.DataDir,
		Plugins:            specs,
		MemoryLimitMiB:     cfg.Limits.MemoryMiB,
		CallTimeout:        cfg.Limits.CallTimeout,
		PoolSize:           cfg.Limits.PoolSize,
		DefaultExecTimeout: cfg.Limits.ExecTimeoutDefault,
		MaxExecTimeout:     cfg.Limits.ExecTimeoutMax,
		MaxReadBytes:       cfg.Limits.ReadMaxBytes,
		MaxExecOutputBytes: cfg.Limits.ExecOutputMaxBytes,
		Logger:             o.log,
		Store:              st.store,
		OnDemand:           o.onDemand,
	}
	if cfg.Audit.File != "" {
		w, err := audit.Create(cfg.Audit.File)
		if err != nil {
			t.Close(ctx)
			return nil, fmt.Errorf("audit.file: %w", err)
		}
		t.audit = w
		hc.Audit = w
	}
	switch {
	case o.audit != nil && hc.Audit != nil:
		hc.Audit = audit.Tee{t.audit, o.audit}
	case o.audit != nil:
		hc.Audit = o.audit
	}
	t.sink = hc.Audit
	if cfg.Screenshot.Enabled {
		t.capt = screenshot.New(screenshot.Config{
			ExecutablePath: cfg.Screenshot.Chromium,
			IdleBound:      cfg.Screenshot.IdleWait,
			Logger:         o.log,
		})
		if err := t.capt.Check(); err != nil {
			// Not fatal: take_screenshot answers with this, as an is_error result.
			o.log.Debug("screenshots will fail", "err", err)
		}
		t.rec = &screenshot.Recorder{Capturer: t.capt, Store: st.store, PublicBase: cfg.Store.PublicBase, Logger: o.log}
		st.rec = t.rec
		hc.Capturer = capture.Of(t.rec)
	}
	if slices.ContainsFunc(cfg.Plugins, func(p Plugin) bool { return slices.Contains(p.Grants, abi.CapWeb) }) {
		// A plugin granted web fetches through the sandboxes' egress gateway (one resolver,
		// one trust store, one audit trail and one count per project), within its own web
		// scope: the operator names what the plugin may reach, apart from what sandboxes
		// may. The gateway resolves every name itself and refuses loopback, private,
		// link-local and metadata addresses and the host's own.
		gs, err := t.gateway()
		if err != nil {
			t.Close(ctx)
			return nil, err
		}
		f, err := webfetch.New(webfetch.Config{Gateway: gs.g, RootCAs: gs.roots})
		if err != nil {
			t.Close(ctx)
			return nil, err
		}
		hc.Fetcher = f
	}
	h, err := host.New(ctx, hc)
	if err != nil {
		t.Close(ctx)
		return nil, fmt.Errorf("loading plugins: %w", err)
	}
	t.host = h
	return t, nil
}

func cloneConfig(c Config) Config {
	c.Plugins = append([]Plugin(nil), c.Plugins...)
	for i := range c.Plugins {
		p := &c.Plugins[i]
		p.Grants = slices.Clone(p.Grants)
		p.Env, p.Secrets = maps.Clone(p.Env), maps.Clone(p.Secrets)
		p.Scope = cloneScope(p.Scope)
	}
	c.Snapshot.Excludes = append([]string(nil), c.Snapshot.Excludes...)
	c.Registry.Keys, c.Registry.AllowUnsigned = slices.Clone(c.Registry.Keys), slices.Clone(c.Registry.AllowUnsigned)
	e := &c.Sandbox.Egress
	e.Allow, e.Deny, e.Ports, e.Inject = slices.Clone(e.Allow), slices.Clone(e.Deny), slices.Clone(e.Ports), slices.Clone(e.Inject)
	c.modules = cloneModules(c.modules)
	c.Serve.Tokens = slices.Clone(c.Serve.Tokens)
	c.Serve.Workspaces = maps.Clone(c.Serve.Workspaces)
	for i := range c.Serve.Tokens {
		c.Serve.Tokens[i].Projects = slices.Clone(c.Serve.Tokens[i].Projects)
		if e := c.Serve.Tokens[i].Egress; e != nil {
			c.Serve.Tokens[i].Egress = &EgressPolicy{Preset: e.Preset, Allow: slices.Clone(e.Allow), Deny: slices.Clone(e.Deny), Ports: slices.Clone(e.Ports)}
		}
	}
	return c
}

// pluginSpecs resolves the configured plugins: files, or the embedded built-ins.
func (t *Toolhost) pluginSpecs() ([]host.PluginSpec, error) {
	cfg := &t.cfg
	dir := ""
	if cfg.PluginsDir != "" {
		d, err := filepath.Abs(cfg.PluginsDir)
		if err != nil {
			return nil, fmt.Errorf("plugins_dir: %w", err)
		}
		dir = d
	}
	var specs []host.PluginSpec
	for i, p := range cfg.Plugins {
		spec := host.PluginSpec{Path: p.Path, Grants: append([]abi.Capability(nil), p.Grants...),
			Scope: cloneScope(p.Scope), MemoryLimitMiB: p.Limits.MemoryMiB, CallTimeout: p.Limits.CallTimeout,
			CallsPerMinute: p.Limits.CallsPerMinute}
		secrets, err := secretValues(p)
		if err != nil {
			return nil, fmt.Errorf("plugins[%d]: %w", i, err)
		}
		spec.Secrets = secrets
		for k, v := range p.Env {
			if spec.Env == nil {
				spec.Env = map[string]string{}
			}
			spec.Env[k] = v
		}
		switch path, err := t.pluginPath(p.Path, dir); {
		case err != nil:
			return nil, fmt.Errorf("plugins[%d]: %w", i, err)
		case path == "":
			wasm, err := builtins.Wasm(p.Path)
			if err != nil {
				return nil, fmt.Errorf("plugins[%d]: %w", i, err)
			}
			spec.Path, spec.Wasm = "builtin:"+p.Path, wasm
			var seeds []host.Seed
			if err := json.Unmarshal(builtins.Seeds(p.Path), &seeds); err == nil {
				spec.Seeds = seeds // each used only under the environment it was made with
			}
		default:
			spec.Path = path
		}
		specs = append(specs, spec)
	}
	return specs, nil
}

// cloneScope copies a scope's lists, so a Toolhost's configuration is its own.
func cloneScope(s policy.Scope) policy.Scope {
	if f := s.Files; f != nil {
		s.Files = &policy.Files{Read: slices.Clone(f.Read), Write: slices.Clone(f.Write)}
	}
	if e := s.Exec; e != nil {
		s.Exec = &policy.Exec{Programs: slices.Clone(e.Programs), MaxTimeout: e.MaxTimeout, Env: slices.Clone(e.Env)}
	}
	if st := s.Store; st != nil {
		c := *st
		s.Store = &c
	}
	if c := s.Capture; c != nil {
		s.Capture = &policy.Capture{Ports: slices.Clone(c.Ports)}
	}
	if w := s.Web; w != nil {
		s.Web = &policy.Web{Preset: w.Preset, Allow: slices.Clone(w.Allow), Deny: slices.Clone(w.Deny), Ports: slices.Clone(w.Ports)}
	}
	return s
}

// pluginPath is the file a plugin path names, or "" for a built-in. dir is the absolute
// plugins_dir, or "".
func (t *Toolhost) pluginPath(p, dir string) (string, error) {
	switch {
	case filepath.IsAbs(p):
	case dir != "":
		p = filepath.Join(dir, p)
	default:
		if _, ok := builtins.Lookup(p); !ok {
			return "", fmt.Errorf("%s is not a built-in plugin (%s): give its absolute path, or set plugins_dir", p, builtins.Files())
		}
		return "", nil
	}
	if _, err := os.Stat(p); err != nil {
		hint := ""
		if errors.Is(err, os.ErrNotExist) && dir != "" {
			hint = " (relative plugin paths resolve against plugins_dir; leave plugins_dir empty to use the built-in plugins)"
		}
		return "", fmt.Errorf("%w%s", err, hint)
	}
	return p, nil
}

// Config is the configuration t was made with.
func (t *Toolhost) Config() Config { return cloneConfig(t.cfg) }

// Tools returns every tool's definition, in plugin load order: the tools of a Messages
// API request.
func (t *Toolhost) Tools() []abi.Tool { return t.host.Tools() }

// Plugins describes the loaded plugins, in load order.
func (t *Toolhost) Plugins() []PluginInfo { return pluginInfos(t.host.Plugins()) }

// Storage is the store with the snapshots and screenshots on it.
func (t *Toolhost) Storage() *Storage { return t.storage }

// CheckBrowser says why screenshots cannot be taken here (screenshots off, no browser
// installed), or nil.
func (t *Toolhost) CheckBrowser() error {
	if t.capt == nil {
		return errors.New("screenshots are off (screenshot.enabled: false)")
	}
	return t.capt.Check()
}

// Close closes the host, the browser, the provider and the store. Sessions should be
// closed first. It waits at most until ctx ends.
func (t *Toolhost) Close(ctx context.Context) error {
	t.closeOnce.Do(func() {
		var errs []error
		if t.host != nil {
			errs = append(errs, t.host.Close(ctx))
		}
		if t.capt != nil {
			if err := t.capt.Close(ctx); err != nil {
				errs = append(errs, fmt.Errorf("closing the browser: %w", err))
			}
		}
		t.provMu.Lock()
		if t.provider != nil {
			if err := sandbox.CloseProvider(ctx, t.provider); err != nil {
				errs = append(errs, fmt.Errorf("closing the sandbox provider: %w", err))
			}
		}
		t.provMu.Unlock()
		// Leases of sessions left open end with the Toolhost: their renewals stop.
		t.leaseMu.Lock()
		held := slices.Collect(maps.Values(t.leases))
		t.leases = nil
		t.leaseMu.Unlock()
		for _, e := range held {
			<-e.ready
			if e.l != nil {
				errs = append(errs, e.l.Release(ctx))
			}
		}
		if t.storage != nil {
			errs = append(errs, t.storage.Close())
		}
		if t.audit != nil {
			errs = append(errs, t.audit.Close(ctx))
		}
		t.closeErr = errors.Join(errs...)
	})
	return t.closeErr
}

// progressOf adapts a SnapshotProgress callback to the snapshot manager's.
func progressOf(fn func(SnapshotProgress)) func(snapshot.Progress) {
	if fn == nil {
		return nil
	}
	return func(p snapshot.Progress) {
		fn(SnapshotProgress{Project: p.ProjectID, Phase: p.Phase, Done: p.Done, Total: p.Total})
	}
}

// SnapshotProgress is a transfer moving bytes (WithSnapshotProgress).
type SnapshotProgress struct {
	Project string
	// Phase is "pack", "upload", "download" or "extract".
	Phase string
	Done  int64
	// Total is the phase's size in bytes, or -1 when unknown.
	Total int64
}

// PluginInfo describes a loaded plugin.
type PluginInfo struct {
	Name, Version string
	// Path is the module's file, or builtin:NAME.wasm for a built-in.
	Path string
	// Tools are the names of its tools.
	Tools []string
	// Imports are the host functions it imports ("toolhost_sandbox_exec", "exec").
	Imports []PluginImport
	// Grants are the capabilities it was granted; Scope narrows them.
	Grants []abi.Capability
	Scope  policy.Scope
	// Secrets names its secrets (never their values).
	Secrets []string
}

// PluginImport is one function a plugin imports.
type PluginImport struct {
	Module, Name string
}

func pluginInfos(in []host.PluginInfo) []PluginInfo {
	out := make([]PluginInfo, len(in))
	for i, p := range in {
		out[i] = PluginInfo{Name: p.Name, Version: p.Version, Path: p.Path, Tools: p.Tools, Grants: p.Grants, Scope: p.Scope, Secrets: p.Secrets}
		for _, imp := range p.Imports {
			out[i].Imports = append(out[i].Imports, PluginImport{Module: imp.Module, Name: imp.Name})
		}
	}
	return out
}

// projectLease is a project's lease, shared by the sessions of one Toolhost that have
// the project open: a lease keeps other hosts out, not other sessions of this one (the
// embedding program decides those, as the demo's wake step does).
type projectLease struct {
	project string
	ready   chan struct{} // closed once the acquisition ended; then l or err is set
	l       *lease.Lease
	err     error
	users   int // sessions holding it (and one acquiring), under Toolhost.leaseMu
}

// check is why the sessions sharing e may no longer act on the project, or nil (also
// when e is nil: leases are off).
func (e *projectLease) check() error {
	if e == nil {
		return nil
	}
	if err := e.l.Fence(); err != nil {
		return fmt.Errorf("project %s: this session lost the project's lease (another host may have opened the project): open a new session: %w", e.project, err)
	}
	return nil
}

// newInstance names this process (a Toolhost) in records and sandbox labels.
func newInstance() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "i-" + hex.EncodeToString(b[:])
}

// egressNet is what the gateway dials (and asks its DNS server through), and the host
// addresses it refuses; by default this machine's network. Tests give it their own
// internet (internal/testnet).
type egressNet struct {
	dial      func(ctx context.Context, network, addr string) (net.Conn, error)
	hostAddrs *egress.HostAddrs
}

// gatewayState is the Toolhost's egress gateway, made with the first session that needs
// it.
type gatewayState struct {
	once sync.Once
	g    *egress.Gateway
	host *egress.Policy
	// trust is sandbox.egress.ca_file's certificates, which sandboxes trust too; roots
	// are the host's roots with them, which verify the servers the host itself talks to
	// through the gateway (web fetches); nil without a CA file: the host's roots.
	trust  []byte
	roots  *x509.CertPool
	inject []egress.Injection
	err    error

	mu    sync.Mutex
	stats map[string]*egressStats // by project
}

// egressStats counts a project's connections through the gateway.
type egressStats struct {
	Allowed, Refused atomic.Int64
}

// gateway makes (once) and returns the egress gateway.
func (t *Toolhost) gateway() (*gatewayState, error) {
	s := &t.egress
	s.once.Do(func() { s.err = t.makeGateway(s) })
	return s, s.err
}

func (t *Toolhost) makeGateway(s *gatewayState) error {
	cfg := &t.cfg.Sandbox.Egress
	var err error
	if s.host, err = t.cfg.hostPolicy(); err != nil {
		return fmt.Errorf("sandbox.egress: %w", err)
	}
	gc := egress.Config{Logger: t.opts.log.With("component", "egress"), Audit: t.egressAudit}
	// Without a CA file the roots stay nil, the host's own, which crypto/tls loads at the
	// first TLS handshake: parsing the system's roots costs ~20 ms of CPU, which a
	// session that never speaks TLS from the host (every one-shot call) need not pay.
	var roots *x509.CertPool
	if cfg.CAFile != "" {
		if roots, err = x509.SystemCertPool(); err != nil || roots == nil {
			roots = x509.NewCertPool()
		}
		b, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return fmt.Errorf("sandbox.egress.ca_file: %w", err)
		}
		if !roots.AppendCertsFromPEM(b) {
			return fmt.Errorf("sandbox.egress.ca_file %s: no PEM certificate in it", cfg.CAFile)
		}
		s.trust = pemOnly(b)
	}
	if n := t.opts.egressNet; n != nil {
		gc.HostAddrs = n.hostAddrs
		gc.Dialer = dialerFunc(n.dial)
	}
	gc.RootCAs = roots
	s.roots = roots
	server, err := parseResolver(cfg.Resolver)
	if err != nil {
		return err
	}
	if server.IsValid() {
		gc.Resolver = &egress.DNSResolver{Server: server, Dialer: gc.Dialer}
	}
	for i, in := range cfg.Inject {
		v, err := secretValue("the secret", in.Secret)
		if err != nil {
			return fmt.Errorf("sandbox.egress.inject[%d] (%s): %w", i, in.Domain, err)
		}
		s.inject = append(s.inject, egress.Injection{Domain: in.Domain, Header: in.Header, Value: v})
	}
	s.g = egress.New(gc)
	t.opts.log.Debug("sandbox network", "mode", t.cfg.Sandbox.Network, "preset", s.host.Preset(),
		"allow", strings.Join(s.host.Allowed(), ","), "ports", s.host.Ports(), "resolver", cfg.Resolver,
		"injected_domains", len(s.inject))
	return nil
}

// pemOnly keeps the certificate blocks of a PEM file (never a key that sits beside them).
func pemOnly(b []byte) []byte {
	var out []byte
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return out
		}
		if blk.Type == "CERTIFICATE" {
			out = append(out, pem.EncodeToMemory(blk)...)
		}
	}
}

type dialerFunc func(ctx context.Context, network, addr string) (net.Conn, error)

func (f dialerFunc) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return f(ctx, network, addr)
}

// egressAudit turns the gateway's records into audit records and counts them per project.
func (t *Toolhost) egressAudit(r *egress.Record) {
	s := &t.egress
	if r.Project != "" {
		s.mu.Lock()
		if s.stats == nil {
			s.stats = map[string]*egressStats{}
		}
		st := s.stats[r.Project]
		if st == nil {
			st = &egressStats{}
			s.stats[r.Project] = st
		}
		s.mu.Unlock()
		if r.Decision == egress.Deny {
			st.Refused.Add(1)
		} else {
			st.Allowed.Add(1)
		}
	}
	sink := t.sink
	if sink == nil {
		return
	}
	why := r.Rule
	msg := r.Reason
	if msg == "" {
		msg = r.Error
	}
	sink.Record(&audit.Record{
		Time: r.Time, Sandbox: r.Sandbox, Cap: audit.CapEgress, Op: r.Proto,
		Dest: r.Name, Addr: r.Addr, Port: r.Port, Command: r.Command, Injected: r.Injected,
		Decision: r.Decision, Why: why, Error: msg,
		Micros: r.Micros, In: int(r.BytesUp), Out: int(r.BytesDown),
	})
}

func hostName() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "unknown"
	}
	return h
}

// fleetMember is the fleet this process serves in, or nil.
func (t *Toolhost) fleetMember() *rootapi.FleetMember {
	t.leaseMu.Lock()
	defer t.leaseMu.Unlock()
	return t.fleet
}
