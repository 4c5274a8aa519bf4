package mcpserve

import (
	"context"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolhost/toolhost/internal/fleet"
	"github.com/toolhost/toolhost/internal/tracing"
)

// Traces (docs/MCP.md, "Traces"): each HTTP request to /mcp is a server span, continuing
// the W3C trace context (traceparent) it came with; each MCP request is a span under it
// (on stdio, a server span of its own, continuing a traceparent in a tools/call's _meta).
// A request forwarded to the replica holding its project carries the trace on (package
// fleet), so the spans of one call form one tree across the fleet. The spans go to the
// global provider (otel.GetTracerProvider); none is set unless the CLI's telemetry is on.

var tracer = tracing.NewTracer(otel.GetTracerProvider)

var traceContext = propagation.TraceContext{}

// maxTraceValue bounds a client-given value (a session id) put on a span.
const maxTraceValue = 128

// traceHTTP makes each request to /mcp a server span.
func (s *Server) traceHTTP(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := traceContext.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := tracer.Start(ctx, httpSpanName(r.Method), trace.SpanKindServer)
		defer span.End()
		if !span.IsRecording() {
			if span.SpanContext().IsValid() {
				r = r.WithContext(ctx) // the trace it came with goes on with a forwarded request
			}
			h.ServeHTTP(w, r)
			return
		}
		span.SetAttributes(tracing.HTTPMethod.String(r.Method), tracing.HTTPRoute.String("/mcp"),
			tracing.Forwarded.Bool(fleet.Signed(r)))
		if f := s.opts.Fleet; f != nil {
			span.SetAttributes(tracing.Instance.String(f.Instance()))
		}
		if id := r.Header.Get("Mcp-Session-Id"); visibleASCII(id) {
			span.SetAttributes(tracing.MCPSession.String(id))
		}
		// The SDK gives the MCP handlers a request's headers, not its context: this span
		// reaches them as the request's traceparent (traceMCP).
		traceContext.Inject(ctx, propagation.HeaderCarrier(r.Header))
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r.WithContext(ctx))
		status := sw.status
		if status == 0 {
			status = http.StatusOK
		}
		span.SetAttributes(tracing.HTTPStatus.Int(status))
		if status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(status))
		}
	})
}

// visibleASCII reports whether a client's session id is one a span may carry: 1 to 128
// visible ASCII characters, as MCP's session ids are.
func visibleASCII(s string) bool {
	if s == "" || len(s) > maxTraceValue {
		return false
	}
	for i := range len(s) {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// httpSpanName is the name of an HTTP request's span: its method and route.
func httpSpanName(method string) string {
	switch method {
	case http.MethodPost:
		return "POST /mcp"
	case http.MethodGet:
		return "GET /mcp"
	case http.MethodDelete:
		return "DELETE /mcp"
	}
	return "HTTP /mcp"
}

// traceMCP makes each MCP request of a session of project a span ("tools/call bash"); a
// request of the stateless revision finds its project in its headers.
func (s *Server) traceMCP(project string) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			kind, project := trace.SpanKindServer, project
			extra := req.GetExtra()
			call, _ := req.(*mcp.CallToolRequest)
			switch {
			case extra != nil && extra.Header != nil:
				// Over HTTP: under the request's span (traceHTTP).
				ctx = traceContext.Extract(ctx, propagation.HeaderCarrier(extra.Header))
				kind = trace.SpanKindInternal
				if project == "" {
					project = extra.Header.Get(ProjectHeader)
				}
			case call != nil && call.Params != nil && call.Params.Meta != nil:
				// On stdio: a client may send its trace context in the call's _meta.
				ctx = traceContext.Extract(ctx, metaCarrier(call.Params.Meta))
			}
			ctx, span := tracer.Start(ctx, method, kind)
			defer span.End()
			res, err := next(ctx, method, req)
			if !span.IsRecording() {
				return res, err
			}
			span.SetAttributes(tracing.MCPMethod.String(method))
			if project != "" {
				span.SetAttributes(tracing.Project.String(project))
			}
			if ss, ok := req.GetSession().(*mcp.ServerSession); ok && ss != nil && ss.ID() != "" {
				span.SetAttributes(tracing.MCPSession.String(ss.ID()))
			}
			if call != nil && call.Params != nil && s.hasTool(call.Params.Name) {
				span.SetName(method + " " + call.Params.Name)
				span.SetAttributes(tracing.ToolName.String(call.Params.Name))
			}
			switch r, _ := res.(*mcp.CallToolResult); {
			case err != nil:
				span.SetAttributes(tracing.ErrorType.String("mcp_error"))
				span.SetStatus(codes.Error, "the MCP request failed")
			case r != nil && r.IsError:
				span.SetAttributes(tracing.ErrorType.String(tracing.ErrToolResult))
			}
			return res, err
		}
	}
}

// metaCarrier reads a trace context from an MCP request's _meta.
type metaCarrier map[string]any

func (m metaCarrier) Get(key string) string {
	v, _ := m[key].(string)
	return v
}

func (m metaCarrier) Set(string, string) {}

func (m metaCarrier) Keys() []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}
