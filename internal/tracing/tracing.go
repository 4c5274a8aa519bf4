// Package tracing is what toolhost's OpenTelemetry spans share: their names and
// attributes, a tracer that follows a provider as it changes, and the start of a span
// under another. It links only the trace API (go.opentelemetry.io/otel/trace), never an
// SDK or the global provider: the packages that start traces (the root package, mcpserve)
// hand it otel.GetTracerProvider, and package telemetry (the CLI's) sets that provider up
// from the OTEL_* environment. Off (no provider set), a span is the API's no-op one.
//
// The spans of one tool call, outermost first (docs/MCP.md, "Traces"):
//
//	POST /mcp               the HTTP request (toolhost serve), a server span
//	fleet.forward           the request relayed to the replica holding its project (a client span)
//	tools/call bash         the MCP request (a server span on stdio, under the HTTP span over HTTP)
//	execute_tool bash       Session.Dispatch: the tool call
//	plugin bash             the plugin's run
//	host sandbox_exec.run   one host call: its capability, operation and the policy's decision
//	sandbox.exec            a command run in the sandbox
//
// No attribute holds a secret, a file's content, a command line or a path: a trace shows
// what ran where and how it ended, the audit (package audit) what it touched.
package tracing

import (
	"context"
	"reflect"
	"strings"
	"sync/atomic"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Scope is the instrumentation scope of every toolhost span.
const Scope = "github.com/toolhost/toolhost"

// Span names (those with a subject get it after a space: "plugin bash").
const (
	SpanForward  = "fleet.forward"
	SpanTool     = "execute_tool"
	SpanPlugin   = "plugin"
	SpanHostCall = "host"
	SpanExec     = "sandbox.exec"
)

// Attribute keys: the semantic conventions' where they have one, toolhost.* otherwise.
const (
	HTTPMethod     = attribute.Key("http.request.method")
	HTTPRoute      = attribute.Key("http.route")
	HTTPStatus     = attribute.Key("http.response.status_code")
	MCPMethod      = attribute.Key("mcp.method.name")
	MCPSession     = attribute.Key("mcp.session.id")
	ToolName       = attribute.Key("gen_ai.tool.name")
	Operation      = attribute.Key("gen_ai.operation.name")
	ErrorType      = attribute.Key("error.type")
	ExitCode       = attribute.Key("process.exit.code")
	Project        = attribute.Key("toolhost.project")
	Instance       = attribute.Key("toolhost.fleet.instance")
	Forwarded      = attribute.Key("toolhost.fleet.forwarded")
	Target         = attribute.Key("toolhost.fleet.target")
	Plugin         = attribute.Key("toolhost.plugin")
	Capability     = attribute.Key("toolhost.capability")
	HostOp         = attribute.Key("toolhost.operation")
	Decision       = attribute.Key("toolhost.decision")
	Status         = attribute.Key("toolhost.status")
	Sandbox        = attribute.Key("toolhost.sandbox.id")
	Background     = attribute.Key("toolhost.exec.background")
	TimedOut       = attribute.Key("toolhost.exec.timed_out")
	OOMKilled      = attribute.Key("toolhost.exec.oom_killed")
	ResultIsError  = attribute.Key("toolhost.result.is_error")
	ExecuteToolOp  = "execute_tool"
	ErrToolResult  = "tool_error"   // error.type of a call whose result is an is_error one
	ErrHostFailure = "host_failure" // error.type of a call the host could not run
)

// Tracer is the tracer of the provider a function gives (otel.GetTracerProvider), kept
// while the function gives the same provider and taken anew when it changes (a global
// tracer kept from before a provider was set would follow only the first one set).
type Tracer struct {
	provider func() trace.TracerProvider
	cur      tracerCache
}

// tracerCache keeps the tracer of the last provider asked.
type tracerCache struct{ atomic.Pointer[held] }

type held struct {
	tp trace.TracerProvider
	t  trace.Tracer
}

// NewTracer is the Tracer of the providers provider gives.
func NewTracer(provider func() trace.TracerProvider) *Tracer {
	return &Tracer{provider: provider}
}

// Start starts a span of kind named name under ctx's span (a root span when it has none).
func (t *Tracer) Start(ctx context.Context, name string, kind trace.SpanKind) (context.Context, trace.Span) {
	return t.cur.get(t.provider()).Start(ctx, name, kindOption(kind)...)
}

// kindOptions are the start options of each span kind, made once: an option made at each
// start would be allocated at each start, tracing off or not.
var kindOptions = func() (o [trace.SpanKindConsumer + 1][]trace.SpanStartOption) {
	for k := range o {
		o[k] = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKind(k))}
	}
	return o
}()

func kindOption(kind trace.SpanKind) []trace.SpanStartOption {
	if kind >= 0 && int(kind) < len(kindOptions) {
		return kindOptions[kind]
	}
	return nil // unspecified: internal
}

// children is the tracer Child starts spans with, of the parent span's provider.
var children tracerCache

// Child starts a span under ctx's span when that span records, with a tracer of the
// provider that made it, named name, or "name subject" when subject is not empty. When
// ctx's span does not record (tracing is off, or the trace was not sampled) it returns ctx
// and that span unchanged, having done nothing, not even the name: the spans below a tool
// call cost nothing when the tool call's span is not recorded. Ending the returned span is
// always right (a span that does not record ignores End).
func Child(ctx context.Context, kind trace.SpanKind, name, subject string) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, parent
	}
	if subject != "" {
		name += " " + subject
	}
	return children.get(parent.TracerProvider()).Start(ctx, name, kindOption(kind)...)
}

// maxText bounds a value Text gives a span.
const maxText = 128

// Text is s fit for a span, for a value that comes from outside (a client, a provider, a
// record in the store): valid UTF-8 (one invalid string makes the exporter refuse the
// whole batch it is in) and at most 128 bytes.
func Text(s string) string {
	if len(s) > maxText {
		s = s[:maxText]
	}
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// Recording reports whether ctx's span records (Child would start a span).
func Recording(ctx context.Context) bool { return trace.SpanFromContext(ctx).IsRecording() }

// get is the tracer of tp, kept in p when tp can be compared.
func (c *tracerCache) get(tp trace.TracerProvider) trace.Tracer {
	if h := c.Load(); h != nil && h.tp == tp {
		return h.t
	}
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	t := tp.Tracer(Scope)
	if reflect.TypeOf(tp).Comparable() { // a provider of a type that cannot be compared is asked each time
		c.Store(&held{tp: tp, t: t})
	}
	return t
}
