package host

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/toolhost/toolhost/internal/memsandbox"
	"github.com/toolhost/toolhost/internal/testplugins"
)

// BenchmarkOverheadProbeEcho is the host's whole round trip for a plugin that does no
// work: validate the input, take an instance, call, parse and post-process the result.
func BenchmarkOverheadProbeEcho(b *testing.B) {
	h := newProbeHost(b, nil)
	s := h.OpenSession(memsandbox.New())
	in := json.RawMessage(`{"text":"hello"}`)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Dispatch(ctx, "echo", in); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkOverheadProbeRead4K adds one host function call returning 4 KiB.
func BenchmarkOverheadProbeRead4K(b *testing.B) {
	h := newProbeHost(b, nil)
	sb := memsandbox.New()
	sb.Put("f.txt", strings.Repeat("abcdefghijklmno\n", 256))
	s := h.OpenSession(sb)
	in := json.RawMessage(`{"path":"f.txt"}`)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Dispatch(ctx, "read", in); err != nil {
			b.Fatal(err)
		}
	}
}

var _ = testplugins.Root
