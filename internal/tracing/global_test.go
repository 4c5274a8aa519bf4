package tracing

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
)

// otelGlobal is the global provider, as the packages that start traces use it.
func otelGlobal() trace.TracerProvider { return otel.GetTracerProvider() }
