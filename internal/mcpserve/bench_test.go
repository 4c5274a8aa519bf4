package mcpserve

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/internal/testenv"
)

const (
	loadSessions = 32
	loadCalls    = 20
)

// loadCall is call i of a session: a mix of write_file, read_file, grep and bash.
func loadCall(i int) (string, map[string]any) {
	f := fmt.Sprintf("load/f%d.txt", i/4)
	switch i % 4 {
	case 0:
		return "write_file", map[string]any{"path": f, "content": "line one\nline two with a needle\nline three\n"}
	case 1:
		return "read_file", map[string]any{"path": f}
	case 2:
		return "grep", map[string]any{"pattern": "needle", "path": "load"}
	default:
		return "bash", map[string]any{"command": "echo $((6 * 7))"}
	}
}

// runLoad runs loadCalls calls in each of the callers at once and returns every call's
// latency and the wall time.
func runLoad(b *testing.B, callers []func(tool string, args map[string]any) error) ([]time.Duration, time.Duration) {
	var mu sync.Mutex
	lat := make([]time.Duration, 0, len(callers)*loadCalls)
	var wg sync.WaitGroup
	start := time.Now()
	for _, call := range callers {
		wg.Go(func() {
			for i := range loadCalls {
				tool, args := loadCall(i)
				t0 := time.Now()
				if err := call(tool, args); err != nil {
					b.Error(err)
					return
				}
				d := time.Since(t0)
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return lat, time.Since(start)
}

func quantile(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// BenchmarkLoad: 32 sessions at once, 20 calls each (write_file, read_file, grep, bash),
// through MCP over streamable HTTP on loopback (the SDK's client) and, in the same run,
// through Session.Dispatch directly. Sessions are opened (and their sandboxes started)
// before the clock runs. Reports throughput, p50 and p99 of a call for both, their
// ratio, and the Go heap per open session (a toolhost session alone; an MCP session,
// server and client sides, on top of it).
//
//	go test -run '^$' -bench Load -benchtime 3x ./mcpserve
func BenchmarkLoad(b *testing.B) {
	cfg := testConfig(b)
	cfg.Screenshot.Enabled = false
	s, th := newServer(b, cfg, Options{MaxSessions: 2 * loadSessions})
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	ctx := context.Background()

	// Warm up: a first round fills the plugins' instance pools and the caches that stay,
	// so the heap figures below count what a session holds.
	warm := make([]func(string, map[string]any) error, loadSessions)
	var warmSessions []*toolhost.Session
	for i := range warm {
		sess, err := th.Open(ctx, toolhost.SessionOptions{Project: fmt.Sprintf("warm%d", i)})
		if err != nil {
			b.Fatal(err)
		}
		warmSessions = append(warmSessions, sess)
		warm[i] = func(tool string, args map[string]any) error {
			in, _ := json.Marshal(args)
			_, err := sess.Dispatch(ctx, tool, in)
			return err
		}
	}
	runLoad(b, warm)
	for _, sess := range warmSessions {
		sess.Close(ctx)
	}
	b.ResetTimer()

	var direct, viaMCP []time.Duration
	var directWall, mcpWall time.Duration
	var heapDirect, heapMCP float64
	for n := 0; n < b.N; n++ {
		// Direct: toolhost sessions, Dispatch.
		h0 := heapInUse()
		sessions := make([]*toolhost.Session, loadSessions)
		callers := make([]func(string, map[string]any) error, loadSessions)
		for i := range sessions {
			sess, err := th.Open(ctx, toolhost.SessionOptions{Project: fmt.Sprintf("direct%d", i)})
			if err != nil {
				b.Fatal(err)
			}
			sessions[i] = sess
			callers[i] = func(tool string, args map[string]any) error {
				in, _ := json.Marshal(args)
				res, err := sess.Dispatch(ctx, tool, in)
				if err == nil && res.IsError {
					err = fmt.Errorf("%s: %s", tool, res.Content[0].Text)
				}
				return err
			}
		}
		heapDirect += float64(heapInUse()-h0) / loadSessions
		lat, wall := runLoad(b, callers)
		direct, directWall = append(direct, lat...), directWall+wall
		for _, sess := range sessions {
			sess.Close(ctx)
		}

		// MCP: a client session each over HTTP; the first call opens the sandbox.
		h0 = heapInUse()
		clients := make([]*mcp.ClientSession, loadSessions)
		for i := range clients {
			cs, err := connectHTTP(ctx, srv.URL+"/mcp", "", fmt.Sprintf("mcp%d", i), nil)
			if err != nil {
				b.Fatal(err)
			}
			clients[i] = cs
			if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"command": "true"}}); err != nil {
				b.Fatal(err)
			}
			callers[i] = func(tool string, args map[string]any) error {
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
				if err == nil && res.IsError {
					err = fmt.Errorf("%s: %s", tool, text(res))
				}
				return err
			}
		}
		heapMCP += float64(heapInUse()-h0) / loadSessions
		lat, wall = runLoad(b, callers)
		viaMCP, mcpWall = append(viaMCP, lat...), mcpWall+wall
		for _, cs := range clients {
			cs.Close()
		}
		testenv.WaitFor(b, "the MCP sessions to end", func() bool { return s.OpenSessions() == 0 })
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(float64(len(direct))/directWall.Seconds(), "direct-calls/s")
	b.ReportMetric(float64(len(viaMCP))/mcpWall.Seconds(), "mcp-calls/s")
	b.ReportMetric(ms(quantile(direct, 0.5)), "direct-p50-ms")
	b.ReportMetric(ms(quantile(viaMCP, 0.5)), "mcp-p50-ms")
	b.ReportMetric(ms(quantile(direct, 0.99)), "direct-p99-ms")
	b.ReportMetric(ms(quantile(viaMCP, 0.99)), "mcp-p99-ms")
	b.ReportMetric(float64(quantile(viaMCP, 0.5))/float64(quantile(direct, 0.5)), "p50-ratio")
	b.ReportMetric(heapDirect/float64(b.N)/1024, "KiB-heap/session")
	b.ReportMetric((heapMCP-heapDirect)/float64(b.N)/1024, "KiB-heap/mcp-session-extra")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkCall: one session, one call at a time (read_file of a small file), through
// Dispatch and through MCP over streamable HTTP on loopback: what the protocol adds to a
// call with no contention.
//
//	go test -run '^$' -bench Call -count 5 ./mcpserve
func BenchmarkCall(b *testing.B) {
	cfg := testConfig(b)
	cfg.Screenshot.Enabled = false
	s, th := newServer(b, cfg, Options{})
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	ctx := context.Background()
	args := map[string]any{"path": "f.txt"}
	in, _ := json.Marshal(args)

	b.Run("dispatch", func(b *testing.B) {
		sess, err := th.Open(ctx, toolhost.SessionOptions{Project: "calldirect"})
		if err != nil {
			b.Fatal(err)
		}
		defer sess.Close(ctx)
		if _, err := sess.Dispatch(ctx, "write_file", json.RawMessage(`{"path":"f.txt","content":"hello\n"}`)); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if res, err := sess.Dispatch(ctx, "read_file", in); err != nil || res.IsError {
				b.Fatal(err, res)
			}
		}
	})
	b.Run("mcp-http", func(b *testing.B) {
		cs, err := connectHTTP(ctx, srv.URL+"/mcp", "", "callmcp", nil)
		if err != nil {
			b.Fatal(err)
		}
		defer cs.Close()
		if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "write_file", Arguments: map[string]any{"path": "f.txt", "content": "hello\n"}}); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "read_file", Arguments: args}); err != nil || res.IsError {
				b.Fatal(err, res)
			}
		}
	})
}
