package host

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// A plugin runs in one of two forms. Its compiled form is wazero's optimizing compiler's
// machine code: fast, but compiling a 2-3 MB Go module takes about a second of CPU (four
// times that on a loaded machine), and the compilation cache only helps the second time.
// Its quick form is wazero's interpreter's: made in a fifth to a tenth of that, then
// several times slower per call. A plugin this engine has compiled before (its record
// says so) waits for its compiled form, a cache hit of tens of milliseconds. Any other
// plugin answers its first calls in its quick form, made when the first call needs it,
// while the compiled form is built in the background; instances of the quick form are
// retired as soon as the compiled one is in. A call thus waits for its own plugin's quick
// form only, never for another plugin, and never for the optimizing compiler.
//
// The compiled forms of plugins that were never compiled here are built one at a time in
// the background (compileCold), from the first call on (or when Ready asks), the plugins
// that have served calls first: on two cores, a compile that started before the first
// call would take half the CPU the first call's quick form needs.

// tier is a compiled form of a plugin: the module and the runtime its instances live in.
type tier struct {
	rt       wazero.Runtime
	compiled wazero.CompiledModule
	quick    bool // the interpreter's
}

// quickForm is the interpreter's form of a plugin, made once, on demand.
type quickForm struct {
	once sync.Once
	done chan struct{} // closed once t or err is set
	t    *tier
	err  error
	// refused: the module is not what its record says; the plugin's calls fail with err
	// (and so will its compiled form). Otherwise err only means the interpreter could not
	// run it, and calls wait for the compiled form.
	refused bool
}

// quickBudgetFactor multiplies a plugin's call budget in its quick form: the budget bounds
// the plugin's own work, and the interpreter does the same work several times slower
// (BenchmarkTiers: 5-20x for the built-ins' calls), so a call that fits its budget compiled
// fits it interpreted too. A runaway guest is still stopped, later.
const quickBudgetFactor = 20

// interpreter returns the host's interpreter runtime, made with its host modules on first
// use.
func (h *Host) interpreter() (wazero.Runtime, error) {
	h.interpOnce.Do(func() {
		ctx := context.Background()
		rc := wazero.NewRuntimeConfigInterpreter().
			WithCloseOnContextDone(true).
			WithMemoryLimitPages(uint32(h.runtimeMiB) * 16)
		rt := wazero.NewRuntimeWithConfig(ctx, rc)
		if _, err := wasi_snapshot_preview1.Instantiate(ctx, rt); err != nil {
			rt.Close(ctx)
			h.interpErr = fmt.Errorf("instantiate WASI in the interpreter: %w", err)
			return
		}
		if err := instantiateHostModules(ctx, rt); err != nil {
			rt.Close(ctx)
			h.interpErr = err
			return
		}
		h.interp = rt
	})
	return h.interp, h.interpErr
}

// compileContext lets wazero's optimizing compiler use every core, and makes it stop
// between functions when ctx ends (with one worker it would not look at ctx at all, and
// Close would wait for a whole compile).
func compileContext(ctx context.Context) context.Context {
	return experimental.WithCompilationWorkers(ctx, max(2, runtime.GOMAXPROCS(0)))
}

// engineID names the optimizing compiler whose cache a record's Compiled refers to: a
// record compiled by another wazero (an upgraded toolhost) is a cache miss.
var engineID = sync.OnceValue(func() string {
	v := "dev"
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, d := range info.Deps {
			if d.Path == "github.com/tetratelabs/wazero" && d.Version != "" && d.Version != "(devel)" {
				v = d.Version
			}
		}
	}
	return strings.Join([]string{"wazero", v, runtime.GOOS, runtime.GOARCH}, " ")
})

// quickTier returns the plugin's quick form, starting to make it on the first call. It
// is made under the host's background context: a caller that gives up does not spoil it
// for the next.
func (p *plugin) quickTier() *quickForm {
	q := &p.quick
	q.once.Do(func() {
		q.done = make(chan struct{})
		started := p.h.background(func() {
			defer close(q.done)
			q.t, q.err, q.refused = p.makeQuick(p.h.finishCtx)
		})
		if !started {
			q.err = fmt.Errorf("plugin %s: %w", p, ErrClosed)
			close(q.done)
		}
	})
	return q
}

// background runs fn in a goroutine the host owns (Close cancels finishCtx and waits for
// it), unless the host is closing: then it returns false.
func (h *Host) background(fn func()) bool {
	h.bgMu.Lock()
	defer h.bgMu.Unlock()
	if h.closed.Load() {
		return false
	}
	h.finishing.Go(fn)
	return true
}

// retireQuick closes the quick form's module once the compiled form is in: its
// instances keep what they use until they are retired, and no new one is made.
func (p *plugin) retireQuick(ctx context.Context) {
	q := &p.quick
	q.once.Do(func() {}) // none is made from now on
	if q.done == nil {
		return
	}
	select {
	case <-q.done:
		if q.t != nil {
			q.t.compiled.Close(ctx)
		}
	default: // still being made (the compiled form won the race): the runtime's Close frees it
	}
}

// makeQuick compiles the module with the interpreter and, for a plugin registered from its
// record, checks it against the record as finish does, with an instance that then serves
// the first call.
func (p *plugin) makeQuick(ctx context.Context) (t *tier, err error, refused bool) {
	rt, err := p.h.interpreter()
	if err != nil {
		return nil, err, false
	}
	compiled, err := rt.CompileModule(ctx, p.wasm)
	if err != nil {
		return nil, fmt.Errorf("interpreter: compile: %w", err), false
	}
	t = &tier{rt: rt, compiled: compiled, quick: true}
	if !slices.Equal(importsOf(compiled), p.imports) {
		compiled.Close(ctx)
		return nil, p.changed("imports"), true
	}
	if err := checkExports(compiled); err != nil {
		compiled.Close(ctx)
		return nil, p.changed("exports"), true
	}
	inst, err := p.pool.acquire(ctx, t)
	if err != nil {
		compiled.Close(ctx)
		return nil, fmt.Errorf("interpreter: %w", err), false
	}
	_, raw, err := inst.describe(ctx)
	if err != nil {
		p.pool.discard(ctx, inst)
		compiled.Close(ctx)
		return nil, fmt.Errorf("interpreter: %w", err), false
	}
	if string(raw) != p.rawManifest {
		p.pool.discard(ctx, inst)
		compiled.Close(ctx)
		return nil, p.changed("tools"), true
	}
	p.pool.release(ctx, inst)
	return t, nil, false
}

// changed drops the record of a module that is not what its record says (a record from
// another toolhost, or tampered with), so the next start loads it in full, and returns
// the error its calls fail with.
func (p *plugin) changed(what string) error {
	p.h.dropRecord(p.key)
	return fmt.Errorf("%w: plugin %s: its %s differ from those recorded when it was last loaded; start again to load it anew",
		ErrPluginFailed, p, what)
}

// compiledTier returns the plugin's compiled form once it is in: ok is false before that;
// err is why it never will be.
func (p *plugin) compiledTier() (t *tier, err error, ok bool) {
	select {
	case <-p.ready:
		return p.opt, p.loadErr, true
	default:
		return nil, nil, false
	}
}

// acquire returns an instance to serve a call: of the compiled form once it is in; before
// that, of the quick form, unless this engine compiled the plugin before (then the
// compiled form is a cache hit away, and the call waits for it).
func (p *plugin) acquire(ctx context.Context) (*instance, error) {
	p.called.Store(true)
	if t, err, ok := p.compiledTier(); ok {
		if err != nil {
			return nil, err
		}
		return p.pool.acquire(ctx, t)
	}
	if !p.warm && !p.h.cfg.noQuick {
		q := p.quickTier()
		select {
		case <-p.ready:
		case <-q.done:
			if !p.h.cfg.OnDemand {
				p.h.startCold()
			}
			switch {
			case q.err == nil:
				return p.pool.acquire(ctx, q.t)
			case q.refused:
				return nil, q.err
			}
			p.h.log.Debug("plugin runs compiled only", "plugin", p.name, "err", q.err)
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for plugin %s to load: %w", p, ctx.Err())
		}
	}
	if err := p.await(ctx); err != nil {
		return nil, err
	}
	return p.pool.acquire(ctx, p.opt)
}

// startCold lets compileCold begin.
func (h *Host) startCold() { h.coldOnce.Do(func() { close(h.coldGo) }) }

// compileCold builds the compiled forms of the plugins this engine never compiled, one at
// a time (each compile uses every core), from the first call on: the plugins that have
// been called, or that ReadyFor waits for, first. It is the host's, started by New; Close ends it.
func (h *Host) compileCold(cold []*plugin) {
	ctx := h.finishCtx
	select {
	case <-h.coldGo:
	case <-ctx.Done():
	}
	for len(cold) > 0 {
		i := max(0, slices.IndexFunc(cold, func(p *plugin) bool { return p.called.Load() || p.wanted.Load() }))
		p := cold[i]
		cold = slices.Delete(cold, i, i+1)
		p.finishLogged(ctx)
	}
}

// Settle waits until every plugin that has served a call runs in its compiled form (and
// is so in the compilation cache for the next start). A program that makes a few calls
// and exits (the CLI's call) settles before it exits, or its next start would interpret
// again.
func (h *Host) Settle(ctx context.Context) error {
	h.startCold()
	var errs []error
	for _, p := range h.plugins {
		if p.called.Load() {
			if err := p.await(ctx); err != nil && !errors.Is(err, ErrClosed) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// Prepare starts readying the plugin of tool for a call that is coming, without waiting:
// its quick form, unless its compiled form is in or on its way from the cache. A program
// that knows its first call before it has a sandbox (the CLI's call) prepares the tool
// first, so the plugin gets ready while the sandbox starts. An unknown tool is ignored.
func (h *Host) Prepare(tool string) {
	t, ok := h.tools[tool]
	if !ok || h.cfg.noQuick {
		return
	}
	p := t.plugin
	if _, _, ok := p.compiledTier(); ok {
		return
	}
	if p.warm {
		p.kick() // a cache hit: with OnDemand, nothing has started it yet
		return
	}
	p.quickTier()
}

// Unsettled names the plugins that have served a call and are not yet compiled (and so
// not in the compilation cache for the next start): what Settle would wait for.
func (h *Host) Unsettled() []string {
	var out []string
	for _, p := range h.plugins {
		if !p.called.Load() {
			continue
		}
		if _, _, ok := p.compiledTier(); !ok {
			out = append(out, p.name)
		}
	}
	return out
}
