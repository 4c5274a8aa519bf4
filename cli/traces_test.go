package cli

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/toolhost/toolhost/internal/otlptest"
)

// TestMCPStdioTraces: toolhost mcp with OTEL_EXPORTER_OTLP_ENDPOINT set exports, before
// it exits, the trace of a tools/call over stdio to the collector at that endpoint
// (OTLP/HTTP, gzip as OTEL_EXPORTER_OTLP_COMPRESSION says), under the service
// OTEL_SERVICE_NAME names: the MCP request a server span continuing the trace context the
// client sent in the call's _meta, then the tool call, the plugin's run, its host call and
// the command, each the parent of the next.
func TestMCPStdioTraces(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	trackSources()
	col := otlptest.Start(t)
	cmd := exec.Command(toolBin, "mcp", "--project", "traced", "--store-dir", t.TempDir())
	cmd.Env = cliEnv(t, "OTEL_EXPORTER_OTLP_ENDPOINT="+col.URL, "OTEL_SERVICE_NAME=toolhost-stdio-test",
		"OTEL_EXPORTER_OTLP_COMPRESSION=gzip")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	ctx := context.Background()
	cs, err := c.Connect(ctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: time.Minute}, nil)
	if err != nil {
		t.Fatal(err)
	}
	const (
		clientTrace = "0af7651916cd43dd8448eb211c80319c"
		clientSpan  = "b7ad6b7169203331"
	)
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"command": "echo traced"},
		Meta: mcp.Meta{"traceparent": "00-" + clientTrace + "-" + clientSpan + "-01"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError || !strings.Contains(mcpText(res), "traced") {
		t.Fatalf("bash over stdio: %q", mcpText(res))
	}
	if err := cs.Close(); err != nil { // the process exits: its spans are sent first
		t.Fatalf("closing: %v\n%s", err, stderr.String())
	}
	if bad := col.Refused(); len(bad) > 0 {
		t.Errorf("the collector refused requests: %q", bad)
	}
	spans := col.Spans()
	var chain []otlptest.Span
	for _, s := range otlptest.Named(spans, "sandbox.exec") {
		if s.TraceID == clientTrace {
			chain = otlptest.TreeOf(spans).Ancestry(s)
		}
	}
	want := []string{"sandbox.exec", "host sandbox_exec.run", "plugin bash", "execute_tool bash", "tools/call bash"}
	var names []string
	for _, s := range chain {
		names = append(names, s.Name)
	}
	if strings.Join(names, " < ") != strings.Join(want, " < ") {
		t.Fatalf("the command's span and its ancestors in trace %s: %q, want %q; all spans:\n%v\nstderr:\n%s",
			clientTrace, names, want, spans, stderr.String())
	}
	for _, s := range chain {
		if s.Service != "toolhost-stdio-test" {
			t.Errorf("span %q: service %q, want toolhost-stdio-test", s.Name, s.Service)
		}
	}
	if mcpSpan := chain[len(chain)-1]; mcpSpan.Kind != tracepb.Span_SPAN_KIND_SERVER || mcpSpan.ParentID != clientSpan {
		t.Errorf("the MCP request's span: %v; want a server span whose parent is the client's span %s", mcpSpan, clientSpan)
	}
}

// TestTracesCall: toolhost call exports the tool call's spans before it exits; and an
// OTEL_* setting toolhost cannot follow is a usage error, on one line, before anything
// runs.
func TestTracesCall(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	col := otlptest.Start(t)
	r := runCLI(t, []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=" + col.URL + "/v1/traces"}, "call", "bash", `{"command":"true"}`)
	if r.code != 0 {
		t.Fatalf("toolhost call with traces on:\n%s", r)
	}
	var roots []string
	spans := col.Spans()
	tree := otlptest.TreeOf(spans)
	for _, s := range otlptest.Named(spans, "sandbox.exec") {
		a := tree.Ancestry(s)
		roots = append(roots, a[len(a)-1].Name)
	}
	if len(roots) != 1 || roots[0] != "execute_tool bash" {
		t.Errorf("the command's spans lead up to %q, want one to execute_tool bash; all spans: %v", roots, spans)
	}

	sent := col.Requests()
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"OTEL_TRACES_EXPORTER=zipkin"}, "OTEL_TRACES_EXPORTER=zipkin: toolhost exports traces over OTLP only"},
		{[]string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + col.URL, "OTEL_EXPORTER_OTLP_PROTOCOL=grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL=grpc: toolhost sends OTLP over HTTP"},
		{[]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=localhost:4318"}, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is not an http:// or https:// URL"},
	} {
		oneLineError(t, runCLI(t, tc.env, "call", "bash", `{"command":"true"}`), exitUsage, tc.want)
	}
	if n := col.Requests(); n != sent {
		t.Errorf("the collector got %d requests from the refused configurations", n-sent)
	}
}
