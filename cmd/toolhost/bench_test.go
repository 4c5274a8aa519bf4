package main

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/cmd/toolhost/internal/config"
	"github.com/toolhost/toolhost/host"
)

// builtinConfig is the host configuration the CLI uses by default, with the plugins built
// by TestMain and the compilation cache in dataDir.
func builtinConfig(dataDir string) host.Config {
	cfg := host.Config{DataDir: dataDir, Logger: slog.New(slog.DiscardHandler)}
	for _, p := range config.BuiltinPlugins() {
		spec := host.PluginSpec{Path: filepath.Join(binDir, "plugins", p.Path)}
		for _, g := range p.Grants {
			spec.Grants = append(spec.Grants, abi.Capability(g))
		}
		cfg.Plugins = append(cfg.Plugins, spec)
	}
	return cfg
}

func loadBuiltins(b *testing.B, cfg host.Config) {
	ctx := context.Background()
	h, err := host.New(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if n := len(h.Tools()); n != 7 {
		b.Fatalf("%d tools, want 7", n)
	}
	h.Close(ctx)
	b.StartTimer()
}

// BenchmarkLoadBuiltinsWarm: host.New with the four built-in plugins, their compilation
// cache already on disk (what every CLI start after the first one pays).
func BenchmarkLoadBuiltinsWarm(b *testing.B) {
	cfg := builtinConfig(b.TempDir())
	loadBuiltins(b, cfg) // fill the cache
	for b.Loop() {
		loadBuiltins(b, cfg)
	}
}

// BenchmarkLoadBuiltinsCold: the same with an empty cache: every module is compiled.
func BenchmarkLoadBuiltinsCold(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		cfg := builtinConfig(b.TempDir())
		b.StartTimer()
		loadBuiltins(b, cfg)
	}
}
