package host

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/internal/builtins"
	"github.com/toolhost/toolhost/internal/memsandbox"
	"github.com/toolhost/toolhost/internal/testenv"
)

// A plugin this engine never compiled answers its first call in its quick form (the
// interpreter's), builds its compiled form in the background from that call on, retires
// its interpreted instances once the compiled form is in, and notes in its record that
// this engine compiled it: the next host then waits for the compiled form (a cache hit)
// instead of interpreting.
func TestQuickFormThenCompiled(t *testing.T) {
	ctx := context.Background()
	records := filepath.Join(t.TempDir(), recordsDir) // the compilation cache is the package's
	cfg := Config{DataDir: dataDir, Plugins: []PluginSpec{{Path: probePath(t), Grants: allGrants}}}
	h, err := newWithRecords(ctx, cfg, records)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(ctx) })
	p := h.plugins[0]
	if p.fromRecord || p.quick.t == nil {
		t.Fatalf("first load: from record %v, quick form %v; want loaded in its quick form", p.fromRecord, p.quick.t)
	}
	if _, _, ok := p.compiledTier(); ok {
		t.Fatal("the compiled form was built before any call asked")
	}
	if rec, ok := h.readRecord(p.key); !ok || rec.Compiled != "" {
		t.Fatalf("record after a quick load: %+v, %v; want one that says it was not compiled", rec, ok)
	}

	s := h.OpenSession(memsandbox.New())
	if res, err := s.Dispatch(ctx, "echo", json.RawMessage(`{"text":"hi"}`)); err != nil || testenv.ResultText(res) != "hi" {
		t.Fatalf("first call: %+v, %v", res, err)
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Minute) // a hang bound
	defer cancel()
	if err := h.Settle(sctx); err != nil {
		t.Fatal(err)
	}
	if tr, err, ok := p.compiledTier(); !ok || err != nil || tr.quick {
		t.Fatalf("after Settle: compiled form %v, %v, %v", tr, err, ok)
	}
	if res, err := s.Dispatch(ctx, "echo", json.RawMessage(`{"text":"again"}`)); err != nil || testenv.ResultText(res) != "again" {
		t.Fatalf("call after compiling: %+v, %v", res, err)
	}
	for range len(p.pool.idle) {
		inst := <-p.pool.idle
		if inst.t.quick {
			t.Error("an interpreted instance stayed in the pool after the compiled form came in")
		}
		p.pool.idle <- inst
	}
	if rec, ok := h.readRecord(p.key); !ok || rec.Compiled != engineID() {
		t.Fatalf("record after compiling: %+v, %v; want Compiled %q", rec, ok, engineID())
	}

	h2, err := newWithRecords(ctx, cfg, records)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h2.Close(ctx) })
	p2 := h2.plugins[0]
	if !p2.fromRecord || !p2.warm {
		t.Fatalf("second host: from record %v, warm %v; want both", p2.fromRecord, p2.warm)
	}
	if res, err := h2.OpenSession(memsandbox.New()).Dispatch(ctx, "echo", json.RawMessage(`{"text":"hi"}`)); err != nil || testenv.ResultText(res) != "hi" {
		t.Fatalf("call on the second host: %+v, %v", res, err)
	}
	if p2.quick.done != nil {
		t.Error("a plugin this engine compiled before was interpreted")
	}
}

// The quick form is slower, so its budget is larger, but a runaway guest is still stopped
// and the message states the plugin's own budget.
func TestQuickFormBudget(t *testing.T) {
	ctx := context.Background()
	cfg := Config{DataDir: dataDir, CallTimeout: 50 * time.Millisecond, Plugins: []PluginSpec{{Path: probePath(t), Grants: allGrants}}}
	h, err := newWithRecords(ctx, cfg, filepath.Join(t.TempDir(), recordsDir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(ctx) })
	if h.plugins[0].quick.t == nil {
		t.Fatal("not loaded in its quick form")
	}
	_, err = h.OpenSession(memsandbox.New()).Dispatch(ctx, "spin", json.RawMessage(`{}`))
	if !errors.Is(err, ErrPluginTimeout) || !strings.Contains(err.Error(), "50ms of work") {
		t.Fatalf("spin in the quick form: %v", err)
	}
}

// A seed registers the plugin with nothing compiled or interpreted at New; it is checked
// against the module before the plugin serves (a seed that lies fails the calls), and it
// is used only with the environment it was made with.
func TestSeed(t *testing.T) {
	ctx := context.Background()
	spec := PluginSpec{Path: probePath(t), Grants: allGrants}
	seed, err := MakeSeed(ctx, Config{}, spec)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(seed.Manifest, `"echo"`) || len(seed.Imports) == 0 {
		t.Fatalf("seed: %+v", seed)
	}
	open := func(sd Seed) *Host {
		t.Helper()
		spec.Seeds = []Seed{sd}
		h, err := newWithRecords(ctx, Config{DataDir: dataDir, Plugins: []PluginSpec{spec}}, filepath.Join(t.TempDir(), recordsDir))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close(ctx) })
		return h
	}

	h := open(seed)
	if p := h.plugins[0]; !p.fromRecord || p.quick.done != nil {
		t.Fatalf("seeded: from record %v, quick form started %v", p.fromRecord, p.quick.done != nil)
	}
	if res, err := h.OpenSession(memsandbox.New()).Dispatch(ctx, "echo", json.RawMessage(`{"text":"hi"}`)); err != nil || testenv.ResultText(res) != "hi" {
		t.Fatalf("seeded call: %+v, %v", res, err)
	}

	lying := seed
	lying.Manifest = strings.Replace(seed.Manifest, `"echo"`, `"echo2"`, 1)
	h = open(lying)
	_, err = h.OpenSession(memsandbox.New()).Dispatch(ctx, "echo2", json.RawMessage(`{"text":"hi"}`))
	if !errors.Is(err, ErrPluginFailed) || !strings.Contains(err.Error(), "tools differ") {
		t.Fatalf("a seed with another manifest: %v", err)
	}

	other := seed
	other.Env = maps.Clone(seed.Env)
	other.Env["X"] = "1"
	other.Manifest = lying.Manifest
	if p := open(other).plugins[0]; p.fromRecord {
		t.Fatal("a seed made with another environment was used")
	}
}

// With Config.OnDemand (a program that makes one call: the CLI's call) New compiles
// nothing ahead, even what the cache holds; a call compiles its own plugin only, and
// Ready the rest. Without it every plugin this engine compiled before is compiled in the
// background from New on: decoding and validating each is tens of milliseconds of CPU.
func TestOnDemand(t *testing.T) {
	ctx := context.Background()
	var specs []PluginSpec
	for _, b := range builtins.Builtins() {
		if b.File != "grepglob.wasm" && b.File != "screenshot.wasm" {
			continue
		}
		wasm, err := builtins.Wasm(b.File)
		if err != nil {
			t.Fatal(err)
		}
		specs = append(specs, PluginSpec{Path: "builtin:" + b.File, Wasm: wasm, Grants: b.Grants})
	}
	if len(specs) != 2 {
		t.Fatalf("%d of the built-ins grepglob and screenshot found", len(specs))
	}
	records := filepath.Join(t.TempDir(), recordsDir) // the compilation cache is the package's
	cfg := Config{DataDir: dataDir, Plugins: specs}
	h, err := newWithRecords(ctx, cfg, records)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Minute) // a hang bound
	defer cancel()
	if err := h.Ready(rctx); err != nil { // both compiled and recorded so
		t.Fatal(err)
	}
	h.Close(ctx)

	cfg.OnDemand = true
	h, err = newWithRecords(ctx, cfg, records)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(ctx) })
	byName := map[string]*plugin{}
	for _, p := range h.plugins {
		if !p.warm {
			t.Fatalf("plugin %s is not recorded as compiled by this engine", p.name)
		}
		byName[p.name] = p
	}
	grep, shot := byName["grepglob"], byName["screenshot"]
	if grep == nil || shot == nil {
		t.Fatalf("plugins %v", maps.Keys(byName))
	}
	if res, err := h.OpenSession(memsandbox.New()).Dispatch(rctx, "glob", json.RawMessage(`{"pattern":"*"}`)); err != nil || res.IsError {
		t.Fatalf("glob: %+v, %v", res, err)
	}
	h.finishing.Wait() // whatever New or the call started in the background has ended
	if _, err, ok := grep.compiledTier(); !ok || err != nil {
		t.Fatalf("the called plugin: compiled %v, %v", ok, err)
	}
	if _, _, ok := shot.compiledTier(); ok {
		t.Fatal("a plugin no call asked for was compiled")
	}
	if u := h.Unsettled(); len(u) != 0 {
		t.Errorf("Unsettled after a call of a compiled plugin: %v", u)
	}
	if err := h.Ready(rctx); err != nil {
		t.Fatal(err)
	}
	if _, err, ok := shot.compiledTier(); !ok || err != nil {
		t.Fatalf("after Ready: compiled %v, %v", ok, err)
	}
}

// ReadyFor waits for the compiled form of the plugins of the tools it names, and refuses
// a tool no plugin serves.
func TestReadyFor(t *testing.T) {
	ctx := context.Background()
	records := filepath.Join(t.TempDir(), recordsDir)
	cfg := Config{DataDir: dataDir, Plugins: []PluginSpec{{Path: probePath(t), Grants: allGrants}}}
	h, err := newWithRecords(ctx, cfg, records)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(ctx) })
	if err := h.ReadyFor(ctx, "echo", "no_such_tool"); err == nil || !strings.Contains(err.Error(), "no_such_tool") {
		t.Fatalf("ReadyFor of an unknown tool: %v, want an error naming it", err)
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Minute) // a hang bound
	defer cancel()
	if err := h.ReadyFor(rctx, "echo"); err != nil {
		t.Fatal(err)
	}
	if tr, err, ok := h.plugins[0].compiledTier(); !ok || err != nil || tr.quick {
		t.Fatalf("after ReadyFor: compiled form %v, %v, %v", tr, err, ok)
	}
}
