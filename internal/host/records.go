package host

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/toolhost/toolhost/abi"
)

// A plugin's record is what loading it learnt that does not change while its bytes and its
// configuration do not: its imports and its manifest. With a record, New checks the
// grants and registers the tools without compiling anything; the module is compiled,
// checked again against the record and warmed in the background, and a call to one of its
// tools waits for that (see plugin.finish). A warm start thus skips what dominated it:
// wazero decoding and validating each 3 MB module, about 30 ms each, even on a hit of its
// compilation cache.
//
// Records live next to the compiled code, in the data dir's cache, which privateDir keeps
// this user's own: they are trusted as the compiled code is. They are keyed by the
// SHA-256 of the module and of its environment (a manifest may depend on its
// configuration: bash's description states its timeouts), so a changed module or
// configuration is a miss and is loaded in full. Beside them, a module's compiled mark
// (compiledKey, keyed by the module alone) says that this engine has compiled it, under
// whichever configuration: a record made under another one is still warm.

// recordsDir is the directory of the records under the cache dir; the suffix changes with
// the record's format.
const recordsDir = "toolhost-records-v1"

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type record struct {
	Imports []Import `json:"imports"`
	// Manifest is the manifest's text as the plugin's describe export returned it.
	Manifest string `json:"manifest"`
	// Compiled names the optimizing compiler (engineID) that compiled the module into the
	// cache next to the record; "" when only the interpreter has run it (tier.go).
	Compiled string `json:"compiled,omitempty"`
}

// recordKey is the key of a module with its environment. The module is summed with two
// CRC-32s (Castagnoli and IEEE, both done by the CPU, about 1 ms for the 12 MB of the
// built-ins, where SHA-256 took 30 ms here): the key finds a record, it proves nothing,
// because finish checks the compiled module against its record before the plugin serves
// a call. A collision, by chance or made on purpose, costs a failed load, never a grant.
func recordKey(wasm []byte, env map[string]string) string {
	h := sha256.New()
	writeModuleSum(h, wasm)
	fmt.Fprintf(h, "abi %d\n", abi.Version)
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(h, "%q=%q\n", k, env[k])
	}
	return hex.EncodeToString(h.Sum(nil))
}

func writeModuleSum(w io.Writer, wasm []byte) {
	fmt.Fprintf(w, "module %d %08x %08x\n", len(wasm), crc32.Checksum(wasm, castagnoli), crc32.ChecksumIEEE(wasm))
}

// compiledKey is the key of a module's compiled mark: what the optimizing compiler made
// of a module does not depend on the plugin's environment, so a module compiled under one
// configuration (toolhost tools --warm's) is warm under every other (a one-shot call's,
// which turns editfile's guard off).
func compiledKey(wasm []byte) string {
	h := sha256.New()
	io.WriteString(h, "compiled\n")
	writeModuleSum(h, wasm)
	return hex.EncodeToString(h.Sum(nil))
}

// compiledBefore reports whether this engine (engineID) has compiled the module into the
// cache, under any environment.
func (h *Host) compiledBefore(key string) bool {
	b, err := os.ReadFile(filepath.Join(h.records, key+".compiled"))
	if err != nil {
		return false
	}
	now := time.Now()
	_ = os.Chtimes(filepath.Join(h.records, key+".compiled"), now, now)
	return string(b) == engineID()
}

// markCompiled records that this engine has compiled the module of key into the cache.
func (h *Host) markCompiled(key string) error {
	return h.writeRecordFile(key+".compiled", []byte(engineID()))
}

func (h *Host) recordPath(key string) string {
	return filepath.Join(h.records, key+".json")
}

// readRecord returns the record of key, if there is a readable one. A hit marks the
// record used (its modification time), which is what PruneCache goes by.
func (h *Host) readRecord(key string) (record, bool) {
	p := h.recordPath(key)
	b, err := os.ReadFile(p)
	if err != nil {
		return record{}, false
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return record{}, false
	}
	now := time.Now()
	_ = os.Chtimes(p, now, now)
	return r, true
}

// writeRecord stores a record atomically (a temporary file renamed), so that a concurrent
// reader sees the whole of it or nothing.
func (h *Host) writeRecord(key string, r record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return h.writeRecordFile(key+".json", b)
}

// writeRecordFile writes the records directory's file name atomically.
func (h *Host) writeRecordFile(name string, b []byte) error {
	p := filepath.Join(h.records, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(p), name+".*.tmp")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), p)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

func (h *Host) dropRecord(key string) {
	if err := os.Remove(h.recordPath(key)); err != nil && !errors.Is(err, os.ErrNotExist) {
		h.log.Warn("could not remove a plugin record", "err", err)
	}
}

// MakeSeed loads a plugin with the interpreter, in a data dir of its own that it removes,
// and returns what its first load records under cfg (its DataDir and Plugins are
// ignored): the built-ins' seeds are made so when they are built (internal/builtins/gen).
func MakeSeed(ctx context.Context, cfg Config, spec PluginSpec) (Seed, error) {
	dir, err := os.MkdirTemp("", "toolhost-seed-")
	if err != nil {
		return Seed{}, err
	}
	defer os.RemoveAll(dir)
	cfg.DataDir, cfg.Plugins, cfg.noQuick = dir, []PluginSpec{spec}, false
	cfg = cfg.withDefaults()
	h, err := newRuntime(ctx, cfg)
	if err != nil {
		return Seed{}, err
	}
	defer h.Close(ctx)
	spec.Seeds = nil
	p, err := h.loadPlugin(ctx, spec)
	if err != nil {
		return Seed{}, err
	}
	h.plugins = append(h.plugins, p) // for Close
	if p.rawManifest == "" {
		return Seed{}, fmt.Errorf("plugin %s: the interpreter could not load it", p)
	}
	return Seed{Env: h.pluginEnv(spec), Imports: p.imports, Manifest: p.rawManifest}, nil
}

// MakeSeeds makes the plugin's seed under spec's environment, then one under each of envs
// (each added to spec's).
func MakeSeeds(ctx context.Context, cfg Config, spec PluginSpec, envs []map[string]string) ([]Seed, error) {
	seeds := make([]Seed, 0, 1+len(envs))
	base := spec.Env
	for i := -1; i < len(envs); i++ {
		spec.Env = maps.Clone(base)
		if i >= 0 {
			if spec.Env == nil {
				spec.Env = map[string]string{}
			}
			maps.Copy(spec.Env, envs[i])
		}
		seed, err := MakeSeed(ctx, cfg, spec)
		if err != nil {
			return nil, err
		}
		seeds = append(seeds, seed)
	}
	return seeds, nil
}
