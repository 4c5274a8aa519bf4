package mcpserve

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/fleet"
	"github.com/toolhost/toolhost/internal/rootapi"
	"github.com/toolhost/toolhost/internal/testenv"
)

var fleetSecret = []byte("0123456789abcdef0123456789abcdef-test-fleet")

// replica is one serve replica of a test fleet: a Server with a fleet, on a listener of
// its own.
type replica struct {
	s   *Server
	f   *fleet.Fleet
	url string
	hs  *http.Server
}

// newFleet starts n replicas sharing cfg's store, with tokens.
func newFleet(t testing.TB, n int, tokens []Token) []*replica {
	t.Helper()
	return newFleetWrapped(t, n, tokens, nil)
}

// newFleetWrapped is newFleet whose replica i serves wrap(i, its handler) when wrap is
// not nil.
func newFleetWrapped(t testing.TB, n int, tokens []Token, wrap func(i int, h http.Handler) http.Handler) []*replica {
	t.Helper()
	cfg := testConfig(t)
	var rs []*replica
	for i := range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := "http://" + ln.Addr().String()
		s, th := newServer(t, cfg, Options{Tokens: tokens})
		f, err := fleet.Join(context.Background(), fleet.Config{Advertise: addr, Secret: fleetSecret,
			Store: rootapi.Store(th), Heartbeat: time.Second, Logger: quietLog()})
		if err != nil {
			t.Fatal(err)
		}
		// The server was made before its fleet: made again with it (New wires the fleet).
		s2 := New(th, Options{Tokens: tokens, Fleet: f, Logger: quietLog()})
		h := s2.Handler()
		if wrap != nil {
			h = wrap(i, h)
		}
		hs := &http.Server{Handler: h}
		go hs.Serve(ln)
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			s2.Shutdown(ctx)
			hs.Close()
			f.Close(ctx)
		})
		_ = s
		rs = append(rs, &replica{s: s2, f: f, url: addr, hs: hs})
	}
	return rs
}

// roundRobin is a balancer with no affinity: each request goes to the next replica.
func roundRobin(t *testing.T, rs []*replica) string {
	var n atomic.Int64
	var targets []*url.URL
	for _, r := range rs {
		u, _ := url.Parse(r.url)
		targets = append(targets, u)
	}
	rp := &httputil.ReverseProxy{FlushInterval: -1, Rewrite: func(pr *httputil.ProxyRequest) {
		pr.SetURL(targets[int(n.Add(1))%len(targets)])
		pr.Out.Host = pr.In.Host
	}}
	lb := httptest.NewServer(rp)
	t.Cleanup(lb.Close)
	return lb.URL + "/mcp"
}

// TestFleetAnyReplica: behind a balancer with no affinity, a session's requests land on
// either replica and every call is answered from the one workspace; the stateless
// revision too. Requests the holder did not get first were forwarded, signed.
func TestFleetAnyReplica(t *testing.T) {
	tok := "fleet-token-0123456789abcdef"
	rs := newFleet(t, 2, []Token{{Name: "alice", Value: tok}})
	lb := roundRobin(t, rs)
	ctx := context.Background()

	cs, err := connectHTTP(ctx, lb, tok, "shop", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	for i := range 6 {
		p := fmt.Sprintf("f%d.txt", i)
		if res := call(t, cs, "write_file", map[string]any{"path": p, "content": fmt.Sprintf("line %d\n", i)}); res.IsError {
			t.Fatalf("write_file %d: %s", i, text(res))
		}
		res := call(t, cs, "bash", map[string]any{"command": "cat f*.txt | wc -l"})
		if res.IsError || !strings.Contains(text(res), fmt.Sprint(i+1)) {
			t.Fatalf("call %d: %v %q: want %d lines, every file written so far", i, res.IsError, text(res), i+1)
		}
	}
	fwd := rs[0].s.metrics.forwardedTotal.Load() + rs[1].s.metrics.forwardedTotal.Load()
	served := rs[0].s.metrics.fleetServed.Load() + rs[1].s.metrics.fleetServed.Load()
	// A forwarded stream still open (the client's standalone GET) is served, not yet
	// counted as forwarded: served may be ahead.
	if fwd == 0 || served < fwd {
		t.Errorf("forwarded %d, served as forwarded %d: want some, all served", fwd, served)
	}
	held := 0
	for _, r := range rs {
		held += r.s.OpenSessions()
	}
	if held != 1 {
		t.Errorf("%d sandboxes open across the fleet, want 1: the project's holder", held)
	}

	// The stateless revision: each request stands alone, and lands anywhere.
	sl := connectRevision(t, lb, tok, "blog", "2026-07-28")
	defer sl.Close()
	for i := range 4 {
		res := call(t, sl, "bash", map[string]any{"command": fmt.Sprintf("echo %d >> n.txt && wc -l < n.txt", i)})
		if res.IsError || !strings.Contains(text(res), fmt.Sprint(i+1)) {
			t.Fatalf("stateless call %d: %v %q", i, res.IsError, text(res))
		}
	}
}

// TestFleetRefusesForgedRequests: a fleet request signed with another secret, replayed,
// meant for another replica, or carrying the fleet's stand-in token without a signature,
// is refused (401) and runs nothing.
func TestFleetRefusesForgedRequests(t *testing.T) {
	tok := "fleet-token-0123456789abcdef"
	rs := newFleet(t, 1, []Token{{Name: "alice", Value: tok}})
	r := rs[0]
	// An initialize: what a signed request may do is open a session, as alice.
	body := []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"pwned","version":"1"}}}`)
	newReq := func() *http.Request {
		req, _ := http.NewRequest(http.MethodPost, r.url+"/mcp", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set(ProjectHeader, "shop")
		return req
	}
	do := func(req *http.Request) int {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	other, err := fleet.Join(context.Background(), fleet.Config{Advertise: "http://127.0.0.1:1",
		Secret: []byte("another-secret-of-at-least-32-bytes!!"), Store: rootapi.Store(r.s.th)})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.Background())
	req := newReq()
	other.Sign(req, r.f.Instance(), "alice", body)
	if code := do(req); code != http.StatusUnauthorized {
		t.Errorf("signed with another secret: %d, want 401", code)
	}
	// A peer of the fleet (it knows the secret) signs one request for this replica...
	peer, err := fleet.Join(context.Background(), fleet.Config{Advertise: "http://127.0.0.1:2", Secret: fleetSecret,
		Store: rootapi.Store(r.s.th)})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close(context.Background())
	req = newReq()
	peer.Sign(req, "someotherreplica", "alice", body)
	if code := do(req); code != http.StatusMisdirectedRequest {
		t.Errorf("meant for another replica: %d, want 421 (the one meant is not here)", code)
	}
	req = newReq()
	peer.Sign(req, r.f.Instance(), "alice", body)
	replay := req.Clone(context.Background())
	if code := do(req); code != http.StatusOK {
		t.Errorf("a signed request: %d, want 200", code)
	}
	replay.Body = httpBodyOf(body)
	if code := do(replay); code != http.StatusUnauthorized {
		t.Errorf("the same request replayed: %d, want 401", code)
	}
	req = newReq()
	peer.Sign(req, r.f.Instance(), "alice", body)
	req.Body = httpBodyOf([]byte(strings.Replace(string(body), "pwned", "pwned2", 1)))
	req.ContentLength = -1
	if code := do(req); code != http.StatusUnauthorized {
		t.Errorf("a signed request whose body was changed: %d, want 401", code)
	}
	req = newReq()
	req.Header.Set("Authorization", "Bearer "+fleetToken)
	if code := do(req); code != http.StatusUnauthorized {
		t.Errorf("the fleet's stand-in token without a signature: %d, want 401", code)
	}
	if n := r.s.metrics.fleetRefused.Load(); n < 3 {
		t.Errorf("fleet requests refused: %d, want at least 3", n)
	}
}

func httpBodyOf(b []byte) *readCloser { return &readCloser{bytes.NewReader(b)} }

type readCloser struct{ *bytes.Reader }

func (*readCloser) Close() error { return nil }

// TestFleetDrainHandoff: a replica drained with handoff gives its sessions up between
// calls; the client goes on through the balancer without reconnecting, on the other
// replica, with its work (a local sandbox ends with its replica: the work comes back
// from the commit the handoff made).
func TestFleetDrainHandoff(t *testing.T) {
	tok := "fleet-token-0123456789abcdef"
	rs := newFleet(t, 2, []Token{{Name: "alice", Value: tok}})
	lb := roundRobin(t, rs)
	ctx := context.Background()
	// A client that reconnects its standalone stream when its replica goes, as the SDKs do
	// by default.
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: lb,
		HTTPClient: &http.Client{Transport: bearer{token: tok, project: "shop", base: clientTransport}}},
		&mcp.ClientSessionOptions{ProtocolVersion: statefulRevision})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if res := call(t, cs, "write_file", map[string]any{"path": "kept.txt", "content": "before the deploy\n"}); res.IsError {
		t.Fatal(text(res))
	}
	var holder, other *replica
	for i, r := range rs {
		if r.s.OpenSessions() == 1 {
			holder, other = r, rs[1-i]
		}
	}
	if holder == nil {
		t.Fatal("no replica holds the session")
	}
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := holder.s.Drain(dctx); err != nil {
		t.Fatalf("drain: %v", err)
	}
	if holder.s.OpenSessions() != 0 || holder.s.metrics.handedOver.Load() != 1 {
		t.Fatalf("after the drain: %d sessions open on the drained replica, %d handed over", holder.s.OpenSessions(), holder.s.metrics.handedOver.Load())
	}
	for i := range 4 {
		res := call(t, cs, "bash", map[string]any{"command": "cat kept.txt"})
		if res.IsError || !strings.Contains(text(res), "before the deploy") {
			t.Fatalf("call %d after the drain: %v %q", i, res.IsError, text(res))
		}
	}
	if other.s.OpenSessions() != 1 {
		t.Errorf("the other replica has %d sessions open, want the moved one", other.s.OpenSessions())
	}
	resp, err := http.Get(holder.url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/readyz of the drained replica: %d, want 503", resp.StatusCode)
	}
}

// BenchmarkFleetCall: a read_file of a small file through the replica that holds the
// project, and through the other one, which forwards it (signed) to the holder, the two
// alternating call by call: the forward's cost is the ratio of their medians
// (forwarded/holder).
func BenchmarkFleetCall(b *testing.B) {
	tok := "fleet-token-0123456789abcdef"
	rs := newFleet(b, 2, []Token{{Name: "alice", Value: tok}})
	ctx := context.Background()
	holder, err := connectHTTP(ctx, rs[0].url+"/mcp", tok, "shop", nil)
	if err != nil {
		b.Fatal(err)
	}
	defer holder.Close()
	if res := call(b, holder, "write_file", map[string]any{"path": "small.txt", "content": "one line\n"}); res.IsError {
		b.Fatal(text(res))
	}
	if res := call(b, holder, "commit", map[string]any{"label": "small"}); res.IsError {
		b.Fatal(text(res)) // the other session's sandbox wakes from it
	}
	other, err := connectHTTP(ctx, rs[1].url+"/mcp", tok, "shop", nil)
	if err != nil {
		b.Fatal(err)
	}
	defer other.Close()
	// The other replica forwarded the session's initialize to the holder: the session, and
	// its sandbox (opened now, before the timing), are the holder's.
	if res := call(b, other, "read_file", map[string]any{"path": "small.txt"}); res.IsError {
		b.Fatal(text(res))
	}
	// The two alternate, call by call, so that the machine's load falls on both alike;
	// the figure is the ratio of their medians.
	var onHolder, forwarded []time.Duration
	for b.Loop() {
		for _, c := range []struct {
			cs  *mcp.ClientSession
			out *[]time.Duration
		}{{holder, &onHolder}, {other, &forwarded}} {
			start := time.Now()
			if res := call(b, c.cs, "read_file", map[string]any{"path": "small.txt"}); res.IsError {
				b.Fatal(text(res))
			}
			*c.out = append(*c.out, time.Since(start))
		}
	}
	median := func(ds []time.Duration) time.Duration {
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	h, f := median(onHolder), median(forwarded)
	b.ReportMetric(float64(h.Microseconds()), "holder-µs/call")
	b.ReportMetric(float64(f.Microseconds()), "forwarded-µs/call")
	b.ReportMetric(float64(f)/float64(h), "forwarded/holder")
	if rs[0].s.OpenSessions() != 2 || rs[1].s.OpenSessions() != 0 || rs[1].s.metrics.forwardedTotal.Load() == 0 {
		b.Errorf("sandboxes open: %d on the holder, %d on the other (forwarded %d): want both sessions the holder's",
			rs[0].s.OpenSessions(), rs[1].s.OpenSessions(), rs[1].s.metrics.forwardedTotal.Load())
	}
}

// TestFleetDeadHolderTakenOverElsewhere: a request for a project whose holder has died
// (its connection refused) goes where the project went when another replica has taken it
// over meanwhile: the lease is read again before the project is opened here, which the
// store would refuse (the project is open on a live replica) and the call would fail.
func TestFleetDeadHolderTakenOverElsewhere(t *testing.T) {
	tok := "fleet-token-0123456789abcdef"
	rs := newFleet(t, 3, []Token{{Name: "alice", Value: tok}})
	at := func(i int) *mcp.ClientSession {
		return connectRevision(t, rs[i].url+"/mcp", tok, "shop", "2026-07-28")
	}
	if res := call(t, at(0), "write_file", map[string]any{"path": "a.txt", "content": "from the first holder\n"}); res.IsError {
		t.Fatalf("write_file on replica 0: %s", text(res))
	}
	// Replica 0 dies: its connections are refused, its lease lingers.
	rs[0].hs.Close()
	// Replica 1 takes the project over (its holder found dead).
	if res := call(t, at(1), "write_file", map[string]any{"path": "b.txt", "content": "from the second\n"}); res.IsError {
		t.Fatalf("write_file on replica 1, taking the project over: %s", text(res))
	}
	// Replica 2 still believes replica 0 holds it (a recent answer, cached).
	c2 := at(2) // its handshake is not forwarded
	rs[2].s.holders.put("shop", holderEntry{instance: rs[0].f.Instance(), addr: rs[0].url, until: time.Now().Add(time.Hour)})
	res := call(t, c2, "bash", map[string]any{"command": "cat a.txt b.txt"})
	t.Logf("replica 2 forwarded %d requests", rs[2].s.metrics.forwardedTotal.Load())
	if res.IsError || !strings.Contains(text(res), "from the second") {
		t.Fatalf("a call on replica 2 after the takeover: error %v: %s", res.IsError, text(res))
	}
	if n := rs[2].s.OpenSessions(); n != 0 {
		t.Errorf("replica 2 opened the project (%d sessions): it is replica 1's", n)
	}
}

// TestFleetAdoptedSessionEnds: a client whose session was made on the holder, which then
// died, goes on through another replica (the session adopted there, the project taken
// over); when the client ends its session (DELETE), that replica closes it: its sandbox
// and its slot are not kept until the idle timeout.
func TestFleetAdoptedSessionEnds(t *testing.T) {
	tok := "fleet-token-0123456789abcdef"
	rs := newFleet(t, 2, []Token{{Name: "alice", Value: tok}})
	ctx := context.Background()
	holder, err := connectHTTP(ctx, rs[0].url+"/mcp", tok, "shop", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if res := call(t, holder, "write_file", map[string]any{"path": "a.txt", "content": "one\n"}); res.IsError {
		t.Fatalf("write_file on the holder: %s", text(res))
	}
	// Its handshake is forwarded to the holder; its standalone stream reconnects when the
	// holder dies, as a client's does.
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	other, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: rs[1].url + "/mcp", MaxRetries: 5,
		HTTPClient: &http.Client{Transport: bearer{token: tok, project: "shop", base: clientTransport}}},
		&mcp.ClientSessionOptions{ProtocolVersion: statefulRevision})
	if err != nil {
		t.Fatal(err)
	}
	rs[0].hs.Close() // the holder dies
	// A request under way to it gets a 502 (retry), as a client would.
	var res *mcp.CallToolResult
	for range 5 {
		if res, err = other.CallTool(ctx, &mcp.CallToolParams{Name: "read_file", Arguments: map[string]any{"path": "a.txt"}}); err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The local provider's sandbox died with its replica: the project starts again, and
	// the result says what was lost.
	if err != nil || !strings.Contains(text(res), "took over from an earlier session") {
		t.Fatalf("read_file through replica 1 after the holder died: %v %s", err, text(res))
	}
	if n := rs[1].s.OpenSessions(); n != 1 {
		t.Fatalf("replica 1 has %d sessions open after the takeover, want 1", n)
	}
	if err := other.Close(); err != nil {
		t.Logf("closing the client's session: %v", err)
	}
	deadline := time.Now().Add(time.Minute)
	for rs[1].s.OpenSessions() != 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := rs[1].s.OpenSessions(); n != 0 {
		t.Errorf("replica 1 still has %d sessions open a minute after the client ended its session", n)
	}
}

// TestFleetHandleOutlivesItsReplica: a session of the stateless revision (a handle
// session_start answered) goes on when the replica that opened it dies, on any replica
// (adopted from its record under the same handle), and again after that one is drained
// for a deploy; another token's call with the handle finds no session and opens
// nothing; session_end ends it where it is, its slot freed and its record gone.
func TestFleetHandleOutlivesItsReplica(t *testing.T) {
	tok, bobTok := "fleet-token-0123456789abcdef", "fleet-token-bob-0123456789abcd"
	rs := newFleet(t, 3, []Token{{Name: "alice", Value: tok}, {Name: "bob", Value: bobTok}})
	at := func(i int, token string) *mcp.ClientSession {
		// The header names another project: a handle's calls go by its own.
		return connectRevision(t, rs[i].url+"/mcp", token, "elsewhere", "2026-07-28")
	}
	start := call(t, connectRevision(t, rs[0].url+"/mcp", tok, "shop", "2026-07-28"), SessionStartTool, map[string]any{})
	sc, _ := start.StructuredContent.(map[string]any)
	id, _ := sc["session"].(string)
	if start.IsError || id == "" {
		t.Fatalf("session_start: %v %s", start.IsError, text(start))
	}
	if res := call(t, at(0, tok), "write_file", map[string]any{"path": "a.txt", "content": "one\n", "session": id}); res.IsError {
		t.Fatalf("write_file in %s: %s", id, text(res))
	}
	if res := call(t, at(0, tok), "commit", map[string]any{"session": id}); res.IsError {
		t.Fatalf("commit in %s: %s", id, text(res))
	}
	rs[0].hs.Close() // the replica that opened the session dies

	// Another token's call with the handle: no session, nothing opened.
	if res := call(t, at(1, bobTok), "read_file", map[string]any{"path": "a.txt", "session": id}); !res.IsError || !strings.Contains(text(res), "no session") {
		t.Fatalf("bob's call with alice's handle: %v %s", res.IsError, text(res))
	}
	if n := rs[1].s.OpenSessions(); n != 0 {
		t.Fatalf("bob's call opened %d sessions on replica 1", n)
	}
	res := call(t, at(1, tok), "bash", map[string]any{"command": "cat a.txt && echo two > b.txt", "session": id})
	if res.IsError || !strings.Contains(text(res), "one") {
		t.Fatalf("a call in %s on replica 1 after its replica died: %v %s", id, res.IsError, text(res))
	}
	if n := rs[1].s.OpenSessions(); n != 1 {
		t.Fatalf("replica 1 has %d sessions open after adopting %s, want 1", n, id)
	}
	// Replica 0 (alive behind its closed listener) finds it lost the lease; its copy of
	// the session then ends there: that must not delete the record replica 1 goes on with.
	owner := "token:alice"
	if !testenv.Eventually(func() bool {
		h, err := rs[0].s.lookup(owner, id)
		if err != nil {
			return false
		}
		h.b.mu.Lock()
		defer h.b.mu.Unlock()
		return h.b.sess != nil && rootapi.LeaseLost(h.b.sess) != nil
	}) {
		t.Fatal("replica 0 never found that it lost the project's lease")
	}
	rs[0].s.stopHeld(context.Background(), owner, id)
	if _, err := rs[1].s.handleRecord(context.Background(), id); err != nil {
		t.Fatalf("the record of %s after the replica that lost its lease ended its copy: %v", id, err)
	}

	// A deploy drains replica 1: the session is handed over and goes on on replica 2.
	dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := rs[1].s.Drain(dctx); err != nil {
		t.Fatalf("drain: %v", err)
	}
	for _, i := range []int{1, 2} { // through the drained replica too: it goes where the project went
		res = call(t, at(i, tok), "bash", map[string]any{"command": "cat a.txt b.txt", "session": id})
		if res.IsError || !strings.Contains(text(res), "one") || !strings.Contains(text(res), "two") {
			t.Fatalf("a call in %s through replica %d after the drain: %v %s", id, i, res.IsError, text(res))
		}
	}
	if n := rs[2].s.OpenSessions(); n != 1 || rs[1].s.OpenSessions() != 0 {
		t.Fatalf("replica 2 has %d sessions open, want the moved one; the drained replica %d, want 0 (a draining "+
			"replica that found the ready peer it chose gone sends the call to another, it does not open it)", n, rs[1].s.OpenSessions())
	}
	if res = call(t, at(2, tok), SessionEndTool, map[string]any{"session": id}); res.IsError {
		t.Fatalf("session_end: %s", text(res))
	}
	if n := rs[2].s.OpenSessions(); n != 0 {
		t.Errorf("replica 2 has %d sessions open after session_end", n)
	}
	if !testenv.Eventually(func() bool {
		_, err := rs[2].s.handleRecord(context.Background(), id)
		return errors.Is(err, store.ErrNotFound)
	}) {
		t.Errorf("the record of %s is still in the store after session_end", id)
	}
	if res = call(t, at(2, tok), "read_file", map[string]any{"path": "a.txt", "session": id}); !res.IsError {
		t.Errorf("a call in %s after session_end: %s", id, text(res))
	}
}

// TestFleetStaleHandleIsReaped: a replica killed with a session open (kill -9: nothing
// ends its copy) leaves the handle's record in the store. Once it has been idle past its
// idle timeout, a call naming the handle is "no session" (the project is not opened
// again), and a replica's reaper pass deletes the record; the record of a session a live
// replica holds stays, however old its time says it is.
func TestFleetStaleHandleIsReaped(t *testing.T) {
	tok := "fleet-token-0123456789abcdef"
	rs := newFleet(t, 3, []Token{{Name: "alice", Value: tok}})
	owner := "token:alice"
	start := func(i int, project string) string {
		res := call(t, connectRevision(t, rs[i].url+"/mcp", tok, project, "2026-07-28"), SessionStartTool, map[string]any{})
		sc, _ := res.StructuredContent.(map[string]any)
		id, _ := sc["session"].(string)
		if res.IsError || id == "" {
			t.Fatalf("session_start on replica %d: %v %s", i, res.IsError, text(res))
		}
		return id
	}
	// backdate rewrites handle id's record as it stood two hours ago: its last use then.
	backdate := func(id string) {
		st := rootapi.Store(rs[1].s.th)
		key := "fleet/handles/" + id
		rc, _, err := st.Get(context.Background(), key)
		if err != nil {
			t.Fatalf("the record of %s: %v", id, err)
		}
		var m map[string]any
		err = json.NewDecoder(rc).Decode(&m)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		old := time.Now().Add(-2 * time.Hour).UTC()
		m["created"], m["used"] = old, old
		b, _ := json.Marshal(m)
		if _, err := st.Put(context.Background(), key, bytes.NewReader(b), store.PutOptions{Size: int64(len(b))}); err != nil {
			t.Fatal(err)
		}
	}
	dead := start(0, "shop")
	if res := call(t, connectRevision(t, rs[0].url+"/mcp", tok, "shop", "2026-07-28"), "write_file",
		map[string]any{"path": "a.txt", "content": "one\n", "session": dead}); res.IsError {
		t.Fatalf("write_file in %s: %s", dead, text(res))
	}
	// Replica 0 is killed: its copy of the session ends without a word to the store (the
	// record stays as it was), and it answers no more.
	h, err := rs[0].s.lookup(owner, dead)
	if err != nil {
		t.Fatal(err)
	}
	h.recorded = false // read by forget after stopHeld ends the session
	rs[0].s.stopHeld(context.Background(), owner, dead)
	rs[0].hs.Close()
	if _, err := rs[1].s.handleRecord(context.Background(), dead); err != nil {
		t.Fatalf("the record of the killed replica's session %s: %v", dead, err)
	}
	backdate(dead) // two hours pass

	live := start(1, "live") // held by replica 1, which lives: however old its record's time
	backdate(live)

	res := call(t, connectRevision(t, rs[1].url+"/mcp", tok, "elsewhere", "2026-07-28"), "read_file",
		map[string]any{"path": "a.txt", "session": dead})
	if !res.IsError || !strings.Contains(text(res), "no session") {
		t.Fatalf("a call naming %s, idle two hours, its replica killed: %v %s", dead, res.IsError, text(res))
	}
	if n := rs[1].s.OpenSessions(); n != 1 {
		t.Fatalf("replica 1 has %d sessions open after a call naming a stale handle, want 1 (its own)", n)
	}
	// Replica 2 reaps: the killed replica's record goes; the one replica 1 holds stays.
	if n, err := rs[2].s.reapHandles(context.Background()); err != nil || n != 1 {
		t.Errorf("the reaper pass deleted %d records, want 1: %v", n, err)
	}
	if _, err := rs[1].s.handleRecord(context.Background(), dead); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the stale record of %s after a reaper pass: %v", dead, err)
	}
	if _, err := rs[1].s.handleRecord(context.Background(), live); err != nil {
		t.Errorf("the record of %s, held by a live replica, after a reaper pass: %v", live, err)
	}
	// A stale record of the project replica 1 holds (another session of it, on a replica
	// killed since): replica 1 holds the project, so nobody else holds that session.
	other := "live-0a0b0c"
	b, _ := json.Marshal(handleRecord{ID: other, Project: "live", Owner: owner, IdleMS: time.Minute.Milliseconds(),
		Instance: "killed", Created: time.Now().Add(-2 * time.Hour).UTC()})
	if _, err := rootapi.Store(rs[1].s.th).Put(context.Background(), "fleet/handles/"+other, bytes.NewReader(b),
		store.PutOptions{Size: int64(len(b))}); err != nil {
		t.Fatal(err)
	}
	if n, err := rs[1].s.reapHandles(context.Background()); err != nil || n != 1 {
		t.Errorf("the holder's reaper pass deleted %d records, want 1 (%s, not its own %s): %v", n, other, live, err)
	}
	if _, err := rs[1].s.handleRecord(context.Background(), other); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the stale record of %s after the holder's reaper pass: %v", other, err)
	}
	if _, err := rs[1].s.handleRecord(context.Background(), live); err != nil {
		t.Errorf("the record of %s after its holder's reaper pass: %v", live, err)
	}
	if res := call(t, connectRevision(t, rs[1].url+"/mcp", tok, "live", "2026-07-28"), "bash",
		map[string]any{"command": "true", "session": live}); res.IsError {
		t.Errorf("a call in the live session %s after the reaper pass: %s", live, text(res))
	}
}
