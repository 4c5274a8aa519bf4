// Package telemetry sets up the process's OpenTelemetry traces from the standard OTEL_*
// environment variables: spans exported over OTLP/HTTP (protobuf) to a collector, batched,
// flushed at exit. It is the CLI's (toolhost serve, mcp and call); the packages that make
// spans only use the global provider it sets (package tracing), so a program that embeds
// toolhost brings its own.
//
// Off unless the environment asks: with no OTEL_EXPORTER_OTLP_ENDPOINT,
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_TRACES_EXPORTER=otlp, nothing is set up (no
// exporter, no SDK, no connection) and every span is the API's no-op one.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// The variables that turn traces on and off (the exporter and the SDK read the others:
// OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _COMPRESSION, _CERTIFICATE, OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG, OTEL_BSP_*).
const (
	envDisabled       = "OTEL_SDK_DISABLED"
	envExporter       = "OTEL_TRACES_EXPORTER"
	envEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	envTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	envProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	envTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
)

// ErrConfig: the OTEL_* variables ask for something toolhost does not do.
var ErrConfig = errors.New("the OTEL_* environment")

// Service names the process in its traces' resource; OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES override it.
type Service struct {
	Name    string // service.name: "toolhost"
	Version string // service.version
}

// Traces is the trace pipeline Start set up.
type Traces struct {
	tp       *sdktrace.TracerProvider
	prev     trace.TracerProvider
	prevProp propagation.TextMapPropagator
}

// Wanted reports whether the environment (getenv) asks for traces, and refuses a setting
// toolhost cannot follow (another exporter, another protocol, an endpoint that is not an
// http or https URL).
func Wanted(getenv func(string) string) (bool, error) {
	if strings.EqualFold(strings.TrimSpace(getenv(envDisabled)), "true") {
		return false, nil
	}
	exporter := strings.ToLower(strings.TrimSpace(getenv(envExporter)))
	switch exporter {
	case "none":
		return false, nil
	case "", "otlp":
	default:
		return false, fmt.Errorf("%w: %s=%s: toolhost exports traces over OTLP only (otlp, or none)", ErrConfig, envExporter, exporter)
	}
	for _, k := range []string{envTracesProtocol, envProtocol} {
		if p := strings.TrimSpace(getenv(k)); p != "" && p != "http/protobuf" {
			return false, fmt.Errorf("%w: %s=%s: toolhost sends OTLP over HTTP with protobuf: use http/protobuf and the collector's HTTP port (4318)", ErrConfig, k, p)
		}
	}
	on := exporter == "otlp"
	for _, k := range []string{envTracesEndpoint, envEndpoint} {
		v := strings.TrimSpace(getenv(k))
		if v == "" {
			continue
		}
		u, err := url.Parse(v)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return false, fmt.Errorf("%w: %s is not an http:// or https:// URL of a collector (such as http://localhost:4318)", ErrConfig, k)
		}
		on = true
	}
	return on, nil
}

// Start sets the global tracer provider and propagator (W3C trace context and baggage)
// up as the process's environment says, when it asks for traces (see Wanted); otherwise
// it sets nothing up and returns nil. The SDK's own errors (a collector that does not
// answer) go to log. Shutdown ends it.
func Start(ctx context.Context, svc Service, log *slog.Logger) (*Traces, error) {
	getenv := os.Getenv // the exporter and the SDK read the rest of the variables there
	on, err := Wanted(getenv)
	if err != nil || !on {
		return nil, err
	}
	otel.SetLogger(logr.FromSlogHandler(log.Handler()))
	otel.SetErrorHandler(&errorLog{log: log})
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("setting up the OTLP trace exporter: %w", err)
	}
	name := svc.Name
	if name == "" {
		name = "toolhost"
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", name)}
	if svc.Version != "" {
		attrs = append(attrs, attribute.String("service.version", svc.Version))
	}
	// Later detectors win: the environment's service name and attributes over ours.
	res, err := resource.New(ctx, resource.WithAttributes(attrs...), resource.WithHost(), resource.WithProcessPID(),
		resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil {
		log.Warn("traces: describing the process", "err", err) // res is what could be found
	}
	t := &Traces{prev: otel.GetTracerProvider(), prevProp: otel.GetTextMapPropagator()}
	// The sampler: OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG (default
	// parentbased_always_on); the batching: OTEL_BSP_*.
	t.tp = sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(t.tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	endpoint := getenv(envTracesEndpoint)
	if endpoint == "" {
		endpoint = getenv(envEndpoint)
	}
	if u, err := url.Parse(endpoint); err == nil && endpoint != "" {
		endpoint = u.Scheme + "://" + u.Host // never a path's or query's secrets in the log
	}
	log.Debug("traces: exporting over OTLP/HTTP", "endpoint", endpoint, "service", name)
	return t, nil
}

// Shutdown exports the spans not sent yet and stops, waiting at most until ctx ends; the
// global provider is then the one there was before. A nil Traces has nothing to do.
func (t *Traces) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	err := t.tp.Shutdown(ctx)
	otel.SetTracerProvider(t.prev)
	otel.SetTextMapPropagator(t.prevProp)
	if err != nil {
		return fmt.Errorf("exporting the last traces: %w", err)
	}
	return nil
}

// errorLog logs the SDK's errors (an export that failed: the collector is down) at most
// once a minute, saying how many it left out: a collector that stays down for hours is
// one line a minute, not one a batch.
type errorLog struct {
	log     *slog.Logger
	mu      sync.Mutex
	last    time.Time
	skipped int
}

const errorLogEvery = time.Minute

func (e *errorLog) Handle(err error) {
	e.mu.Lock()
	now := time.Now()
	if !e.last.IsZero() && now.Sub(e.last) < errorLogEvery {
		e.skipped++
		e.mu.Unlock()
		return
	}
	skipped := e.skipped
	e.last, e.skipped = now, 0
	e.mu.Unlock()
	e.log.Warn("traces: the OpenTelemetry SDK reports an error", "err", err, "left_out", skipped)
}
