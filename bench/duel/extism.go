package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"

	extism "github.com/extism/go-sdk"
	"github.com/tetratelabs/wazero"

	"github.com/toolhost/toolhost/core/sandbox"
)

// extismRT is Extism's Go SDK with the duel plugin, its host function reading from the
// same in-memory sandbox as toolhost's.
type extismRT struct {
	dir      string
	wasm     []byte
	sb       sandbox.Sandbox
	compiled *extism.CompiledPlugin
	plugin   *extism.Plugin
	ins      map[string][]byte
	fn       map[string]string
}

// The same limits as toolhost's defaults: a 10 s deadline on every call and 128 MiB of
// memory.
const (
	extismTimeoutMS = 10_000
	extismMaxPages  = 128 * 16
)

func newExtism(ctx context.Context, dir string, wasm []byte, sb sandbox.Sandbox) (*extismRT, error) {
	rt := &extismRT{dir: dir, wasm: wasm, sb: sb, ins: map[string][]byte{},
		fn: map[string]string{"noop": "noop", "read4k": "read", "echo64k": "echo"}}
	// Extism's inputs are raw bytes: the path, the text.
	rt.ins["noop"], rt.ins["read4k"], rt.ins["echo64k"] = nil, []byte("f.txt"), []byte(echoText)
	var err error
	if rt.compiled, rt.plugin, err = rt.open(ctx); err != nil {
		return nil, err
	}
	return rt, nil
}

// open compiles the plugin in a new runtime with the on-disk cache and instantiates it.
func (rt *extismRT) open(ctx context.Context) (*extism.CompiledPlugin, *extism.Plugin, error) {
	cache, err := wazero.NewCompilationCacheWithDir(rt.dir)
	if err != nil {
		return nil, nil, err
	}
	manifest := extism.Manifest{
		Wasm:    []extism.Wasm{extism.WasmData{Data: rt.wasm}},
		Timeout: extismTimeoutMS,
		Memory:  &extism.ManifestMemory{MaxPages: extismMaxPages},
	}
	readFile := extism.NewHostFunctionWithStack("read_file", func(ctx context.Context, p *extism.CurrentPlugin, stack []uint64) {
		path, err := p.ReadString(stack[0])
		if err != nil {
			panic(err)
		}
		abs, err := sandbox.Resolve(path)
		if err != nil {
			panic(err)
		}
		data, err := rt.sb.ReadFile(ctx, abs, 16<<20)
		if err != nil {
			panic(err)
		}
		if stack[0], err = p.WriteBytes(data); err != nil {
			panic(err)
		}
	}, []extism.ValueType{extism.ValueTypePTR}, []extism.ValueType{extism.ValueTypePTR})
	compiled, err := extism.NewCompiledPlugin(ctx, manifest, extism.PluginConfig{
		EnableWasi:    true,
		RuntimeConfig: wazero.NewRuntimeConfig().WithCompilationCache(cache),
	}, []extism.HostFunction{readFile})
	if err != nil {
		return nil, nil, err
	}
	// The same module configuration as toolhost gives its plugins: real clocks, real
	// randomness, sleeps in short slices.
	mc := wazero.NewModuleConfig().WithSysNanotime().WithSysWalltime().WithRandSource(rand.Reader).
		WithNanosleep(func(ns int64) { time.Sleep(time.Duration(min(ns, int64(5*time.Millisecond)))) })
	plugin, err := compiled.Instance(ctx, extism.PluginInstanceConfig{ModuleConfig: mc})
	if err != nil {
		compiled.Close(ctx)
		return nil, nil, err
	}
	return compiled, plugin, nil
}

func (rt *extismRT) call(ctx context.Context, c string) (string, error) {
	return callExtism(ctx, rt.plugin, rt.fn[c], rt.ins[c])
}

func callExtism(ctx context.Context, p *extism.Plugin, fn string, in []byte) (string, error) {
	rc, out, err := p.CallWithContext(ctx, fn, in)
	if err != nil {
		return "", err
	}
	if rc != 0 {
		return "", fmt.Errorf("%s returned %d", fn, rc)
	}
	return string(out), nil
}

func (rt *extismRT) load(ctx context.Context) error {
	compiled, plugin, err := rt.open(ctx)
	if err != nil {
		return err
	}
	defer compiled.Close(ctx)
	defer plugin.Close(ctx)
	_, err = callExtism(ctx, plugin, "noop", nil)
	return err
}

func (rt *extismRT) close(ctx context.Context) {
	rt.plugin.Close(ctx)
	rt.compiled.Close(ctx)
}
