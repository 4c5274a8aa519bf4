package mcpserve

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/toolhost/toolhost/internal/fleet"
)

// latencyBuckets are the upper bounds (seconds) of the tools/call latency histogram.
var latencyBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}

// Metrics are the server's counters, written in the Prometheus text format by WriteTo:
// per tool, calls, error results and a latency histogram; sessions open and opened; HTTP
// requests refused for their token.
type Metrics struct {
	tools map[string]*toolMetrics // fixed at New: no lock for the map itself

	clientsConnected atomic.Int64
	sessionsOpen     atomic.Int64
	sessionsTotal    atomic.Int64
	authRefused      atomic.Int64
	projectRefused   atomic.Int64
	unanswered       atomic.Int64

	// The fleet's (a replica's): requests forwarded to a holder (and those that failed,
	// and the holders found gone), forwarded requests served here and refused, sessions
	// adopted, sessions handed over at a drain.
	forwardedTotal, forwardFailed, holderGone atomic.Int64
	fleetServed, fleetRefused, adopted        atomic.Int64
	handedOver                                atomic.Int64
	orphansReaped, handlesReaped              atomic.Int64

	// egress gives, per project, the connections the egress gateway allowed and refused.
	egress func() map[string][2]int64
}

// cancelDropped counts a response not sent because the client cancelled its request.
func (m *Metrics) cancelDropped() { m.unanswered.Add(1) }

// Unanswered is how many responses were not sent because the client had cancelled the
// request.
func (m *Metrics) Unanswered() int64 { return m.unanswered.Load() }

type toolMetrics struct {
	mu      sync.Mutex
	calls   uint64
	errors  uint64
	sum     float64
	buckets []uint64 // counts per bucket (not cumulative); the last is +Inf
}

func newMetrics(tools []string) *Metrics {
	m := &Metrics{tools: map[string]*toolMetrics{}}
	for _, t := range tools {
		m.tools[t] = &toolMetrics{buckets: make([]uint64, len(latencyBuckets)+1)}
	}
	return m
}

func (m *Metrics) observe(tool string, isError bool, d time.Duration) {
	t := m.tools[tool]
	if t == nil {
		return
	}
	sec := d.Seconds()
	i, _ := slices.BinarySearch(latencyBuckets, sec)
	t.mu.Lock()
	t.calls++
	if isError {
		t.errors++
	}
	t.sum += sec
	t.buckets[i]++
	t.mu.Unlock()
}

func (m *Metrics) sessionOpened() { m.sessionsOpen.Add(1); m.sessionsTotal.Add(1) }
func (m *Metrics) sessionClosed() { m.sessionsOpen.Add(-1) }

// Calls reports a tool's calls and error results so far.
func (m *Metrics) Calls(tool string) (calls, errors uint64) {
	t := m.tools[tool]
	if t == nil {
		return 0, 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.calls, t.errors
}

// WriteTo writes the metrics in the Prometheus text exposition format (version 0.0.4).
func (m *Metrics) WriteTo(w io.Writer) (int64, error) {
	cw := &countWriter{w: w}
	names := make([]string, 0, len(m.tools))
	for n := range m.tools {
		names = append(names, n)
	}
	slices.Sort(names)
	type snap struct {
		calls, errors uint64
		sum           float64
		buckets       []uint64
	}
	snaps := make([]snap, len(names))
	for i, n := range names {
		t := m.tools[n]
		t.mu.Lock()
		snaps[i] = snap{t.calls, t.errors, t.sum, slices.Clone(t.buckets)}
		t.mu.Unlock()
	}
	p := func(format string, args ...any) { fmt.Fprintf(cw, format, args...) }
	p("# HELP toolhost_mcp_tool_calls_total Tool calls received over MCP.\n# TYPE toolhost_mcp_tool_calls_total counter\n")
	for i, n := range names {
		p("toolhost_mcp_tool_calls_total{tool=%s} %d\n", quote(n), snaps[i].calls)
	}
	p("# HELP toolhost_mcp_tool_errors_total Tool calls whose result was an error (is_error).\n# TYPE toolhost_mcp_tool_errors_total counter\n")
	for i, n := range names {
		p("toolhost_mcp_tool_errors_total{tool=%s} %d\n", quote(n), snaps[i].errors)
	}
	p("# HELP toolhost_mcp_tool_call_seconds Latency of tool calls over MCP.\n# TYPE toolhost_mcp_tool_call_seconds histogram\n")
	for i, n := range names {
		var cum uint64
		for j, le := range latencyBuckets {
			cum += snaps[i].buckets[j]
			p("toolhost_mcp_tool_call_seconds_bucket{tool=%s,le=%q} %d\n", quote(n), formatFloat(le), cum)
		}
		cum += snaps[i].buckets[len(latencyBuckets)]
		p("toolhost_mcp_tool_call_seconds_bucket{tool=%s,le=\"+Inf\"} %d\n", quote(n), cum)
		p("toolhost_mcp_tool_call_seconds_sum{tool=%s} %s\n", quote(n), formatFloat(snaps[i].sum))
		p("toolhost_mcp_tool_call_seconds_count{tool=%s} %d\n", quote(n), cum)
	}
	p("# HELP toolhost_mcp_sessions_open Sessions with an open sandbox.\n# TYPE toolhost_mcp_sessions_open gauge\n")
	p("toolhost_mcp_sessions_open %d\n", m.sessionsOpen.Load())
	p("# HELP toolhost_mcp_sessions_connected MCP sessions connected, with a sandbox or not yet.\n# TYPE toolhost_mcp_sessions_connected gauge\n")
	p("toolhost_mcp_sessions_connected %d\n", m.clientsConnected.Load())
	p("# HELP toolhost_mcp_sessions_total Sessions opened since the start.\n# TYPE toolhost_mcp_sessions_total counter\n")
	p("toolhost_mcp_sessions_total %d\n", m.sessionsTotal.Load())
	p("# HELP toolhost_mcp_auth_refused_total HTTP requests refused for a missing or wrong token.\n# TYPE toolhost_mcp_auth_refused_total counter\n")
	p("toolhost_mcp_auth_refused_total %d\n", m.authRefused.Load())
	p("# HELP toolhost_mcp_project_refused_total Sessions refused a project their token does not name.\n# TYPE toolhost_mcp_project_refused_total counter\n")
	p("toolhost_mcp_project_refused_total %d\n", m.projectRefused.Load())
	p("# HELP toolhost_fleet_forwarded_total Requests forwarded to the replica holding their project.\n# TYPE toolhost_fleet_forwarded_total counter\n")
	p("toolhost_fleet_forwarded_total %d\n", m.forwardedTotal.Load())
	p("# HELP toolhost_fleet_forward_failed_total Forwarded requests that got no answer from the holder.\n# TYPE toolhost_fleet_forward_failed_total counter\n")
	p("toolhost_fleet_forward_failed_total %d\n", m.forwardFailed.Load())
	p("# HELP toolhost_fleet_failovers_total Projects served here because their holder was found gone.\n# TYPE toolhost_fleet_failovers_total counter\n")
	p("toolhost_fleet_failovers_total %d\n", m.holderGone.Load())
	p("# HELP toolhost_fleet_served_total Requests other replicas forwarded here.\n# TYPE toolhost_fleet_served_total counter\n")
	p("toolhost_fleet_served_total %d\n", m.fleetServed.Load())
	p("# HELP toolhost_fleet_refused_total Fleet requests refused for their signature.\n# TYPE toolhost_fleet_refused_total counter\n")
	p("toolhost_fleet_refused_total %d\n", m.fleetRefused.Load())
	p("# HELP toolhost_fleet_sessions_adopted_total MCP sessions of other replicas taken in here.\n# TYPE toolhost_fleet_sessions_adopted_total counter\n")
	p("toolhost_fleet_sessions_adopted_total %d\n", m.adopted.Load())
	p("# HELP toolhost_fleet_handoffs_total Sessions handed over at a drain (serve.drain handoff).\n# TYPE toolhost_fleet_handoffs_total counter\n")
	p("toolhost_fleet_handoffs_total %d\n", m.handedOver.Load())
	p("# HELP toolhost_fleet_orphans_reaped_total Sandboxes killed because nobody held their project for longer than serve.fleet.orphan_after.\n# TYPE toolhost_fleet_orphans_reaped_total counter\n")
	p("toolhost_fleet_orphans_reaped_total %d\n", m.orphansReaped.Load())
	p("# HELP toolhost_fleet_handles_reaped_total Records of stateless sessions deleted because their replica was gone and they were idle past their timeout.\n# TYPE toolhost_fleet_handles_reaped_total counter\n")
	p("toolhost_fleet_handles_reaped_total %d\n", m.handlesReaped.Load())
	p("# HELP toolhost_mcp_cancelled_unanswered_total Requests the client cancelled, left unanswered as MCP asks.\n# TYPE toolhost_mcp_cancelled_unanswered_total counter\n")
	p("toolhost_mcp_cancelled_unanswered_total %d\n", m.unanswered.Load())
	if m.egress != nil {
		counts := m.egress()
		projects := make([]string, 0, len(counts))
		for pr := range counts {
			projects = append(projects, pr)
		}
		slices.Sort(projects)
		p("# HELP toolhost_egress_connections_total Connections (and plain HTTP requests) of the sandboxes through the egress gateway, by project and decision.\n# TYPE toolhost_egress_connections_total counter\n")
		for _, pr := range projects {
			p("toolhost_egress_connections_total{project=%s,decision=\"allow\"} %d\n", quote(pr), counts[pr][0])
			p("toolhost_egress_connections_total{project=%s,decision=\"deny\"} %d\n", quote(pr), counts[pr][1])
		}
	}
	return cw.n, cw.err
}

// quote is a label value: Go's %q escapes backslash, quote and newline as Prometheus
// wants, and tool names are [A-Za-z0-9_.-] anyway.
func quote(s string) string { return strconv.Quote(s) }

func formatFloat(f float64) string {
	if math.IsInf(f, 1) {
		return "+Inf"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

type countWriter struct {
	w   io.Writer
	n   int64
	err error
}

func (c *countWriter) Write(b []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.w.Write(b)
	c.n += int64(n)
	c.err = err
	return n, err
}

// forwarded counts a forwarded request and how it ended.
func (m *Metrics) forwarded(err error, _ time.Duration) {
	m.forwardedTotal.Add(1)
	switch {
	case err == nil:
	case errors.Is(err, fleet.ErrUnreachable):
		m.holderGone.Add(1)
	default:
		m.forwardFailed.Add(1)
	}
}
