package telemetry

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/toolhost/toolhost/internal/otlptest"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestWanted(t *testing.T) {
	for _, c := range []struct {
		env     map[string]string
		want    bool
		refused bool
	}{
		{map[string]string{}, false, false},
		{map[string]string{"OTEL_SERVICE_NAME": "x", "OTEL_EXPORTER_OTLP_HEADERS": "k=v", "OTEL_TRACES_SAMPLER": "always_on"}, false, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, true, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://collector/v1/traces"}, true, false},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, false, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, false, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, true, false},
		{map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, false, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, false, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "localhost:4318"}, false, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "ftp://c/v1/traces"}, false, true},
	} {
		got, err := Wanted(env(c.env))
		if got != c.want || errors.Is(err, ErrConfig) != c.refused {
			t.Errorf("Wanted(%v) = %v, %v; want %v, refused %v", c.env, got, err, c.want, c.refused)
		}
	}
}

// TestStartAndShutdown: with an endpoint, Start sets an SDK provider up whose spans reach
// the collector, under service.name toolhost and the version given, when Shutdown flushes
// them; the provider before is the global one again after.
func TestStartAndShutdown(t *testing.T) {
	col := otlptest.Start(t)
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	before := otel.GetTracerProvider()
	for _, k := range []string{"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"} {
		t.Setenv(k, "")
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", col.URL)
	tr, err := Start(ctx, Service{Version: "v9.9.9"}, log)
	if err != nil || tr == nil {
		t.Fatalf("Start: %v, %v", tr, err)
	}
	if _, ok := otel.GetTracerProvider().(*sdktrace.TracerProvider); !ok {
		t.Fatalf("the global provider is a %T after Start", otel.GetTracerProvider())
	}
	_, span := otel.Tracer("test").Start(ctx, "a span")
	span.End()
	if err := tr.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	spans := col.Spans()
	if len(spans) != 1 || spans[0].Name != "a span" || spans[0].Service != "toolhost" || spans[0].Resource["service.version"] != "v9.9.9" {
		t.Fatalf("the collector got %v, want the one span of service toolhost v9.9.9", spans)
	}
	if otel.GetTracerProvider() != before {
		t.Errorf("the global provider after Shutdown is %T, not the one before", otel.GetTracerProvider())
	}
	var none *Traces
	if err := none.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown of no traces: %v", err)
	}
}
