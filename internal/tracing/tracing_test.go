package tracing

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// TestChildOff: under a span that does not record (tracing off), Child starts nothing,
// allocates nothing and hands back the context it got.
func TestChildOff(t *testing.T) {
	ctx, parent := noop.NewTracerProvider().Tracer("x").Start(context.Background(), "parent")
	for _, c := range []context.Context{context.Background(), ctx} {
		got, span := Child(c, trace.SpanKindInternal, SpanHostCall, "sandbox_exec.run")
		if got != c || span.IsRecording() {
			t.Errorf("Child under a span that does not record: a new context %v, or a recording span", got != c)
		}
		if n := testing.AllocsPerRun(100, func() {
			_, s := Child(c, trace.SpanKindInternal, SpanHostCall, "sandbox_exec.run")
			s.End()
		}); n != 0 {
			t.Errorf("Child under a span that does not record allocates %v times", n)
		}
	}
	parent.End()
}

// TestChildOn: under a recording span, Child starts a child of it with the parent's
// provider, named with its subject.
func TestChildOn(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	ctx, parent := tp.Tracer("x").Start(context.Background(), "parent")
	_, child := Child(ctx, trace.SpanKindClient, SpanForward, "")
	child.End()
	_, child = Child(ctx, trace.SpanKindInternal, SpanPlugin, "bash")
	child.End()
	parent.End()
	ended := rec.Ended()
	if len(ended) != 3 || ended[0].Name() != "fleet.forward" || ended[0].SpanKind() != trace.SpanKindClient ||
		ended[1].Name() != "plugin bash" || ended[0].Parent().SpanID() != parent.SpanContext().SpanID() ||
		ended[1].Parent().SpanID() != parent.SpanContext().SpanID() || ended[0].InstrumentationScope().Name != Scope {
		t.Fatalf("spans ended: %v", ended)
	}
}

// TestTracerFollowsProvider: a Tracer starts its spans with the provider its function
// gives now, not the one it gave first.
func TestTracerFollowsProvider(t *testing.T) {
	rec1, rec2 := tracetest.NewSpanRecorder(), tracetest.NewSpanRecorder()
	tp1 := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec1))
	tp2 := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec2))
	var cur trace.TracerProvider = tp1
	tr := NewTracer(func() trace.TracerProvider { return cur })
	_, s := tr.Start(context.Background(), "one", trace.SpanKindServer)
	s.End()
	cur = tp2
	_, s = tr.Start(context.Background(), "two", trace.SpanKindServer)
	s.End()
	if len(rec1.Ended()) != 1 || rec1.Ended()[0].Name() != "one" || len(rec2.Ended()) != 1 || rec2.Ended()[0].Name() != "two" {
		t.Fatalf("first provider got %v, second %v", rec1.Ended(), rec2.Ended())
	}
}

// BenchmarkOff is what a span costs where tracing is off: a root span of the global
// provider with none set (the tool call's, the MCP request's), and a Child check under
// it (a plugin's run, each host call, each command).
//
//	go test -run '^$' -bench Off -count 10 ./internal/tracing
func BenchmarkOff(b *testing.B) {
	tr := NewTracer(func() trace.TracerProvider { return otelGlobal() })
	b.Run("root", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, s := tr.Start(context.Background(), SpanTool, trace.SpanKindInternal)
			if s.IsRecording() {
				b.Fatal("recording")
			}
			s.End()
		}
	})
	ctx, root := tr.Start(context.Background(), SpanTool, trace.SpanKindInternal)
	defer root.End()
	b.Run("child", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, s := Child(ctx, trace.SpanKindInternal, SpanHostCall, "sandbox_exec.run")
			s.End()
		}
	})
}
