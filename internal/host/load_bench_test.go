package host_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/toolhost/toolhost/internal/builtins"
	"github.com/toolhost/toolhost/internal/host"
)

// builtinConfig is the built-in plugins as the CLI loads them, embedded, with the data
// (compilation cache and records) in dataDir.
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

// loadBuiltins times host.New, and with ready its wait until every plugin is compiled and
// warm; Close is not timed.
func loadBuiltins(b *testing.B, cfg host.Config, ready bool) {
	ctx := context.Background()
	h, err := host.New(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	if ready {
		if err := h.Ready(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if n := len(h.Tools()); n != 7 {
		b.Fatalf("%d tools, want 7", n)
	}
	if err := h.Ready(ctx); err != nil {
		b.Fatal(err)
	}
	h.Close(ctx)
	b.StartTimer()
}

// BenchmarkLoadBuiltins: host.New with the four built-ins.
//
//   - warm: compilation cache and records on disk (every start after the first): New
//     returns with the tools registered and the grants checked, the compiling left to the
//     background.
//   - warm_ready: the same until every plugin is compiled and has an instance warm.
//   - cold: nothing on disk: every module compiled.
func BenchmarkLoadBuiltins(b *testing.B) {
	b.Run("warm", func(b *testing.B) {
		cfg := builtinConfig(b, b.TempDir())
		loadBuiltins(b, cfg, true) // fill the cache
		for b.Loop() {
			loadBuiltins(b, cfg, false)
		}
	})
	b.Run("warm_ready", func(b *testing.B) {
		cfg := builtinConfig(b, b.TempDir())
		loadBuiltins(b, cfg, true)
		for b.Loop() {
			loadBuiltins(b, cfg, true)
		}
	})
	b.Run("cold", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			cfg := builtinConfig(b, b.TempDir())
			b.StartTimer()
			loadBuiltins(b, cfg, true)
		}
	})
}
