// Package otlptest is a collector of OpenTelemetry traces for tests: it receives OTLP over
// HTTP (protobuf ExportTraceServiceRequest, gzip or not) on loopback, as a real collector
// does, and keeps the spans it got.
package otlptest

import (
	"compress/gzip"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Span is a span as the collector got it.
type Span struct {
	TraceID, SpanID, ParentID string // hex; ParentID "" for a root
	Name                      string
	Kind                      tracepb.Span_SpanKind
	Attrs                     map[string]string // every value as text
	StatusError               bool
	StatusMessage             string
	Service                   string            // its resource's service.name
	Resource                  map[string]string // its resource's attributes
	Scope                     string
}

func (s Span) String() string {
	return fmt.Sprintf("%q (%s, trace %s, span %s, parent %s) %v", s.Name, s.Kind, s.TraceID, s.SpanID, s.ParentID, s.Attrs)
}

// Collector receives traces at URL + "/v1/traces".
type Collector struct {
	URL string

	mu       sync.Mutex
	spans    []Span
	requests int
	bad      []string
}

// Start starts a collector on a loopback port, stopped when t ends.
func Start(t testing.TB) *Collector {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return Serve(t, ln)
}

// Serve is Start on ln.
func Serve(t testing.TB, ln net.Listener) *Collector {
	c := &Collector{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(c.serve))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	c.URL = srv.URL
	return c
}

func (c *Collector) serve(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	c.requests++
	c.mu.Unlock()
	fail := func(code int, format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		c.mu.Lock()
		c.bad = append(c.bad, msg)
		c.mu.Unlock()
		http.Error(w, msg, code)
	}
	if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
		fail(http.StatusNotFound, "%s %s: not the OTLP/HTTP traces endpoint", r.Method, r.URL.Path)
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		fail(http.StatusUnsupportedMediaType, "Content-Type %q, want application/x-protobuf", ct)
		return
	}
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			fail(http.StatusBadRequest, "gzip: %v", err)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(io.LimitReader(body, 64<<20))
	if err != nil {
		fail(http.StatusBadRequest, "reading: %v", err)
		return
	}
	var req coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &req); err != nil {
		fail(http.StatusBadRequest, "decoding ExportTraceServiceRequest: %v", err)
		return
	}
	var got []Span
	for _, rs := range req.GetResourceSpans() {
		res := attrs(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				got = append(got, Span{TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					ParentID: hex.EncodeToString(s.GetParentSpanId()), Name: s.GetName(), Kind: s.GetKind(),
					Attrs: attrs(s.GetAttributes()), StatusError: s.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR,
					StatusMessage: s.GetStatus().GetMessage(), Service: res["service.name"], Resource: res, Scope: ss.GetScope().GetName()})
			}
		}
	}
	c.mu.Lock()
	c.spans = append(c.spans, got...)
	c.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

func attrs(kvs []*commonpb.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		v := kv.GetValue()
		switch v.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.GetKey()] = v.GetStringValue()
		case *commonpb.AnyValue_BoolValue:
			m[kv.GetKey()] = fmt.Sprint(v.GetBoolValue())
		case *commonpb.AnyValue_IntValue:
			m[kv.GetKey()] = fmt.Sprint(v.GetIntValue())
		case *commonpb.AnyValue_DoubleValue:
			m[kv.GetKey()] = fmt.Sprint(v.GetDoubleValue())
		default:
			m[kv.GetKey()] = v.String()
		}
	}
	return m
}

// Spans is every span received so far.
func (c *Collector) Spans() []Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Span(nil), c.spans...)
}

// Requests is how many requests the collector got, good or not.
func (c *Collector) Requests() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.requests
}

// Refused lists what was wrong with the requests the collector refused.
func (c *Collector) Refused() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.bad...)
}

// Tree is a set of spans by id.
type Tree map[string]Span

// TreeOf indexes spans by id.
func TreeOf(spans []Span) Tree {
	t := Tree{}
	for _, s := range spans {
		t[s.SpanID] = s
	}
	return t
}

// Ancestry is s and its ancestors the tree has, nearest first; it stops at a span whose
// parent the tree does not have (a root, or a remote parent).
func (t Tree) Ancestry(s Span) []Span {
	out := []Span{s}
	for s.ParentID != "" {
		p, ok := t[s.ParentID]
		if !ok || len(out) > len(t) {
			break
		}
		out = append(out, p)
		s = p
	}
	return out
}

// Named is the spans whose name is name or starts with name and a space.
func Named(spans []Span, name string) []Span {
	var out []Span
	for _, s := range spans {
		if s.Name == name || strings.HasPrefix(s.Name, name+" ") {
			out = append(out, s)
		}
	}
	return out
}
