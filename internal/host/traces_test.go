package host

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolhost/toolhost/internal/memsandbox"
	"github.com/toolhost/toolhost/internal/policy"
	"github.com/toolhost/toolhost/internal/testenv"
)

// TestHostTraces: under a tool call's recording span, a plugin's run, each of its host
// calls (capability, operation, the policy's decision) and each command it runs are
// spans, each the parent of the next; a denied call's span says so; a plugin that fails
// (printing a secret it read) marks its span. No span shows a secret, a path or a file's
// content.
// Without a recording span above, nothing is recorded.
func TestHostTraces(t *testing.T) {
	const secret = "s3cr3t-T0KEN-value"
	h := probeHostWith(t, func(s *PluginSpec) {
		s.Secrets = map[string]string{"API_TOKEN": secret}
		s.Scope.Files = &policy.Files{Read: []string{"**", "!**/.env"}}
	}, nil)
	sb := memsandbox.New()
	sb.Put(".env", "file-content-marker")
	sb.Put("leak.txt", secret)
	s := h.OpenSession(sb)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
	defer cancel()
	run := func(ctx context.Context, tool, input string) {
		t.Helper()
		if _, err := s.Dispatch(ctx, tool, json.RawMessage(input)); err != nil && tool != "leak" {
			t.Fatalf("%s: %v", tool, err)
		}
	}
	run(ctx, "exec", `{"argv":["sh","-c","echo token=$API_TOKEN"]}`) // no span above: nothing
	if n := len(rec.Ended()); n != 0 {
		t.Fatalf("%d spans recorded without a recording span above the tool call", n)
	}
	for _, c := range []struct{ tool, input string }{
		{"exec", `{"argv":["sh","-c","echo token=$API_TOKEN"]}`},
		{"read", `{"path":".env"}`},
		{"leak", `{"path":"leak.txt","panic":true}`},
	} {
		tctx, span := tp.Tracer("test").Start(ctx, "execute_tool "+c.tool)
		run(tctx, c.tool, c.input)
		span.End()
	}
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, sp := range rec.Ended() {
		byID[sp.SpanContext().SpanID()] = sp
	}
	attrs := func(sp sdktrace.ReadOnlySpan) map[attribute.Key]string {
		m := map[attribute.Key]string{}
		for _, kv := range sp.Attributes() {
			m[kv.Key] = kv.Value.String()
		}
		return m
	}
	chain := func(sp sdktrace.ReadOnlySpan) string {
		var names []string
		for ok := true; ok; sp, ok = byID[sp.Parent().SpanID()] {
			names = append(names, sp.Name())
		}
		return strings.Join(names, " < ")
	}
	var sawExec, sawDeny, sawFailed bool
	for _, sp := range rec.Ended() {
		a := attrs(sp)
		switch sp.Name() {
		case "sandbox.exec":
			sawExec = true
			if got := chain(sp); got != "sandbox.exec < host sandbox_exec.run < plugin probe < execute_tool exec" {
				t.Errorf("the command's span and its ancestors: %s", got)
			}
			if a["process.exit.code"] != "0" {
				t.Errorf("the command's span: %v", a)
			}
		case "host sandbox_files.read":
			if a["toolhost.decision"] == "deny" {
				sawDeny = true
				if sp.Status().Code.String() != "Error" || a["toolhost.capability"] != "sandbox_files" || a["toolhost.operation"] != "read" ||
					a["toolhost.status"] == "" {
					t.Errorf("the denied read's span: %v, status %v", a, sp.Status())
				}
			}
		case "plugin probe":
			if sp.Status().Code.String() == "Error" {
				sawFailed = true
				if a["error.type"] != "plugin_failed" {
					t.Errorf("the failed run's span: %v, status %q; want error.type plugin_failed", a, sp.Status().Description)
				}
			}
		}
		for k, v := range a {
			if strings.Contains(v, secret) || strings.Contains(v, "marker") || strings.Contains(v, ".env") || strings.Contains(v, "API_TOKEN") {
				t.Errorf("span %q: %s = %q shows a secret, a path or a file's content", sp.Name(), k, v)
			}
		}
		if strings.Contains(sp.Status().Description+sp.Name(), secret) {
			t.Errorf("span %q (status %q) shows the secret", sp.Name(), sp.Status().Description)
		}
	}
	if !sawExec || !sawDeny || !sawFailed {
		t.Errorf("spans: a command's %v, a denied call's %v, a failed run's %v; want each", sawExec, sawDeny, sawFailed)
	}
}
