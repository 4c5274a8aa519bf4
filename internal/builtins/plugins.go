// Package builtins holds the built-in plugins (bash, editfile, grepglob, screenshot, and
// the opt-in webfetch) as WebAssembly modules embedded in every program that imports it,
// so the toolhost CLI and library users have them with no file next to the binary and no
// build step.
//
// The sources are the directories of plugins/ (plugins/bash, ...); the modules are internal/builtins/wasm,
// committed, because go:embed takes files from the source tree. `make plugins` (which runs
// go generate ./internal/builtins) rebuilds them with -trimpath for wasip1 and records the digest of
// their sources in wasm/manifest.json; a test of this package fails when the sources have
// changed since (see package wasmbuild).
package builtins

//go:generate go run ./gen

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/toolhost/toolhost/abi"
)

// The modules, one variable each: a []byte that go:embed fills points into the binary's
// own data, mapped from the executable and paged in when read, where embed.FS.ReadFile
// would copy each module.
var (
	//go:embed wasm/bash.wasm
	bashWasm []byte
	//go:embed wasm/editfile.wasm
	editfileWasm []byte
	//go:embed wasm/grepglob.wasm
	grepglobWasm []byte
	//go:embed wasm/screenshot.wasm
	screenshotWasm []byte
	//go:embed wasm/seeds.json
	seedsJSON []byte
	//go:embed wasm/webfetch.wasm
	webfetchWasm []byte
)

// SeedsFile is the file in wasm/ that holds the built-ins' seeds: for each module, what the
// host's first load of it records (its imports and manifest) under the default
// configuration and under each of its SeedEnvs, made by `make plugins`. The host
// registers a built-in from the seed made under its environment without compiling it, and
// checks the module against the seed before it serves a call.
const SeedsFile = "seeds.json"

// EditfileGuard is editfile's switch for its guarded writes: "off" lets write_file and
// edit_file change a file the session has not read (a one-shot call has read nothing).
const EditfileGuard = "TOOLHOST_EDITFILE_GUARD"

// Builtin is one built-in plugin.
type Builtin struct {
	// Name is the plugin's name, which is also its package directory: "bash".
	Name string
	// File is the module's file name, "bash.wasm": what a configuration's plugin path
	// names when it means the built-in.
	File string
	// Grants are the capabilities it needs.
	Grants []abi.Capability
	// Programs, when set, are the only programs it runs: the default configuration scopes
	// its sandbox_exec to them.
	Programs []string
	// OptIn: not among the default plugins; a configuration that wants it lists it.
	// webfetch is: it reaches the web from the host, which the operator decides.
	OptIn bool
	// SeedEnvs are the environments, besides none, that a configuration of this
	// repository gives the plugin and that it has seeds for: without a seed for its
	// environment, a fresh data dir loads the plugin in full before the first call
	// (editfile's ~0.7 s).
	SeedEnvs []map[string]string
}

var builtins = []Builtin{
	{Name: "bash", File: "bash.wasm", Grants: []abi.Capability{abi.CapSandboxExec, abi.CapLog}},
	// editfile runs poppler (pdfinfo, pdftotext, pdftoppm) in the sandbox to read PDFs.
	// `toolhost call` turns its guard off.
	{Name: "editfile", File: "editfile.wasm", Grants: []abi.Capability{abi.CapSandboxFiles, abi.CapSandboxExec, abi.CapLog},
		Programs: []string{"pdfinfo", "pdftotext", "pdftoppm"},
		SeedEnvs: []map[string]string{{EditfileGuard: "off"}}},
	{Name: "grepglob", File: "grepglob.wasm", Grants: []abi.Capability{abi.CapSandboxExec, abi.CapSandboxFiles, abi.CapLog}},
	{Name: "screenshot", File: "screenshot.wasm", Grants: []abi.Capability{abi.CapCapture, abi.CapLog}},
	// webfetch reaches the web through the host's egress gateway, within its web scope.
	{Name: "webfetch", File: "webfetch.wasm", Grants: []abi.Capability{abi.CapWeb, abi.CapLog}, OptIn: true},
}

// wasm maps a built-in's File to its module.
var wasm = map[string][]byte{
	"bash.wasm": bashWasm, "editfile.wasm": editfileWasm,
	"grepglob.wasm": grepglobWasm, "screenshot.wasm": screenshotWasm,
	"webfetch.wasm": webfetchWasm,
}

// Builtins lists the built-in plugins in their load order (bash, editfile, grepglob,
// screenshot, webfetch); the default configuration loads those that are not OptIn.
func Builtins() []Builtin {
	out := slices.Clone(builtins)
	for i := range out {
		out[i].Grants = slices.Clone(out[i].Grants)
		out[i].Programs = slices.Clone(out[i].Programs)
		out[i].SeedEnvs = slices.Clone(out[i].SeedEnvs)
		for j, env := range out[i].SeedEnvs {
			out[i].SeedEnvs[j] = maps.Clone(env)
		}
	}
	return out
}

// Lookup returns the built-in whose File is file ("bash.wasm").
func Lookup(file string) (Builtin, bool) {
	i := slices.IndexFunc(builtins, func(b Builtin) bool { return b.File == file })
	if i < 0 {
		return Builtin{}, false
	}
	return Builtins()[i], true
}

// Wasm returns the embedded module of the built-in named by file ("bash.wasm"). The bytes
// are the binary's own, shared by every caller: they must not be modified.
func Wasm(file string) ([]byte, error) {
	b, ok := wasm[file]
	if !ok {
		return nil, fmt.Errorf("%s is not a built-in plugin (built-ins: %s)", file, Files())
	}
	return b, nil
}

// Seeds returns the seeds of the built-in named by file ("bash.wasm") as JSON (a list of
// the host's Seed), or nil.
func Seeds(file string) []byte {
	var all map[string]json.RawMessage
	if json.Unmarshal(seedsJSON, &all) != nil {
		return nil
	}
	return all[file]
}

// Files is the built-ins' file names, comma-separated, for messages.
func Files() string {
	s := ""
	for i, b := range builtins {
		if i > 0 {
			s += ", "
		}
		s += b.File
	}
	return s
}
