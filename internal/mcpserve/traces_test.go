package mcpserve

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/toolhost/toolhost/internal/otlptest"
	"github.com/toolhost/toolhost/internal/telemetry"
)

// steer is a client transport whose requests go to the replica at to (a balancer that
// moved the client), carrying traceparent when set.
type steer struct {
	to          atomic.Pointer[url.URL]
	traceparent atomic.Pointer[string]
	base        http.RoundTripper
}

func (s *steer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	u := s.to.Load()
	r.URL.Scheme, r.URL.Host, r.Host = u.Scheme, u.Host, u.Host
	if tp := s.traceparent.Load(); tp != nil {
		r.Header.Set("traceparent", *tp)
	}
	return s.base.RoundTrip(r)
}

func (s *steer) steer(to string) {
	u, err := url.Parse(to)
	if err != nil {
		panic(err)
	}
	s.to.Store(u)
}

// forwardedCall opens a session of project shop on rs[0] (which then holds the project),
// moves the client to rs[1] and makes one bash call there, which rs[1] forwards to rs[0];
// the call carries traceparent when it is not empty. It returns the call's answer.
func forwardedCall(t *testing.T, rs []*replica, tok, command, traceparent string) string {
	t.Helper()
	ctx := context.Background()
	st := &steer{base: bearer{token: tok, project: "shop", base: clientTransport}}
	st.steer(rs[0].url)
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: rs[0].url + "/mcp", MaxRetries: -1,
		HTTPClient: &http.Client{Transport: st}}, &mcp.ClientSessionOptions{ProtocolVersion: statefulRevision})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if res := call(t, cs, "write_file", map[string]any{"path": "secret.txt", "content": "file-content-marker\n"}); res.IsError {
		t.Fatalf("write_file: %s", text(res))
	}
	if rs[0].s.OpenSessions() != 1 {
		t.Fatalf("replica 0 has %d sessions open, want the one it was asked to open", rs[0].s.OpenSessions())
	}
	st.steer(rs[1].url)
	if traceparent != "" {
		st.traceparent.Store(&traceparent)
	}
	before := rs[0].s.metrics.fleetServed.Load()
	res := call(t, cs, "bash", map[string]any{"command": command})
	st.traceparent.Store(nil)
	if res.IsError {
		t.Fatalf("bash: %s", text(res))
	}
	// (Counted as it arrives: the forwarding replica counts a forward once its stream ends.)
	if rs[0].s.metrics.fleetServed.Load() == before || rs[1].s.OpenSessions() != 0 {
		t.Fatalf("the call was not forwarded: replica 0 served %d forwarded requests, replica 1 has %d sessions open",
			rs[0].s.metrics.fleetServed.Load()-before, rs[1].s.OpenSessions())
	}
	return text(res)
}

// TestFleetTraces: with OTEL_EXPORTER_OTLP_TRACES_ENDPOINT set, a tool call a replica
// forwards to the one holding its project is one trace, exported over OTLP/HTTP to a
// collector: the client's trace context continued by the client-facing replica's server
// span, the forward, the holder's server span, the MCP request, the tool call, the plugin's
// run, its host call and the sandbox command, each the parent of the next. No span holds
// the command or a file's content.
func TestFleetTraces(t *testing.T) {
	col := otlptest.Start(t)
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", col.URL+"/v1/traces")
	t.Setenv("OTEL_SERVICE_NAME", "toolhost-fleet-test")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50") // ms: spans reach the collector while the test waits
	ctx := context.Background()
	tr, err := telemetry.Start(ctx, telemetry.Service{Version: "test"}, quietLog())
	if err != nil || tr == nil {
		t.Fatalf("telemetry.Start: %v, %v: want traces on", tr, err)
	}
	defer tr.Shutdown(ctx)
	if _, ok := otel.GetTracerProvider().(*sdktrace.TracerProvider); !ok {
		t.Fatalf("the global tracer provider is a %T, want the SDK's", otel.GetTracerProvider())
	}

	tok := "fleet-token-0123456789abcdef"
	rs := newFleet(t, 2, []Token{{Name: "alice", Value: tok}})
	const (
		clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
		clientSpan  = "00f067aa0ba902b7"
	)
	out := forwardedCall(t, rs, tok, "echo command-marker-$((6*7)) && cat secret.txt", "00-"+clientTrace+"-"+clientSpan+"-01")
	if !strings.Contains(out, "command-marker-42") || !strings.Contains(out, "file-content-marker") {
		t.Fatalf("bash answered %q", out)
	}

	// A client's session id that is not UTF-8 stays off its span: the batch that span is in
	// is exported all the same (the exporter refuses a batch with an invalid string).
	const hostileTrace = "5bf92f3577b34da6a3ce929d0e0e4736"
	req, err := http.NewRequest(http.MethodPost, rs[1].url+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", "\xff\xfe-not-utf8")
	req.Header.Set("traceparent", "00-"+hostileTrace+"-"+clientSpan+"-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	// The chain, from the sandbox command up, as each span names its parent.
	want := []struct {
		name     string
		kind     tracepb.Span_SpanKind
		instance string // toolhost.fleet.instance, where the span has it
	}{
		{"sandbox.exec", tracepb.Span_SPAN_KIND_INTERNAL, ""},
		{"host sandbox_exec.run", tracepb.Span_SPAN_KIND_INTERNAL, ""},
		{"plugin bash", tracepb.Span_SPAN_KIND_INTERNAL, ""},
		{"execute_tool bash", tracepb.Span_SPAN_KIND_INTERNAL, ""},
		{"tools/call bash", tracepb.Span_SPAN_KIND_INTERNAL, ""},
		{"POST /mcp", tracepb.Span_SPAN_KIND_SERVER, rs[0].f.Instance()}, // the holder
		{"fleet.forward", tracepb.Span_SPAN_KIND_CLIENT, rs[1].f.Instance()},
		{"POST /mcp", tracepb.Span_SPAN_KIND_SERVER, rs[1].f.Instance()}, // the client's
	}
	var chain, hostile []otlptest.Span
	deadline := time.Now().Add(time.Minute)
	for {
		spans := col.Spans()
		tree := otlptest.TreeOf(spans)
		for _, s := range otlptest.Named(spans, "sandbox.exec") {
			if s.TraceID == clientTrace {
				chain = tree.Ancestry(s)
			}
		}
		hostile = nil
		for _, s := range spans {
			if s.TraceID == hostileTrace {
				hostile = append(hostile, s)
			}
		}
		if (len(chain) >= len(want) && len(hostile) > 0) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if bad := col.Refused(); len(bad) > 0 {
		t.Errorf("the collector refused requests: %q", bad)
	}
	if len(chain) != len(want) {
		t.Fatalf("the command's span and its ancestors in trace %s: %d spans, want %d:\n%s\nall spans:\n%s",
			clientTrace, len(chain), len(want), spanList(chain), spanList(col.Spans()))
	}
	for i, w := range want {
		s := chain[i]
		if s.Name != w.name || s.Kind != w.kind || (w.instance != "" && s.Attrs["toolhost.fleet.instance"] != w.instance) {
			t.Errorf("span %d up from the command: %v; want %q, %s, instance %q", i, s, w.name, w.kind, w.instance)
		}
		if s.TraceID != clientTrace || s.Service != "toolhost-fleet-test" || s.Scope != "github.com/toolhost/toolhost" {
			t.Errorf("span %q: trace %s, service %q, scope %q; want trace %s, service toolhost-fleet-test, our scope",
				s.Name, s.TraceID, s.Service, s.Scope, clientTrace)
		}
	}
	if len(hostile) == 0 {
		t.Errorf("the span of the request with a session id that is not UTF-8 never reached the collector")
	}
	for _, s := range hostile {
		if _, ok := s.Attrs["mcp.session.id"]; ok {
			t.Errorf("span %v carries the client's session id that is not UTF-8", s)
		}
	}
	root := chain[len(chain)-1]
	if root.ParentID != clientSpan || root.Attrs["toolhost.fleet.forwarded"] != "false" {
		t.Errorf("the client-facing server span: parent %s, forwarded %s; want the client's span %s, not forwarded",
			root.ParentID, root.Attrs["toolhost.fleet.forwarded"], clientSpan)
	}
	if holder := chain[5]; holder.Attrs["toolhost.fleet.forwarded"] != "true" || holder.Attrs["http.response.status_code"] != "200" {
		t.Errorf("the holder's server span: %v; want forwarded, 200", holder)
	}
	host := chain[1]
	if host.Attrs["toolhost.capability"] != "sandbox_exec" || host.Attrs["toolhost.operation"] != "run" || host.Attrs["toolhost.decision"] != "allow" {
		t.Errorf("the host call's span: %v; want capability sandbox_exec, operation run, decision allow", host)
	}
	if cmd := chain[0]; cmd.Attrs["process.exit.code"] != "0" || cmd.Attrs["toolhost.sandbox.id"] == "" {
		t.Errorf("the command's span: %v; want exit code 0 and the sandbox", cmd)
	}
	if tool := chain[3]; tool.Attrs["gen_ai.tool.name"] != "bash" || tool.Attrs["toolhost.project"] != "shop" || tool.Attrs["toolhost.result.is_error"] != "false" {
		t.Errorf("the tool call's span: %v", tool)
	}
	for _, s := range col.Spans() {
		for k, v := range s.Attrs {
			if strings.Contains(v, "marker") || strings.Contains(v, tok) {
				t.Errorf("span %q: attribute %s = %q holds the command, a file's content or the token", s.Name, k, v)
			}
		}
		if strings.Contains(s.Name+s.StatusMessage, "marker") {
			t.Errorf("span %q (status %q) holds the command or a file's content", s.Name, s.StatusMessage)
		}
	}
}

// TestTracesOff: with no OTEL_* variable set, telemetry sets nothing up (no exporter, no
// SDK provider) and a forwarded tool call sends nothing to where an exporter made without
// configuration would (localhost:4318), nor invents a trace context.
func TestTracesOff(t *testing.T) {
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "OTEL_") {
			t.Setenv(k, "") // restored after the test
			os.Unsetenv(k)
		}
	}
	ctx := context.Background()
	tr, err := telemetry.Start(ctx, telemetry.Service{}, quietLog())
	if err != nil || tr != nil {
		t.Fatalf("telemetry.Start with no OTEL_* variables: %v, %v; want nothing set up", tr, err)
	}
	if _, ok := otel.GetTracerProvider().(*sdktrace.TracerProvider); ok {
		t.Fatal("the global tracer provider is the SDK's with no OTEL_* variables")
	}
	var col *otlptest.Collector
	if ln, err := net.Listen("tcp", "127.0.0.1:4318"); err == nil {
		col = otlptest.Serve(t, ln)
	} else {
		t.Logf("the OTLP default port is taken (%v): not watching it", err)
	}
	var sawTraceparent atomic.Bool
	tok := "fleet-token-0123456789abcdef"
	rs := newFleetWrapped(t, 2, []Token{{Name: "alice", Value: tok}}, func(i int, h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("traceparent") != "" {
				sawTraceparent.Store(true)
			}
			h.ServeHTTP(w, r)
		})
	})
	forwardedCall(t, rs, tok, "echo untraced", "")
	if sawTraceparent.Load() {
		t.Error("a request reached the holder with a traceparent, with tracing off and none from the client")
	}
	if col != nil && col.Requests() != 0 {
		t.Errorf("the default OTLP endpoint got %d requests with tracing off", col.Requests())
	}
}

func spanList(spans []otlptest.Span) string {
	var b strings.Builder
	for _, s := range spans {
		b.WriteString("  " + s.String() + "\n")
	}
	return b.String()
}
