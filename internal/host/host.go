// Package host runs tool plugins: WebAssembly modules that implement the ABI in package abi.
//
// A Host compiles and validates plugins once (with a compilation cache on disk, bounded),
// keeps a bounded pool of warm instances per plugin, and dispatches tool calls by name. A
// plugin it has loaded before is registered from its record (records.go) and compiled in
// the background, so a warm New costs milliseconds; a call waits for its own plugin. Plugins act
// only through the host functions they were granted; a plugin that imports more than its
// grants is refused at load, before any of its code runs. Sessions bind a Host to a sandbox:
// the host functions of a call act on its session's sandbox.
//
// The host links no browser: the capture capability is served by a Capturer that the
// embedding package (github.com/toolhost/toolhost) wires in, and what a sandbox can do
// beyond sandbox.Sandbox (its dev server) is found with sandbox.As.
package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/audit"
	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/owner"
	"github.com/toolhost/toolhost/internal/policy"
)

// Config configures a Host. Zero values take the defaults documented on each field.
type Config struct {
	// DataDir holds the compilation cache (DataDir/cache). Default: DefaultDataDir().
	DataDir string
	// Plugins to load, in order; a tool name must be unique across them.
	Plugins []PluginSpec
	// MemoryLimitMiB caps each plugin instance's linear memory. Default 128.
	MemoryLimitMiB int
	// CallTimeout is the budget for a plugin's own work in one call; time spent inside
	// host functions does not count (those have their own bounds). Default 10s.
	CallTimeout time.Duration
	// PoolSize is the most instances kept per plugin, and so the most concurrent calls
	// into it. Default 8.
	PoolSize int
	// DefaultExecTimeout applies to a command run without a timeout. Default 60s.
	DefaultExecTimeout time.Duration
	// MaxExecTimeout caps every command's timeout. Default 600s.
	MaxExecTimeout time.Duration
	// MaxReadBytes is the largest file a plugin may read in one call. Default 16 MiB.
	MaxReadBytes int64
	// MaxExecOutputBytes bounds what a command's stdout and stderr each keep (head and
	// tail) before the rest is dropped at the source. Default 64 KiB.
	MaxExecOutputBytes int
	// Logger receives the host's and the plugins' logs. Default slog.Default().
	Logger *slog.Logger
	// Capturer serves the capture capability; without it captures fail with a message
	// that says so.
	Capturer Capturer
	// Store serves the store capability: each plugin gets plugins/{name}/ of it.
	Store store.Store
	// Fetcher serves the web capability (toolhost_web.fetch); nil refuses every fetch,
	// saying the host has no web access.
	Fetcher Fetcher
	// MaxCacheBytes bounds the compilation cache in DataDir/cache: past it, New removes the
	// entries used least recently, in the background (see PruneCache). Default
	// DefaultMaxCacheBytes; negative: never prune.
	MaxCacheBytes int64
	// Audit receives a record of every acting host call and every tool call (package
	// audit); nil, the default, records nothing and costs nothing.
	Audit audit.Sink

	// OnDemand: compile a plugin only when a call (or Prepare, Settle, Ready) asks for
	// it, not every plugin in the background from New on. A program that makes one call
	// and exits (the CLI's call) pays for its one plugin only: decoding, validating and
	// loading each built-in from the cache is tens of milliseconds of CPU apiece. A
	// plugin never compiled here is then not compiled at all unless Settle or Ready asks:
	// its calls are served in its quick form (tier.go).
	OnDemand bool

	// noQuick: never run a plugin in its quick form (tier.go); tests compare the two.
	noQuick bool
}

// PluginSpec names one plugin to load and what it may do.
type PluginSpec struct {
	// Path of the .wasm file; used in messages even when Wasm is set.
	Path string
	// Wasm is the module's bytes; when nil the host reads Path.
	Wasm []byte
	// Grants are the capabilities the plugin may import.
	Grants []abi.Capability
	// Env is the plugin's configuration, visible to it as environment variables.
	Env map[string]string

	// Scope narrows the granted capabilities: the paths the plugin may read and write,
	// the programs it may run, its store's access, the ports it may capture (package
	// policy). Its zero value narrows nothing. A refused call gets abi.StatusPermission
	// and a message for the model.
	Scope policy.Scope
	// MemoryLimitMiB caps each of the plugin's instances; zero means Config's.
	MemoryLimitMiB int
	// CallTimeout is the budget for the plugin's own work in one call; zero means Config's.
	CallTimeout time.Duration
	// CallsPerMinute bounds the tool calls into the plugin in any minute, across all
	// sessions of the host; a call over it is an is_error result that says when to try
	// again. Zero: no bound.
	CallsPerMinute int
	// Secrets are added to the environment of every command the plugin runs (it must be
	// granted sandbox_exec), by name; never to the plugin's own. Their values, each at
	// least MinSecretLen bytes, never appear in the plugin's view of command output, in
	// results, logs, last_error messages or the audit.
	Secrets map[string]string
	// Seeds are what loading the module would learn, made ahead (the built-ins carry
	// theirs), one per environment it was made under: with the one whose Env is the
	// plugin's, a host whose data dir has no record of the plugin registers its tools
	// without compiling anything. It is checked like a record before the plugin serves a
	// call; with none that matches, the plugin is loaded in full.
	Seeds []Seed
}

// Seed is a plugin's imports and manifest, as its first load would record them; see
// MakeSeed.
type Seed struct {
	// Env is the plugin's environment it was made with (its spec's and the host's command
	// timeouts): the manifest may depend on it.
	Env      map[string]string `json:"env"`
	Imports  []Import          `json:"imports"`
	Manifest string            `json:"manifest"`
}

// Errors a caller of Dispatch may branch on.
var (
	// ErrPluginTimeout: the plugin's own work took longer than its budget.
	ErrPluginTimeout = errors.New("plugin exceeded its time budget")
	// ErrPluginFailed: the plugin trapped, ran out of memory or broke the ABI.
	ErrPluginFailed = errors.New("plugin failed")
	// ErrClosed: the host was closed.
	ErrClosed = errors.New("host is closed")
)

const (
	maxInputBytes        = 4 << 20
	maxResultBytes       = 64 << 20
	maxCallsPerInstance  = 5000
	initialInputCapacity = 64 << 10
)

// DefaultDataDir is $TOOLHOST_DATA_DIR, else $XDG_DATA_HOME/toolhost, else
// ~/.local/share/toolhost, else a directory under the system temp dir.
func DefaultDataDir() string {
	if d := os.Getenv("TOOLHOST_DATA_DIR"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "toolhost")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "share", "toolhost")
	}
	return filepath.Join(os.TempDir(), "toolhost")
}

func (c Config) withDefaults() Config {
	if c.DataDir == "" {
		c.DataDir = DefaultDataDir()
	}
	if c.MemoryLimitMiB <= 0 {
		c.MemoryLimitMiB = 128
	}
	if c.CallTimeout <= 0 {
		c.CallTimeout = 10 * time.Second
	}
	if c.PoolSize <= 0 {
		c.PoolSize = 8
	}
	if c.DefaultExecTimeout <= 0 {
		c.DefaultExecTimeout = 60 * time.Second
	}
	if c.MaxExecTimeout <= 0 {
		c.MaxExecTimeout = 600 * time.Second
	}
	if c.DefaultExecTimeout > c.MaxExecTimeout {
		c.DefaultExecTimeout = c.MaxExecTimeout
	}
	if c.MaxReadBytes <= 0 {
		c.MaxReadBytes = 16 << 20
	}
	if c.MaxExecOutputBytes <= 0 {
		c.MaxExecOutputBytes = 64 << 10
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MaxCacheBytes == 0 {
		c.MaxCacheBytes = DefaultMaxCacheBytes
	}
	return c
}

// Host loads plugins and dispatches tool calls to them.
type Host struct {
	cfg     Config
	log     *slog.Logger
	audit   audit.Sink // nil: off
	secrets *secrets   // nil: none
	// runtimeMiB is the runtime's memory cap per instance: the largest of the host's and
	// the plugins' limits (memlimit.go).
	runtimeMiB int
	// eng is the runtime the host shares with the process's other hosts of its cache
	// directory and memory cap (engine.go); nil for Inspect's.
	eng *engine
	// held are the compiled modules of eng the host uses, let go at Close.
	heldMu  sync.Mutex
	held    []*sharedModule
	plugins []*plugin
	tools   map[string]*tool
	order   []*tool  // load order, for Tools
	edits   keyLocks // write_versioned's check-and-write, per session and path
	records string   // the directory of the plugins' records (records.go)

	// The background work New starts (finishing the plugins loaded from their records,
	// pruning the cache) runs under finishCtx; Close cancels it and waits for finishing.
	finishCtx    context.Context
	finishCancel context.CancelFunc
	finishing    sync.WaitGroup

	// The interpreter, made on first use for the plugins' quick forms (tier.go).
	interpOnce sync.Once
	interp     wazero.Runtime
	interpErr  error
	// coldGo is closed when compileCold may begin: at the first call of a plugin in its
	// quick form, or when Ready asks.
	coldGo   chan struct{}
	coldOnce sync.Once

	bgMu      sync.Mutex // orders background's Go with Close's Wait
	closeOnce sync.Once
	closed    atomic.Bool
}

// tool is one tool of a loaded plugin, with its compiled input schema.
type tool struct {
	def    abi.Tool
	plugin *plugin
	schema *schema
	output *schema // the output schema, or nil: structured results are then dropped
}

// New creates a host and loads cfg.Plugins. It fails, naming the plugin, when a plugin
// cannot be read or compiled, imports more than its grants, or has an invalid manifest.
func New(ctx context.Context, cfg Config) (*Host, error) {
	cfg = cfg.withDefaults()
	h, err := newRuntime(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := h.load(ctx, cfg.Plugins); err != nil {
		h.Close(ctx)
		return nil, err
	}
	h.pruneInBackground()
	return h, nil
}

// privateDir makes dir (0700, parents too) or checks an existing one: the data dir holds
// compiled machine code the host maps executable, so it must be this user's own and
// writable by no one else. One of another user is refused; one of ours is made 0700.
func privateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory: refusing to use it", dir)
	}
	if who, other := owner.Other(dir, fi); other {
		return fmt.Errorf("%s belongs to %s, not to this user: refusing to use it", dir, who)
	}
	return os.Chmod(dir, 0o700)
}

// newRuntime makes a host with its data dir checked and its engine (the runtime it shares
// with the process's other hosts of the same configuration), but no plugins.
func newRuntime(ctx context.Context, cfg Config) (*Host, error) {
	h, err := newBareHost(ctx, cfg)
	if err != nil {
		return nil, err
	}
	cacheDir := filepath.Join(cfg.DataDir, "cache")
	if h.eng, err = acquireEngine(ctx, engineKey{cacheDir: cacheDir, memPages: uint32(h.runtimeMiB) * 16}); err != nil {
		return nil, err
	}
	return h, nil
}

// newBareHost makes a host with its data dir checked, without a runtime.
func newBareHost(ctx context.Context, cfg Config) (*Host, error) {
	if err := privateDir(cfg.DataDir); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	cacheDir := filepath.Join(cfg.DataDir, "cache")
	if err := privateDir(cacheDir); err != nil {
		return nil, fmt.Errorf("compilation cache dir: %w", err)
	}
	h := &Host{cfg: cfg, log: cfg.Logger, tools: map[string]*tool{}, records: filepath.Join(cacheDir, recordsDir),
		runtimeMiB: runtimeMemoryMiB(cfg), audit: cfg.Audit, secrets: newSecrets(cfg.Plugins), coldGo: make(chan struct{})}
	h.finishCtx, h.finishCancel = context.WithCancel(context.WithoutCancel(ctx))
	return h, nil
}

// load compiles and validates plugins concurrently, then registers their tools in order.
func (h *Host) load(ctx context.Context, specs []PluginSpec) (err error) {
	start := time.Now()
	policies := make([]*policy.Policy, len(specs))
	for i, spec := range specs {
		p, err := checkSpec(spec)
		if err != nil {
			return fmt.Errorf("plugin %s: %w", specLabel(spec), err)
		}
		policies[i] = p
	}
	loaded := make([]*plugin, len(specs))
	defer func() {
		if err != nil { // the runtime outlives the host: end the instances of what loaded
			for _, p := range loaded {
				if p != nil {
					p.pool.close(ctx)
				}
			}
		}
	}()
	errs := make([]error, len(specs))
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for i, spec := range specs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			loaded[i], errs[i] = h.loadPlugin(ctx, spec)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	names := map[string]string{}
	for i, p := range loaded {
		p.policy, p.limiter = policies[i], newRateLimiter(specs[i].CallsPerMinute)
		if prev, dup := names[p.name]; dup {
			return fmt.Errorf("plugin %s (%s): name already used by %s", p.name, p.path, prev)
		}
		names[p.name] = p.path
		for _, t := range p.tools {
			if other, dup := h.tools[t.def.Name]; dup {
				return fmt.Errorf("plugin %s (%s): tool %q is already provided by plugin %s",
					p.name, p.path, t.def.Name, other.plugin.name)
			}
			h.tools[t.def.Name] = t
			h.order = append(h.order, t)
		}
		h.plugins = append(h.plugins, p)
	}
	// Plugins registered from their records are compiled and warmed in the background:
	// those this engine compiled before (a cache hit each) at once, as many at a time as
	// there are cores; the others once a call has been answered (tier.go).
	sem = make(chan struct{}, runtime.GOMAXPROCS(0))
	var cold []*plugin
	for _, p := range h.plugins {
		switch {
		case !p.deferred:
			continue
		case !p.warm && !h.cfg.noQuick:
			cold = append(cold, p)
			continue
		case h.cfg.OnDemand:
			continue // finished when first asked for (plugin.kick)
		}
		p.finishOnce.Do(func() {
			h.finishing.Go(func() {
				select {
				case sem <- struct{}{}:
					defer func() { <-sem }()
				case <-h.finishCtx.Done():
				}
				p.finishLogged(h.finishCtx)
			})
		})
	}
	if len(cold) > 0 {
		h.finishing.Go(func() { h.compileCold(cold) })
	}
	h.log.Debug("plugins loaded", "count", len(loaded), "tools", len(h.order), "took", time.Since(start))
	return nil
}

// Ready compiles every plugin that is not yet (which New leaves to the background), waits
// until each has its compiled form and an instance warm, and returns the first plugin's
// load failure. Calls need not wait for it: a call waits for its own plugin, and not
// even for its compiled form (tier.go). Ready fills the compilation cache ahead (toolhost
// doctor does).
func (h *Host) Ready(ctx context.Context) error {
	h.startCold()
	for _, p := range h.plugins {
		if err := p.await(ctx); err != nil {
			return err
		}
	}
	return nil
}

// ReadyFor is Ready for the plugins that serve tools only: it waits until each runs in
// its compiled form, and those are compiled before the plugins nobody waits for. An
// unknown tool is an error.
func (h *Host) ReadyFor(ctx context.Context, tools ...string) error {
	var ps []*plugin
	for _, name := range tools {
		t, ok := h.tools[name]
		if !ok {
			return fmt.Errorf("no tool %q", name)
		}
		t.plugin.wanted.Store(true)
		ps = append(ps, t.plugin)
	}
	h.startCold()
	for _, p := range ps {
		if err := p.await(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Tools returns every tool's definition, in plugin load order.
func (h *Host) Tools() []abi.Tool {
	out := make([]abi.Tool, len(h.order))
	for i, t := range h.order {
		out[i] = t.def
	}
	return out
}

// PluginInfo describes a loaded plugin.
type PluginInfo struct {
	Name    string
	Version string
	Path    string
	Tools   []string
	Imports []Import
	Grants  []abi.Capability
	// Scope narrows the grants (zero: it narrows nothing).
	Scope policy.Scope
	// Secrets names the plugin's secrets (never their values).
	Secrets []string
}

// Import is one function a plugin imports.
type Import struct {
	Module string
	Name   string
}

// Plugins describes the loaded plugins, in load order.
func (h *Host) Plugins() []PluginInfo {
	out := make([]PluginInfo, len(h.plugins))
	for i, p := range h.plugins {
		info := PluginInfo{Name: p.name, Version: p.manifest.Version, Path: p.path,
			Imports: p.imports, Grants: p.spec.Grants, Scope: p.spec.Scope,
			Secrets: slices.Sorted(maps.Keys(p.spec.Secrets))}
		for _, t := range p.tools {
			info.Tools = append(info.Tools, t.def.Name)
		}
		out[i] = info
	}
	return out
}

// OpenSession binds the host to a sandbox: tools dispatched through the session act in it.
// The session does not own the sandbox; closing it is the caller's job.
func (h *Host) OpenSession(sb sandbox.Sandbox, opts ...SessionOption) *Dispatcher {
	s := &Dispatcher{h: h, sb: sb, project: "default"}
	for _, o := range opts {
		o(s)
	}
	return s
}

// SessionOption configures a Session.
type SessionOption func(*Dispatcher)

// WithProject names the project a session's screenshots are stored under (default
// "default").
func WithProject(id string) SessionOption { return func(s *Dispatcher) { s.project = id } }

// WithDefaultPort is the port take_screenshot captures when none is given and the sandbox
// has not seen a dev server start.
func WithDefaultPort(port int) SessionOption { return func(s *Dispatcher) { s.defaultPort = port } }

// WithStore serves the session's store calls (the store capability) from st instead of
// Config.Store: a wrapper of it, such as the fenced store of a project's lease holder, so
// that a plugin's writes stop with the session's right to write. Without Config.Store
// the capability stays off.
func WithStore(st store.Store) SessionOption { return func(s *Dispatcher) { s.store = st } }

// WithCapturer serves the session's captures (take_screenshot) with c instead of
// Config.Capturer (one storing through the session's fenced store).
func WithCapturer(c Capturer) SessionOption { return func(s *Dispatcher) { s.capturer = c } }

// storeOf is the store of inst's calls: its session's, else the host's.
func (h *Host) storeOf(inst *instance) store.Store {
	if inst.session != nil && inst.session.store != nil && h.cfg.Store != nil {
		return inst.session.store
	}
	return h.cfg.Store
}

// specLabel names a plugin before its manifest is read: its path.
func specLabel(spec PluginSpec) string {
	if spec.Path == "" {
		return "(in-memory module)"
	}
	return spec.Path
}

// checkSpec checks what a spec asks beyond its module (its scope, limits and secrets) and
// compiles its policy.
func checkSpec(spec PluginSpec) (*policy.Policy, error) {
	sc := spec.Scope
	for _, s := range []struct {
		set bool
		c   abi.Capability
	}{{sc.Files != nil, abi.CapSandboxFiles}, {sc.Exec != nil, abi.CapSandboxExec}, {sc.Store != nil, abi.CapStore}, {sc.Capture != nil, abi.CapCapture}, {sc.Web != nil, abi.CapWeb}} {
		if s.set && !slices.Contains(spec.Grants, s.c) {
			return nil, fmt.Errorf("scopes %s, which it is not granted (add it to its grants, or drop the scope)", s.c)
		}
	}
	p, err := policy.Compile(sc)
	if err != nil {
		return nil, err
	}
	switch {
	case spec.MemoryLimitMiB < 0 || spec.MemoryLimitMiB > 4096:
		return nil, fmt.Errorf("memory limit %d MiB: must be between 1 and 4096", spec.MemoryLimitMiB)
	case spec.CallTimeout < 0:
		return nil, fmt.Errorf("call timeout %s: must be positive", spec.CallTimeout)
	case spec.CallsPerMinute < 0:
		return nil, fmt.Errorf("calls per minute %d: must be positive (or zero for no bound)", spec.CallsPerMinute)
	}
	if err := checkSecrets(spec); err != nil {
		return nil, err
	}
	return p, nil
}

// Close stops every plugin instance. Calls in flight fail; later calls return ErrClosed.
func (h *Host) Close(ctx context.Context) error {
	var err error
	h.closeOnce.Do(func() {
		h.bgMu.Lock()
		h.closed.Store(true)
		h.bgMu.Unlock()
		h.finishCancel()
		h.finishing.Wait()
		for _, p := range h.plugins {
			p.pool.close(ctx)
		}
		if h.eng != nil {
			h.heldMu.Lock()
			held := h.held
			h.held = nil
			h.heldMu.Unlock()
			releaseEngine(ctx, h.eng, held)
		}
		if h.interp != nil { // made, if ever, by work finishing has waited for
			err = errors.Join(err, h.interp.Close(ctx))
		}
	})
	return err
}
