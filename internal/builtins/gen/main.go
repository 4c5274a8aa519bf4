// Command gen rebuilds the built-in plugins into internal/builtins/wasm and writes their manifest:
// what `make plugins` (go generate ./internal/builtins) runs. Run it from the plugins directory.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/toolhost/toolhost/internal/builtins"
	"github.com/toolhost/toolhost/internal/host"
	"github.com/toolhost/toolhost/internal/wasmbuild"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "plugins: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	root := filepath.Dir(filepath.Dir(wd)) // go generate runs in the directory of plugins.go
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		return fmt.Errorf("run from the internal/builtins directory of the module (go generate ./internal/builtins): %w", err)
	}
	dir := filepath.Join(wd, "wasm")
	m := wasmbuild.Manifest{Go: wasmbuild.Toolchain(), Flags: strings.Join(wasmbuild.Flags, " "),
		Plugins: map[string]wasmbuild.Record{}}
	seeds := map[string][]host.Seed{}
	for _, b := range builtins.Builtins() {
		pkg := "plugins/" + b.Name
		out := filepath.Join(dir, b.File)
		fmt.Printf("GOOS=wasip1 GOARCH=wasm go build %s -o internal/builtins/wasm/%s ./%s\n", m.Flags, b.File, pkg)
		if err := wasmbuild.Build("", root, pkg, out+".tmp", os.Stderr); err != nil {
			return err
		}
		if err := os.Rename(out+".tmp", out); err != nil {
			return err
		}
		wasm, err := os.ReadFile(out)
		if err != nil {
			return err
		}
		src, err := wasmbuild.SourceDigest(root, pkg)
		if err != nil {
			return err
		}
		m.Plugins[b.Name] = wasmbuild.Record{Sources: src, Wasm: wasmbuild.Digest(wasm)}
		// What the plugin's first load records under the default configuration and each
		// of its SeedEnvs: with them, a host on a fresh data dir registers the built-ins
		// without compiling them.
		spec := host.PluginSpec{Path: out, Wasm: wasm, Grants: b.Grants}
		if seeds[b.File], err = host.MakeSeeds(context.Background(), host.Config{}, spec, b.SeedEnvs); err != nil {
			return err
		}
	}
	if err := m.Write(dir); err != nil {
		return err
	}
	return writeSeeds(filepath.Join(dir, builtins.SeedsFile), seeds)
}

func writeSeeds(path string, seeds map[string][]host.Seed) error {
	b, err := json.MarshalIndent(seeds, "", "  ")
	if err != nil {
		return err
	}
	fmt.Printf("seeds -> internal/builtins/wasm/%s\n", filepath.Base(path))
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
