package host

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/memsandbox"
	"github.com/toolhost/toolhost/internal/testenv"
)

// A plugin loaded once is recorded; the next host registers it from its record and
// compiles it in the background, checking the module against the record: a record that
// lies makes the plugin fail its calls and is dropped, never trusted for more than it can
// prove.
func TestLoadFromRecord(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	// The compilation cache is shared with the package's other tests (a cold compile is
	// slow under -race); the records are this test's own.
	records := filepath.Join(dir, "cache", recordsDir)
	cfg := Config{DataDir: dataDir, Plugins: []PluginSpec{{Path: probePath(t), Grants: allGrants}}}
	open := func() *Host {
		t.Helper()
		h, err := newWithRecords(ctx, cfg, records)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close(ctx) })
		return h
	}
	echo := func(h *Host) (abi.Result, error) {
		return h.OpenSession(memsandbox.New()).Dispatch(ctx, "echo", json.RawMessage(`{"text":"hi"}`))
	}
	recordFile := func() string {
		t.Helper()
		m, _ := filepath.Glob(filepath.Join(records, "*.json"))
		if len(m) != 1 {
			t.Fatalf("records: %v, want one", m)
		}
		return m[0]
	}
	edit := func(f func(*record)) {
		t.Helper()
		p := recordFile()
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var r record
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatal(err)
		}
		f(&r)
		if b, err = json.Marshal(r); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	h := open() // loaded in full, then recorded
	if h.plugins[0].fromRecord {
		t.Fatal("the first load used a record")
	}
	recordFile()
	h2 := open() // from the record
	if !h2.plugins[0].fromRecord {
		t.Fatal("the second load did not use the record")
	}
	if res, err := echo(h2); err != nil || testenv.ResultText(res) != "hi" {
		t.Fatalf("echo from a recorded plugin: %+v, %v", res, err)
	}
	if err := h2.Ready(ctx); err != nil {
		t.Fatal(err)
	}

	// Grants are checked against the recorded imports, as against the module's.
	_, err := newWithRecords(ctx, Config{DataDir: dataDir, Plugins: []PluginSpec{{Path: probePath(t), Grants: []abi.Capability{abi.CapLog}}}}, records)
	if err == nil || !strings.Contains(err.Error(), `"sandbox_exec"`) {
		t.Fatalf("ungranted import, from the record: err = %v", err)
	}

	// A record whose imports are not the module's: the plugin fails, the record goes.
	edit(func(r *record) { r.Imports = r.Imports[1:] })
	h3 := open()
	_, err = echo(h3)
	if !errors.Is(err, ErrPluginFailed) || !strings.Contains(err.Error(), "imports differ") {
		t.Fatalf("a record with other imports: err = %v", err)
	}
	if m, _ := filepath.Glob(filepath.Join(records, "*.json")); len(m) != 0 {
		t.Fatalf("the lying record was kept: %v", m)
	}
	open() // in full again, recorded again

	// A record whose manifest is not the module's: the same.
	edit(func(r *record) { r.Manifest = strings.Replace(r.Manifest, `"echo"`, `"echo2"`, 1) })
	h4 := open()
	if res, err := echo(h4); err != nil || !strings.Contains(testenv.ResultText(res), "unknown tool") {
		t.Fatalf("echo, which the record does not name: %+v, %v", res, err)
	}
	_, err = h4.OpenSession(memsandbox.New()).Dispatch(ctx, "echo2", json.RawMessage(`{"text":"hi"}`))
	if !errors.Is(err, ErrPluginFailed) || !strings.Contains(err.Error(), "tools differ") {
		t.Fatalf("a record with another manifest: err = %v", err)
	}
	if err := h4.Ready(ctx); !errors.Is(err, ErrPluginFailed) {
		t.Fatalf("Ready: %v", err)
	}

	// A record that is not JSON is a miss.
	open()
	if err := os.WriteFile(recordFile(), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if h := open(); h.plugins[0].fromRecord {
		t.Fatal("a damaged record was used")
	}
}

// newWithRecords is New with the records in dir.
func newWithRecords(ctx context.Context, cfg Config, dir string) (*Host, error) {
	cfg = cfg.withDefaults()
	h, err := newRuntime(ctx, cfg)
	if err != nil {
		return nil, err
	}
	h.records = dir
	if err := h.load(ctx, cfg.Plugins); err != nil {
		h.Close(ctx)
		return nil, err
	}
	return h, nil
}

// What the optimizing compiler made of a module does not depend on the plugin's
// environment: a module compiled under one configuration is warm under another (its calls
// wait for the cached compiled form instead of running interpreted, and nothing is left
// to compile after them). A one-shot `toolhost call write_file` turns editfile's guard
// off, and each one ran editfile interpreted and started a compile of its own although
// `toolhost tools --warm` had compiled it.
func TestCompiledUnderAnyEnv(t *testing.T) {
	ctx := context.Background()
	records := filepath.Join(t.TempDir(), recordsDir) // the compilation cache is the package's
	open := func(env map[string]string) *Host {
		t.Helper()
		cfg := Config{DataDir: dataDir, Plugins: []PluginSpec{{Path: probePath(t), Grants: allGrants, Env: env}}}
		h, err := newWithRecords(ctx, cfg, records)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close(ctx) })
		return h
	}
	h := open(nil) // loaded in full, then compiled, recorded and marked
	if h.plugins[0].fromRecord {
		t.Fatal("the first load used a record")
	}
	if err := h.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	// Another environment: no record of it, so the plugin is loaded again (in its quick
	// form), but it is warm: its calls wait for the compiled form.
	spec := PluginSpec{Path: probePath(t), Grants: allGrants, Env: map[string]string{"GUARD": "off"}}
	seed, err := MakeSeed(ctx, Config{}, spec)
	if err != nil {
		t.Fatal(err)
	}
	spec.Seeds = []Seed{seed}
	h2, err := newWithRecords(ctx, Config{DataDir: dataDir, Plugins: []PluginSpec{spec}}, records)
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Close(ctx)
	if p := h2.plugins[0]; !p.fromRecord || !p.warm {
		t.Fatalf("under another environment: from its seed %v, warm %v; want both", p.fromRecord, p.warm)
	}
	if res, err := h2.OpenSession(memsandbox.New()).Dispatch(ctx, "echo", json.RawMessage(`{"text":"hi"}`)); err != nil || testenv.ResultText(res) != "hi" {
		t.Fatalf("echo: %+v, %v", res, err)
	}
	if u := h2.Unsettled(); len(u) != 0 {
		t.Errorf("after a call under another environment, left to compile: %v", u)
	}

	// A mark another engine wrote (an older toolhost's) is not a hit.
	marks, _ := filepath.Glob(filepath.Join(records, "*.compiled"))
	if len(marks) != 1 {
		t.Fatalf("compiled marks: %v, want one", marks)
	}
	if err := os.WriteFile(marks[0], []byte("wazero v0.0.1 plan9 mips"), 0o600); err != nil {
		t.Fatal(err)
	}
	spec.Env = map[string]string{"GUARD": "on"}
	if spec.Seeds[0], err = MakeSeed(ctx, Config{}, spec); err != nil {
		t.Fatal(err)
	}
	h3, err := newWithRecords(ctx, Config{DataDir: dataDir, Plugins: []PluginSpec{spec}}, records)
	if err != nil {
		t.Fatal(err)
	}
	defer h3.Close(ctx)
	if p := h3.plugins[0]; p.warm {
		t.Error("warm by another engine's mark")
	}
}
