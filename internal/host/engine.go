package host

import (
	"bytes"
	"context"
	"fmt"
	"sync"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// The hosts of one process share their wazero runtime and the compiled modules in it.
//
// wazero decodes and validates a module's bytes on every CompileModule before it looks
// the machine code up in its cache: for a 2-3 MB Go module that is most of a warm load
// (about 0.2 s, as much as Extism's whole load), and a CompiledModule can only be
// instantiated in the runtime that made it. So every Host with the same compilation cache
// directory and memory cap uses one runtime (an engine), and a module compiled in it is
// kept by its bytes: a Host that loads the same bytes again (compared in full, never by
// a checksum alone) instantiates the module already compiled, and decodes nothing. The
// host functions find their Host through the instance making the call (inst.p.h), so one
// set serves every Host of the runtime; instances are anonymous, and each belongs to one
// plugin of one Host.
//
// A module no Host uses is kept for the next load, up to maxIdleModules in the process
// (least recently used first out); an engine with neither hosts nor modules is closed.

// maxIdleModules bounds the compiled modules the process keeps that no Host uses.
const maxIdleModules = 8

type engineKey struct {
	cacheDir string
	memPages uint32
}

// engine is a runtime shared by the hosts of one configuration.
type engine struct {
	key   engineKey
	rt    wazero.Runtime
	hosts int             // Hosts using it; engines.mu
	mods  []*sharedModule // engines.mu
}

// sharedModule is a module compiled in an engine, with the bytes it was compiled from.
type sharedModule struct {
	wasm     []byte
	compiled wazero.CompiledModule
	users    int    // Hosts holding it; engines.mu
	idleAt   uint64 // engines.tick when its last user let go
}

var engines = struct {
	mu   sync.Mutex
	m    map[engineKey]*engine
	tick uint64
}{m: map[engineKey]*engine{}}

// acquireEngine returns the engine of key, making it (runtime, WASI, host functions) when
// the process has none; the caller must releaseEngine it.
func acquireEngine(ctx context.Context, key engineKey) (*engine, error) {
	engines.mu.Lock()
	defer engines.mu.Unlock()
	if e := engines.m[key]; e != nil {
		e.hosts++
		return e, nil
	}
	cache, err := wazero.NewCompilationCacheWithDir(key.cacheDir)
	if err != nil {
		return nil, fmt.Errorf("open compilation cache %s: %w", key.cacheDir, err)
	}
	rc := wazero.NewRuntimeConfig().
		WithCompilationCache(cache).
		WithCloseOnContextDone(true). // the only way to stop a runaway guest
		WithMemoryLimitPages(key.memPages)
	// The runtime outlives the ctx of the New that made it.
	rctx := context.WithoutCancel(ctx)
	rt := wazero.NewRuntimeWithConfig(rctx, rc)
	if _, err := wasi_snapshot_preview1.Instantiate(rctx, rt); err != nil {
		rt.Close(rctx)
		return nil, fmt.Errorf("instantiate WASI: %w", err)
	}
	if err := instantiateHostModules(rctx, rt); err != nil {
		rt.Close(rctx)
		return nil, err
	}
	e := &engine{key: key, rt: rt, hosts: 1}
	engines.m[key] = e
	return e, nil
}

// releaseEngine lets go of e for a Host that is closing, and of the modules it held.
func releaseEngine(ctx context.Context, e *engine, held []*sharedModule) {
	engines.mu.Lock()
	defer engines.mu.Unlock()
	for _, m := range held {
		m.users--
		if m.users == 0 {
			engines.tick++
			m.idleAt = engines.tick
		}
	}
	e.hosts--
	evictIdle(ctx)
	closeIfUnused(ctx, e)
}

// evictIdle closes the least recently used idle modules past maxIdleModules.
func evictIdle(ctx context.Context) {
	for {
		var idle int
		var oldest *sharedModule
		var in *engine
		for _, e := range engines.m {
			for _, m := range e.mods {
				if m.users > 0 {
					continue
				}
				idle++
				if oldest == nil || m.idleAt < oldest.idleAt {
					oldest, in = m, e
				}
			}
		}
		if idle <= maxIdleModules {
			return
		}
		in.mods = deleteModule(in.mods, oldest)
		oldest.compiled.Close(ctx)
		closeIfUnused(ctx, in)
	}
}

// closeIfUnused closes an engine with no hosts and no modules.
func closeIfUnused(ctx context.Context, e *engine) {
	if e.hosts > 0 || len(e.mods) > 0 || engines.m[e.key] != e {
		return
	}
	delete(engines.m, e.key)
	e.rt.Close(context.WithoutCancel(ctx))
}

func deleteModule(mods []*sharedModule, m *sharedModule) []*sharedModule {
	for i, x := range mods {
		if x == m {
			return append(mods[:i], mods[i+1:]...)
		}
	}
	return mods
}

// compile returns the module of wasm compiled in the host's engine: the one the process
// has already compiled from the same bytes, or a new one. The host holds it until Close.
func (h *Host) compile(ctx context.Context, wasm []byte) (wazero.CompiledModule, error) {
	e := h.eng
	if m := e.find(wasm); m != nil {
		h.hold(m)
		return m.compiled, nil
	}
	// Compiled outside the lock: another Host may compile the same bytes meanwhile; the
	// first one in is kept (wazero counts the references to the machine code, so closing
	// the other frees nothing the first uses).
	compiled, err := e.rt.CompileModule(compileContext(ctx), wasm)
	if err != nil {
		return nil, err
	}
	engines.mu.Lock()
	m := e.findLocked(wasm)
	if m == nil {
		m = &sharedModule{wasm: bytes.Clone(wasm), compiled: compiled}
		e.mods = append(e.mods, m)
		compiled = nil
	}
	m.users++
	engines.mu.Unlock()
	if compiled != nil {
		compiled.Close(ctx)
	}
	h.hold(m)
	return m.compiled, nil
}

// find returns e's module of wasm, counting a new user, or nil.
func (e *engine) find(wasm []byte) *sharedModule {
	engines.mu.Lock()
	defer engines.mu.Unlock()
	m := e.findLocked(wasm)
	if m != nil {
		m.users++
	}
	return m
}

func (e *engine) findLocked(wasm []byte) *sharedModule {
	for _, m := range e.mods {
		if len(m.wasm) == len(wasm) && bytes.Equal(m.wasm, wasm) {
			return m
		}
	}
	return nil
}

// hold notes that the host holds m (its user count is already up).
func (h *Host) hold(m *sharedModule) {
	h.heldMu.Lock()
	h.held = append(h.held, m)
	h.heldMu.Unlock()
}
