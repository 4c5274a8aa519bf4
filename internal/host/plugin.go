package host

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/policy"
)

// plugin is a compiled, validated module and its pool of instances.
type plugin struct {
	name     string
	path     string
	spec     PluginSpec
	manifest abi.Manifest
	imports  []Import
	tools    []*tool
	opt      *tier // the compiled form, once ready is closed without loadErr (tier.go)
	modCfg   wazero.ModuleConfig
	pool     *pool
	h        *Host
	policy   *policy.Policy // the spec's Scope compiled; nil allows everything
	limiter  *rateLimiter   // the spec's CallsPerMinute; nil for none
	// framedInput: the manifest lists abi.InputFramed1, so requests go framed.
	framedInput bool

	key     string        // of its record
	ready   chan struct{} // closed once its compiled form is in, or never will be
	loadErr error         // why it never will be, set before ready is closed
	wasm    []byte        // its bytes
	// deferred: registered from its record (or loaded in its quick form), its compilation
	// left to finish.
	deferred    bool
	rawManifest string // the recorded manifest, which finish compares with the module's
	// fromRecord: registered from its record or seed, not loaded.
	fromRecord bool
	// warm: its record or its module's compiled mark says this engine compiled it
	// (engineID): the compiled form is a cache hit away, so calls wait for it instead of
	// interpreting.
	warm bool
	// recorded: the record as it is on disk, if any; finish rewrites it when it lacks
	// what finish learnt (that this engine compiled the module).
	recorded *record
	quick    quickForm   // the interpreter's form (tier.go)
	called   atomic.Bool // a call has asked for an instance
	wanted   atomic.Bool // ReadyFor waits for it: compiled before the plugins nobody waits for
	// finishOnce starts finish for a plugin that is not one of compileCold's: at New, or
	// with Config.OnDemand when first asked for (kick).
	finishOnce sync.Once
}

// The name patterns are compiled at first use, not at package init: a counted repetition
// compiles into that many copies of its class, and every process that links this package
// pays its init, the sandbox agent (the same binary, re-executed) at every sandbox start.
var (
	pluginNameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9_-]{1,64}$`) })
	toolNameRE   = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`) })
)

// hostFunctions lists what the host provides, by import module.
var hostFunctions = map[string][]string{
	abi.ModuleCore:              {abi.FnTake, abi.FnLastError},
	abi.CapLog.Module():         {abi.FnLog},
	abi.CapSandboxExec.Module(): {abi.FnExec, abi.FnProcess, abi.FnTerminalStart, abi.FnTerminalIO},
	abi.CapSandboxFiles.Module(): {
		abi.FnRead, abi.FnReadText, abi.FnWrite, abi.FnReadVersioned, abi.FnWriteVersioned, abi.FnStat, abi.FnList,
		abi.FnRemove,
	},
	abi.ModuleSession:       {abi.FnSessionGet, abi.FnSessionSet},
	abi.CapCapture.Module(): {abi.FnCapture},
	abi.CapStore.Module():   {abi.FnStorePut, abi.FnStoreGet, abi.FnStoreList, abi.FnStoreDelete},
	abi.CapWeb.Module():     {abi.FnFetch},
}

func (h *Host) loadPlugin(ctx context.Context, spec PluginSpec) (*plugin, error) {
	label := spec.Path
	if label == "" {
		label = "(in-memory module)"
	}
	wasm := spec.Wasm
	if wasm == nil {
		var err error
		if wasm, err = os.ReadFile(spec.Path); err != nil {
			return nil, fmt.Errorf("plugin %s: %w", label, err)
		}
	}
	env := h.pluginEnv(spec)
	p := &plugin{path: label, spec: spec, h: h, modCfg: moduleConfig(env), key: recordKey(wasm, env), wasm: wasm}
	p.pool = newPool(p, h.cfg.PoolSize)

	// A recorded plugin is registered from its record (or its seed: what its first load
	// would record, made ahead); finish compiles it later.
	rec, ok := h.readRecord(p.key)
	if ok {
		p.recorded = &rec
	} else if i := slices.IndexFunc(spec.Seeds, func(sd Seed) bool { return maps.Equal(sd.Env, env) }); i >= 0 {
		sd := spec.Seeds[i]
		rec, ok = record{Imports: sd.Imports, Manifest: sd.Manifest}, true
	}
	if ok {
		p.imports = rec.Imports
		if err := checkGrants(label, p.imports, spec.Grants); err != nil {
			return nil, err
		}
		var m abi.Manifest
		err := json.Unmarshal([]byte(rec.Manifest), &m)
		if err == nil {
			err = p.setManifest(m)
		}
		if err == nil {
			p.ready, p.deferred, p.rawManifest, p.fromRecord = make(chan struct{}), true, rec.Manifest, true
			p.warm = rec.Compiled == engineID() || h.compiledBefore(compiledKey(wasm))
			return p, nil
		}
		if p.recorded != nil {
			h.dropRecord(p.key) // recorded by a host that accepted more: load it in full
		}
		p.tools, p.recorded = nil, nil
	}
	h.log.Debug("plugin loaded in full: no record or seed of it under its environment", "plugin", label)
	if !h.cfg.noQuick {
		if err := p.loadQuick(ctx); err == nil {
			return p, nil
		} else if !errors.Is(err, errNoInterpreter) {
			return nil, err
		}
	}

	// The module is the engine's (engine.go): the host lets go of it at Close, failed or
	// not, and never closes it itself.
	compiled, err := h.compile(ctx, wasm)
	if err != nil {
		return nil, fmt.Errorf("plugin %s: compile: %w", label, err)
	}
	p.opt = &tier{rt: h.eng.rt, compiled: compiled}
	p.imports = importsOf(compiled)
	if err := checkGrants(label, p.imports, spec.Grants); err != nil {
		return nil, err
	}
	if err := checkExports(compiled); err != nil {
		return nil, fmt.Errorf("plugin %s: %w", label, err)
	}

	// The first instance answers the manifest and then serves calls.
	inst, err := p.pool.acquire(ctx, p.opt)
	if err != nil {
		return nil, fmt.Errorf("plugin %s: %w", label, err)
	}
	manifest, rawManifest, err := inst.describe(ctx)
	if err != nil {
		p.pool.discard(ctx, inst)
		return nil, fmt.Errorf("plugin %s: %w", label, err)
	}
	if err := p.setManifest(manifest); err != nil {
		p.pool.discard(ctx, inst)
		return nil, fmt.Errorf("plugin %s: %w", label, err)
	}
	p.pool.release(ctx, inst) // the instance that answered the manifest serves the first call
	if err := h.writeRecord(p.key, record{Imports: p.imports, Manifest: string(rawManifest), Compiled: engineID()}); err != nil {
		h.log.Warn("could not record a plugin: the next start loads it in full", "plugin", p.name, "err", err)
	}
	p.markCompiled()
	p.ready = closedChan
	return p, nil
}

// errNoInterpreter: the interpreter could not load a module (a feature it lacks), which
// the optimizing compiler then loads.
var errNoInterpreter = errors.New("the interpreter cannot load it")

// loadQuick loads a plugin seen for the first time in its quick form: the interpreter
// compiles it in a fraction of the optimizing compiler's time, an instance answers the
// manifest (and then serves the first call), and the plugin is recorded; its compiled form
// is left to compileCold, like a recorded plugin's.
func (p *plugin) loadQuick(ctx context.Context) error {
	h, label := p.h, p.path
	rt, err := h.interpreter()
	if err != nil {
		return fmt.Errorf("%w: %w", errNoInterpreter, err)
	}
	compiled, err := rt.CompileModule(ctx, p.wasm)
	if err != nil {
		// The optimizing compiler says what is wrong with the module, if anything.
		h.log.Debug("the interpreter did not compile a plugin", "plugin", label, "err", err)
		return fmt.Errorf("%w: %w", errNoInterpreter, err)
	}
	t := &tier{rt: rt, compiled: compiled, quick: true}
	p.imports = importsOf(compiled)
	if err := checkGrants(label, p.imports, p.spec.Grants); err != nil {
		compiled.Close(ctx)
		return err
	}
	if err := checkExports(compiled); err != nil {
		compiled.Close(ctx)
		return fmt.Errorf("plugin %s: %w", label, err)
	}
	inst, err := p.pool.acquire(ctx, t)
	if err != nil {
		compiled.Close(ctx)
		return fmt.Errorf("plugin %s: %w", label, err)
	}
	manifest, rawManifest, err := inst.describe(ctx)
	if err == nil {
		err = p.setManifest(manifest)
	}
	if err != nil {
		p.pool.discard(ctx, inst)
		compiled.Close(ctx)
		return fmt.Errorf("plugin %s: %w", label, err)
	}
	p.pool.release(ctx, inst) // the instance that answered the manifest serves the first call
	rec := record{Imports: p.imports, Manifest: string(rawManifest)}
	if err := h.writeRecord(p.key, rec); err != nil {
		h.log.Warn("could not record a plugin: the next start loads it in full", "plugin", p.name, "err", err)
	} else {
		p.recorded = &rec
	}
	p.ready, p.deferred, p.rawManifest = make(chan struct{}), true, string(rawManifest)
	q := &p.quick
	q.once.Do(func() { q.done, q.t = closedChan, t })
	return nil
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// finish completes the load of a plugin registered from its record (or loaded in its
// quick form): it compiles the module, checks that its imports, exports and manifest are
// still what the record says (else the record is dropped and the plugin fails its calls),
// keeps the instance that answered the manifest for the next call, and notes in the record
// that this engine compiled it (so the next start waits for the cache, see tier.go).
// The host runs it in the background from New; calls to the plugin wait for it (await),
// or use its quick form meanwhile.
func (p *plugin) finish(ctx context.Context) {
	defer close(p.ready)
	if err := ctx.Err(); err != nil {
		p.loadErr = fmt.Errorf("plugin %s: %w", p, ErrClosed)
		return
	}
	// A module this process compiled before from the same bytes is not decoded again
	// (engine.go); the host lets go of it at Close, never closing it itself.
	compiled, err := p.h.compile(ctx, p.wasm)
	if err != nil {
		if ctx.Err() != nil {
			p.loadErr = fmt.Errorf("plugin %s: %w", p, ErrClosed)
			return
		}
		p.loadErr = fmt.Errorf("%w: plugin %s: compile: %w", ErrPluginFailed, p, err)
		return
	}
	if !slices.Equal(importsOf(compiled), p.imports) {
		p.loadErr = p.changed("imports")
		return
	}
	if err := checkExports(compiled); err != nil {
		p.loadErr = p.changed("exports")
		return
	}
	t := &tier{rt: p.h.eng.rt, compiled: compiled}
	inst, err := p.pool.acquire(ctx, t)
	if err != nil {
		p.loadErr = fmt.Errorf("%w: plugin %s: %w", ErrPluginFailed, p, err)
		return
	}
	_, raw, err := inst.describe(ctx)
	if err != nil {
		p.pool.discard(ctx, inst)
		p.loadErr = fmt.Errorf("%w: plugin %s: %w", ErrPluginFailed, p, err)
		return
	}
	if string(raw) != p.rawManifest {
		p.pool.discard(ctx, inst)
		p.loadErr = p.changed("tools")
		return
	}
	p.opt = t
	p.pool.release(ctx, inst) // the instance that answered the manifest serves the next call
	p.retireQuick(ctx)
	if r := p.recorded; r == nil || r.Compiled != engineID() {
		rec := record{Imports: p.imports, Manifest: p.rawManifest, Compiled: engineID()}
		if err := p.h.writeRecord(p.key, rec); err != nil {
			p.h.log.Warn("could not record a plugin: the next start loads it in full", "plugin", p.name, "err", err)
		}
	}
	if !p.warm {
		p.markCompiled()
	}
}

// markCompiled records that this engine compiled the plugin's module, for every
// environment it may run under.
func (p *plugin) markCompiled() {
	if err := p.h.markCompiled(compiledKey(p.wasm)); err != nil {
		p.h.log.Warn("could not record a plugin's compile: its next start under another configuration runs it interpreted first", "plugin", p.name, "err", err)
	}
}

// await waits until the plugin is ready to serve calls.
func (p *plugin) await(ctx context.Context) error {
	p.kick()
	select {
	case <-p.ready:
		return p.loadErr
	default:
	}
	select {
	case <-p.ready:
		return p.loadErr
	case <-ctx.Done():
		return fmt.Errorf("waiting for plugin %s to load: %w", p, ctx.Err())
	}
}

// kick starts the plugin's compiled form on its way if nothing has yet (Config.OnDemand):
// a plugin this engine compiled before is finished now, in the background; one it never
// compiled is compileCold's, which kick lets begin.
func (p *plugin) kick() {
	if !p.deferred {
		return
	}
	h := p.h
	if !p.warm && !h.cfg.noQuick {
		h.startCold()
		return
	}
	p.finishOnce.Do(func() {
		if !h.background(func() { p.finishLogged(h.finishCtx) }) {
			p.finish(closedCtx) // the host is closing: ready closes with ErrClosed
		}
	})
}

// closedCtx is a context that has ended.
var closedCtx = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// finishLogged finishes the plugin and logs a load failure (not the host's closing).
func (p *plugin) finishLogged(ctx context.Context) {
	start := time.Now()
	p.finish(ctx)
	if p.loadErr != nil && ctx.Err() == nil {
		p.h.log.Warn("plugin failed to load", "plugin", p.name, "err", p.loadErr)
	} else if p.loadErr == nil {
		p.h.log.Debug("plugin compiled", "plugin", p.name, "took", time.Since(start))
	}
}

func importsOf(m wazero.CompiledModule) []Import {
	var out []Import
	for _, f := range m.ImportedFunctions() {
		mod, name, _ := f.Import()
		out = append(out, Import{Module: mod, Name: name})
	}
	slices.SortFunc(out, func(a, b Import) int {
		return strings.Compare(a.Module+"."+a.Name, b.Module+"."+b.Name)
	})
	return slices.Compact(out)
}

// checkGrants refuses a plugin that imports a capability it was not granted, or a function
// the host does not provide. It runs before the module is instantiated, and names every
// missing grant with the imports that need it, and every unknown import, in one error.
func checkGrants(label string, imports []Import, grants []abi.Capability) error {
	missing := map[abi.Capability][]string{}
	var unknown []string
	for _, imp := range imports {
		name := imp.Module + "." + imp.Name
		switch imp.Module {
		case abi.ModuleWASI:
			continue
		case abi.ModuleCore, abi.ModuleSession:
		default:
			c, ok := abi.CapabilityOfModule(imp.Module)
			if !ok {
				unknown = append(unknown, name)
				continue
			}
			if !slices.Contains(grants, c) {
				missing[c] = append(missing[c], name)
				continue
			}
		}
		if !slices.Contains(hostFunctions[imp.Module], imp.Name) {
			unknown = append(unknown, name)
		}
	}
	var problems []string
	for _, c := range abi.Capabilities() { // a stable order
		if fns := missing[c]; len(fns) > 0 {
			problems = append(problems, fmt.Sprintf("imports %s but is not granted %q", strings.Join(fns, ", "), c))
		}
	}
	if len(unknown) > 0 {
		problems = append(problems, fmt.Sprintf("imports %s, which the host does not provide", strings.Join(unknown, ", ")))
	}
	if len(problems) == 0 {
		return nil
	}
	hint := ""
	if len(missing) > 0 {
		hint = " (add the capabilities to its grants if it should have them)"
	}
	return fmt.Errorf("plugin %s: %s%s", label, strings.Join(problems, "; "), hint)
}

// Needs returns the capabilities an import list requires, in a stable order.
func needs(imports []Import) []abi.Capability {
	var out []abi.Capability
	for _, c := range abi.Capabilities() {
		if slices.ContainsFunc(imports, func(i Import) bool { return i.Module == c.Module() }) {
			out = append(out, c)
		}
	}
	return out
}

func checkExports(m wazero.CompiledModule) error {
	want := []struct {
		name            string
		params, results []api.ValueType
	}{ // in a fixed order, so the error names the same missing export every time
		{abi.ExportVersion, nil, []api.ValueType{api.ValueTypeI32}},
		{abi.ExportDescribe, nil, []api.ValueType{api.ValueTypeI64}},
		{abi.ExportInput, []api.ValueType{api.ValueTypeI32}, []api.ValueType{api.ValueTypeI32}},
		{abi.ExportCall, []api.ValueType{api.ValueTypeI32}, []api.ValueType{api.ValueTypeI64}},
	}
	exports := m.ExportedFunctions()
	for _, sig := range want {
		name := sig.name
		f, ok := exports[name]
		if !ok {
			return fmt.Errorf("does not export %s (not a toolhost plugin?)", name)
		}
		if !slices.Equal(f.ParamTypes(), sig.params) || !slices.Equal(f.ResultTypes(), sig.results) {
			return fmt.Errorf("export %s has the wrong signature", name)
		}
	}
	// _initialize is a WASI reactor's runtime initialisation; a module that needs none (one
	// that imports nothing from WASI, say) may leave it out. A command (_start) is refused.
	if _, ok := exports[abi.ExportInitialize]; !ok {
		if _, cmd := exports["_start"]; cmd {
			return errors.New("is a WASI command (exports _start), not a reactor: build it as a reactor, exporting _initialize (Go: -buildmode=c-shared; clang: -mexec-model=reactor; Rust: crate-type cdylib)")
		}
	}
	if _, ok := m.ExportedMemories()[abi.ExportMemory]; !ok {
		return errors.New("does not export its memory")
	}
	return nil
}

// moduleConfig gives a plugin real clocks, crypto randomness, sleeps cut into short slices
// (so a deadline interrupts a sleeping guest), its configuration as environment, and no
// filesystem at all.
func moduleConfig(env map[string]string) wazero.ModuleConfig {
	cfg := wazero.NewModuleConfig().
		WithName("").
		WithStartFunctions(abi.ExportInitialize).
		WithSysNanotime().
		WithSysWalltime().
		WithNanosleep(func(ns int64) {
			// A Go guest re-checks its timers after each slice; each return into the guest
			// is a point where the context's deadline can close the module.
			const slice = int64(5 * time.Millisecond)
			time.Sleep(time.Duration(min(ns, slice)))
		}).
		WithRandSource(rand.Reader)
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		cfg = cfg.WithEnv(k, env[k])
	}
	return cfg
}

func (p *plugin) setManifest(m abi.Manifest) error {
	if m.ABIVersion != abi.Version {
		return fmt.Errorf("manifest: abi_version %d, this host speaks %d", m.ABIVersion, abi.Version)
	}
	if !pluginNameRE().MatchString(m.Name) {
		return fmt.Errorf("manifest: plugin name %q must match %s", m.Name, pluginNameRE())
	}
	if len(m.Tools) == 0 {
		return errors.New("manifest: no tools")
	}
	seen := map[string]bool{}
	for _, t := range m.Tools {
		if !toolNameRE().MatchString(t.Name) {
			return fmt.Errorf("manifest: tool name %q must match %s", t.Name, toolNameRE())
		}
		if seen[t.Name] {
			return fmt.Errorf("manifest: tool %q listed twice", t.Name)
		}
		seen[t.Name] = true
		if strings.TrimSpace(t.Description) == "" {
			return fmt.Errorf("manifest: tool %q has no description", t.Name)
		}
		s, err := compileToolSchema(json.RawMessage(t.InputSchema))
		if err != nil {
			return fmt.Errorf("manifest: tool %q: %w", t.Name, err)
		}
		var out *schema
		if len(t.OutputSchema) > 0 {
			if out, err = compileOutputSchema(json.RawMessage(t.OutputSchema)); err != nil {
				return fmt.Errorf("manifest: tool %q: %w", t.Name, err)
			}
		}
		p.tools = append(p.tools, &tool{def: t, plugin: p, schema: s, output: out})
	}
	p.name = m.Name
	p.manifest = m
	p.framedInput = slices.Contains(m.InputForms, abi.InputFramed1)
	return nil
}

// Inspection is what Inspect learns of a module without granting it anything.
type Inspection struct {
	Manifest abi.Manifest
	Imports  []Import
	// Needs are the grants the module requires to be loaded.
	Needs []abi.Capability
}

// The command timeouts the host enforces, told to every plugin granted sandbox_exec (in
// milliseconds, as decimal text), so that what a plugin says about them (its tool
// description, a "timed out after N s") is what the host does. They override the same
// names in PluginSpec.Env.
const (
	EnvExecTimeoutDefault = "TOOLHOST_EXEC_TIMEOUT_DEFAULT_MS"
	EnvExecTimeoutMax     = "TOOLHOST_EXEC_TIMEOUT_MAX_MS"
)

// EnvMemoryLimit is the memory limit of each of the plugin's instances, in MiB (as decimal
// text), told to every plugin, so that a plugin can refuse work that would not fit (an
// image too large to decode) with a message of its own instead of running out of memory.
// It overrides the same name in PluginSpec.Env.
const EnvMemoryLimit = "TOOLHOST_MEMORY_LIMIT_MIB"

// pluginEnv is the plugin's environment: its spec's, plus its memory limit, plus the
// host's command timeouts for a plugin that may run commands.
func (h *Host) pluginEnv(spec PluginSpec) map[string]string {
	env := maps.Clone(spec.Env)
	if env == nil {
		env = map[string]string{}
	}
	env[EnvMemoryLimit] = strconv.Itoa(h.specMemoryMiB(spec))
	if !slices.Contains(spec.Grants, abi.CapSandboxExec) {
		return env
	}
	def, maxTimeout := h.cfg.DefaultExecTimeout, h.cfg.MaxExecTimeout
	if e := spec.Scope.Exec; e != nil && e.MaxTimeout > 0 && e.MaxTimeout < maxTimeout {
		maxTimeout, def = e.MaxTimeout, min(def, e.MaxTimeout)
	}
	env[EnvExecTimeoutDefault] = strconv.FormatInt(def.Milliseconds(), 10)
	env[EnvExecTimeoutMax] = strconv.FormatInt(maxTimeout.Milliseconds(), 10)
	return env
}

// Inspect compiles a module, reads its imports and its manifest. It grants the module
// nothing: no sandbox is attached, so any host function it calls while describing itself
// fails. The compilation cache under DefaultDataDir is used.
func Inspect(ctx context.Context, wasm []byte) (Inspection, error) {
	h, err := newBareHost(ctx, Config{}.withDefaults())
	if err != nil {
		return Inspection{}, err
	}
	defer h.finishCancel()
	// The interpreter reads a module's imports and manifest in a fraction of the
	// optimizing compiler's time.
	rt, err := h.interpreter()
	if err != nil {
		return Inspection{}, err
	}
	defer rt.Close(ctx)
	compiled, err := rt.CompileModule(ctx, wasm)
	if err != nil {
		return Inspection{}, fmt.Errorf("compile: %w", err)
	}
	in := Inspection{Imports: importsOf(compiled)}
	in.Needs = needs(in.Imports)
	if err := checkGrants("(inspected)", in.Imports, abi.Capabilities()); err != nil {
		return in, err
	}
	if err := checkExports(compiled); err != nil {
		return in, err
	}
	p := &plugin{path: "(inspected)", modCfg: moduleConfig(nil), h: h}
	inst, err := newInstance(ctx, p, &tier{rt: rt, compiled: compiled, quick: true})
	if err != nil {
		return in, err
	}
	defer inst.mod.Close(ctx)
	in.Manifest, _, err = inst.describe(ctx)
	return in, err
}

// describe calls the describe export and decodes the manifest; raw is its text.
func (inst *instance) describe(ctx context.Context) (m abi.Manifest, raw []byte, err error) {
	ctx, cancel := context.WithTimeout(context.WithValue(ctx, hostKey{}, inst.p.h), loadTimeout)
	defer cancel()
	inst.stack[0] = 0
	if err := inst.fnVersion.CallWithStack(ctx, inst.stack); err != nil {
		return m, nil, fmt.Errorf("%s: %w", abi.ExportVersion, err)
	}
	if got := int(int32(uint32(inst.stack[0]))); got != abi.Version {
		return m, nil, fmt.Errorf("ABI version %d, this host speaks %d", got, abi.Version)
	}
	if err := inst.fnDescribe.CallWithStack(ctx, inst.stack); err != nil {
		return m, nil, fmt.Errorf("%s: %w", abi.ExportDescribe, err)
	}
	raw, err = inst.readPacked(inst.stack[0])
	if err != nil {
		return m, nil, fmt.Errorf("%s: %w", abi.ExportDescribe, err)
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return m, nil, fmt.Errorf("manifest is not valid JSON: %w", err)
	}
	return m, raw, nil
}

func (p *plugin) String() string { return p.name + " (" + filepath.Base(p.path) + ")" }
