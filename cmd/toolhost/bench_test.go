package main

import (
	"context"
	"log/slog"
	"testing"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/internal/builtins"
	"github.com/toolhost/toolhost/internal/host"
)

// builtinConfig is the host configuration the CLI uses by default: the four built-in
// plugins, embedded in the binary, with the compilation cache in dataDir.
func builtinConfig(b *testing.B, dataDir string) host.Config {
	cfg := host.Config{DataDir: dataDir, Logger: slog.New(slog.DiscardHandler)}
	for _, p := range builtins.Builtins() {
		wasm, err := builtins.Wasm(p.File)
		if err != nil {
			b.Fatal(err)
		}
		cfg.Plugins = append(cfg.Plugins, host.PluginSpec{Path: "builtin:" + p.File, Wasm: wasm, Grants: p.Grants})
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
	if n := len(h.Tools()); n != 12 {
		b.Fatalf("%d tools, want 12", n)
	}
	h.Close(ctx)
	b.StartTimer()
}

// BenchmarkLoadBuiltinsWarm: host.New with the four built-in plugins, their compilation
// cache already on disk (what every CLI start after the first one pays).
func BenchmarkLoadBuiltinsWarm(b *testing.B) {
	cfg := builtinConfig(b, b.TempDir())
	loadBuiltins(b, cfg) // fill the cache
	for b.Loop() {
		loadBuiltins(b, cfg)
	}
}

// BenchmarkLoadBuiltinsCold: the same with an empty cache: every module is compiled.
func BenchmarkLoadBuiltinsCold(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		cfg := builtinConfig(b, b.TempDir())
		b.StartTimer()
		loadBuiltins(b, cfg)
	}
}

// BenchmarkNewWarm: toolhost.New with the default configuration and a warm cache: the
// plugins plus the store, what the CLI does before its first tool call.
func BenchmarkNewWarm(b *testing.B) {
	cfg := toolhost.DefaultConfig()
	cfg.DataDir = b.TempDir()
	ctx := context.Background()
	open := func() {
		th, err := toolhost.New(ctx, cfg, toolhost.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		th.Close(ctx)
		b.StartTimer()
	}
	open() // fill the cache
	for b.Loop() {
		open()
	}
}
