//go:build linux

package host_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolhost/toolhost/internal/memsandbox"
)

// BenchmarkTracingOverhead is BenchmarkHostOverhead's calls with tracing off (no span
// above the call: what every call sees when no provider is set) and on (each call under
// a recording span of an SDK provider that batches its spans to an exporter that drops
// them: the plugin's run, its host calls and commands are spans too), in one run: each
// iteration makes one call each way, the order turning. It reports the median time off
// (µs-off) and how much more the median on is (%more-on).
//
//	go test -run '^$' -bench TracingOverhead -benchtime 1000x -count 6 ./internal/host
func BenchmarkTracingOverhead(b *testing.B) {
	h := newHost(b)
	sb := memsandbox.New()
	sb.Put("f.txt", fourK)
	sb.Put("src/a.go", "package a\n")
	s := h.OpenSession(sb)
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	b.Cleanup(func() { tp.Shutdown(context.Background()) })
	tracer := tp.Tracer("bench")
	for _, c := range []struct{ name, tool, input string }{
		{"read_file_4K", "read_file", `{"path":"f.txt"}`},
		{"write_file_small", "write_file", `{"path":"out.txt","content":"hello\n"}`},
		{"bash_echo", "bash", `{"command":"echo hi"}`},
		{"glob", "glob", `{"pattern":"**/*.go"}`},
	} {
		b.Run("tool="+c.name, func(b *testing.B) {
			in := json.RawMessage(c.input)
			var times [2][]time.Duration // off, on
			i := 0
			for b.Loop() {
				for k := range 2 {
					on := (i+k)%2 == 1
					start := time.Now()
					ctx, span := context.Background(), trace.Span(nil)
					if on {
						ctx, span = tracer.Start(ctx, "execute_tool")
					}
					res, err := s.Dispatch(ctx, c.tool, in)
					if span != nil {
						span.End()
					}
					if on {
						times[1] = append(times[1], time.Since(start))
					} else {
						times[0] = append(times[0], time.Since(start))
					}
					if err != nil || res.IsError {
						b.Fatal(res, err)
					}
				}
				i++
			}
			off := median(times[0])
			b.ReportMetric(float64(off.Nanoseconds())/1e3, "µs-off")
			b.ReportMetric(100*(float64(median(times[1]))/float64(off)-1), "%more-on")
		})
	}
}
