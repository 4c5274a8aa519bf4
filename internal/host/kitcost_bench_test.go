package host

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/memsandbox"
	"github.com/toolhost/toolhost/internal/testplugins"
)

// BenchmarkKitCosts: what each piece of a call costs a plugin built with the kit, against
// an in-memory sandbox. Each tool of host/testdata/kitcost adds one thing to a call that
// does nothing; subtract noop. Run with -count and compare medians (benchstat): the pieces
// are a few microseconds each.
func BenchmarkKitCosts(b *testing.B) {
	p, err := testplugins.Build("internal/host/testdata/kitcost")
	if err != nil {
		b.Fatal(err)
	}
	h, err := New(context.Background(), Config{DataDir: dataDir,
		Plugins: []PluginSpec{{Path: p, Grants: []abi.Capability{abi.CapSandboxFiles}}}})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close(context.Background())
	sb := memsandbox.New()
	sb.Put("small.txt", "hello\n")
	sb.Put("f.txt", strings.Repeat(strings.Repeat("x", 63)+"\n", 64))
	s := h.OpenSession(sb)
	ctx := context.Background()
	for _, tool := range []string{"noop", "yield", "alloc_small_x10", "alloc_4k", "copy_4k", "result_4k",
		"stat", "read_small", "read_text_small", "read_text_4k"} {
		b.Run(tool, func(b *testing.B) {
			for b.Loop() {
				res, err := s.Dispatch(ctx, tool, json.RawMessage(`{}`))
				if err != nil || res.IsError {
					b.Fatal(res, err)
				}
			}
		})
	}
}
