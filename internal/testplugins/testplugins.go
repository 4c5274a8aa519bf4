// Package testplugins builds WebAssembly plugins from source for tests, so every test runs
// real modules built from the tree as it is. Builds are cached per process and by the Go
// build cache across processes.
package testplugins

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"

	"github.com/toolhost/toolhost/internal/builtins"
	"github.com/toolhost/toolhost/internal/wasmbuild"
)

var (
	mu    sync.Mutex
	built = map[string]string{}
	dir   string
)

// Root returns the module's root directory.
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Build compiles the plugin package at pkg (relative to the module root, e.g.
// "plugins/editfile") for wasip1 as a reactor, the way `make plugins` does (so the build
// cache serves both, and any clone), and returns the .wasm path.
func Build(pkg string) (string, error) {
	mu.Lock()
	defer mu.Unlock()
	if p, ok := built[pkg]; ok {
		return p, nil
	}
	if dir == "" {
		d, err := os.MkdirTemp("", "toolhost-testplugins-")
		if err != nil {
			return "", err
		}
		dir = d
	}
	out := filepath.Join(dir, filepath.Base(pkg)+".wasm")
	var stderr bytes.Buffer
	if err := wasmbuild.Build("", Root(), pkg, out, &stderr); err != nil {
		return "", fmt.Errorf("build plugin %s: %v\n%s", pkg, err, stderr.Bytes())
	}
	built[pkg] = out
	return out, nil
}

// DataDir is the data directory tests share for the host's compilation cache, so each
// plugin is compiled once per machine rather than once per test package (slow under
// -race). wazero writes cache entries atomically, so parallel test processes can share it.
func DataDir() string { return filepath.Join(os.TempDir(), "toolhost-test-data") }

// LinkCache links dataDir's compilation cache to the shared one (DataDir's), creating the
// shared one first: on a fresh machine (an empty TMPDIR) nothing else has yet, and a link
// to a missing directory makes the host's mkdir of the cache fail with "file exists".
func LinkCache(dataDir string) error {
	shared := filepath.Join(DataDir(), "cache")
	if err := os.MkdirAll(shared, 0o700); err != nil {
		return err
	}
	return os.Symlink(shared, filepath.Join(dataDir, "cache"))
}

// MustBuild is Build for TestMain and benchmarks: it panics on failure.
func MustBuild(pkg string) string {
	p, err := Build(pkg)
	if err != nil {
		panic(err)
	}
	return p
}

// Builtins maps each default built-in plugin package (not the opt-in ones) to the grants
// it needs.
var Builtins = func() []struct {
	Pkg    string
	Grants []string
} {
	var out []struct {
		Pkg    string
		Grants []string
	}
	for _, b := range builtins.Builtins() {
		if b.OptIn {
			continue // webfetch: its tests load it with a web scope of their own
		}
		var grants []string
		for _, g := range b.Grants {
			grants = append(grants, string(g))
		}
		out = append(out, struct {
			Pkg    string
			Grants []string
		}{"plugins/" + b.Name, grants})
	}
	return out
}()
