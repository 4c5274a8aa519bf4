package mcpserve

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolhost/toolhost/internal/testenv"
)

const rawInitialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`

// rawPost posts one JSON-RPC message to /mcp (with the session's id when sid is set) and
// returns the response.
func rawPost(t testing.TB, url, sid, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	}
	resp, err := clientTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// MCP sessions count against max_sessions from their first request: clients that open
// sessions and never send notifications/initialized (nor call a tool) fill the limit
// like any other, and the next is refused.
func TestSessionsCountFromTheFirstRequest(t *testing.T) {
	s, _ := newServer(t, testConfig(t), Options{MaxSessions: 2})
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	for i := range 2 {
		resp := rawPost(t, srv.URL+"/mcp", "", rawInitialize)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Mcp-Session-Id") == "" {
			t.Fatalf("initialize %d: status %d, session %q", i, resp.StatusCode, resp.Header.Get("Mcp-Session-Id"))
		}
	}
	if n := s.ConnectedSessions(); n != 2 {
		t.Errorf("%d sessions counted after two initializes without notifications/initialized, want 2", n)
	}
	resp := rawPost(t, srv.URL+"/mcp", "", rawInitialize)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("a third session past max_sessions 2: status %d, want 503", resp.StatusCode)
	}
}

// The Host check guards every path of a loopback listener, not only /mcp: a page that
// rebinds its name to 127.0.0.1 reads neither health nor metrics.
func TestHostCheckedOnEveryPath(t *testing.T) {
	s, _ := newServer(t, testConfig(t), Options{})
	srv := httptest.NewServer(s.Handler()) // listens on 127.0.0.1
	defer srv.Close()
	for _, path := range []string{"/healthz", "/metrics", "/mcp", "/nothing"} {
		for _, host := range []string{"evil.example", "evil.example:80", "127.0.0.1.evil.example"} {
			req, _ := http.NewRequest("GET", srv.URL+path, nil)
			req.Host = host
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusForbidden {
				t.Errorf("GET %s with Host %s: status %d, want 403", path, host, resp.StatusCode)
			}
		}
	}
	for _, host := range []string{"", "localhost", "[::1]:1"} {
		req, _ := http.NewRequest("GET", srv.URL+"/healthz", nil)
		if host != "" {
			req.Host = host
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET /healthz with Host %q: status %d, want 200", host, resp.StatusCode)
		}
	}
}

// serve without tokens refuses sandbox.network host (a sandbox on the host's network
// reaches the loopback listener), before it listens.
func TestServeRefusesHostNetworkWithoutTokens(t *testing.T) {
	if err := CheckNetwork("host", 0); err == nil {
		t.Error("CheckNetwork(host, no tokens) = nil")
	}
	for _, c := range []struct {
		network string
		tokens  int
	}{{"host", 1}, {"none", 0}, {"", 0}, {"egress", 0}} {
		if err := CheckNetwork(c.network, c.tokens); err != nil {
			t.Errorf("CheckNetwork(%q, %d) = %v", c.network, c.tokens, err)
		}
	}
	cfg := testConfig(t)
	cfg.Sandbox.Network = "host"
	s, _ := newServer(t, cfg, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := s.ListenAndServe(ctx, "127.0.0.1:0", time.Second, func(a net.Addr) { t.Errorf("it listened on %s", a) })
	if err == nil || !strings.Contains(err.Error(), "sandbox.network is host") {
		t.Errorf("ListenAndServe without tokens, network host: %v", err)
	}
}

// A cancelled request gets no response (MCP: the receiver SHOULD NOT send one), and its
// command is killed, on a connection (stdio, in memory) and over streamable HTTP.
func TestCancelledRequestGetsNoResponse(t *testing.T) {
	s, _ := newServer(t, testConfig(t), Options{})
	call := func(id int, marker string) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"bash","arguments":{"command":"sleep %s"}}}`, id, marker)
	}
	cancelOf := func(id int) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":%d,"reason":"user"}}`, id)
	}
	initialized := `{"jsonrpc":"2.0","method":"notifications/initialized"}`

	t.Run("connection", func(t *testing.T) {
		st, ct := mcp.NewInMemoryTransports()
		if _, err := s.Connect(context.Background(), st, "cancelconn"); err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		conn, err := ct.Connect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		msgs := make(chan jsonrpc.Message, 64)
		go func() { // owned by the test: ends when conn closes
			for {
				m, err := conn.Read(ctx)
				if err != nil {
					close(msgs)
					return
				}
				msgs <- m
			}
		}()
		send := func(raw string) {
			t.Helper()
			m, err := jsonrpc.DecodeMessage([]byte(raw))
			if err != nil {
				t.Fatal(err)
			}
			if err := conn.Write(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
		// until reads messages up to the response to id, and returns the ids answered.
		until := func(id int64) []int64 {
			t.Helper()
			var ids []int64
			hang := time.After(2 * time.Minute)
			for {
				select {
				case m, ok := <-msgs:
					if !ok {
						t.Fatal("the connection ended")
					}
					if r, ok := m.(*jsonrpc.Response); ok {
						n, _ := r.ID.Raw().(int64)
						ids = append(ids, n)
						if n == id {
							return ids
						}
					}
				case <-hang:
					t.Fatalf("no response to %d", id)
				}
			}
		}
		send(rawInitialize)
		until(1)
		send(initialized)
		send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"bash","arguments":{"command":"true"}}}`)
		until(2) // the sandbox is up
		marker := fmt.Sprintf("1001.%d", time.Now().UnixNano()%1e9)
		before := s.Metrics().Unanswered()
		send(call(3, marker))
		testenv.WaitFor(t, "sleep "+marker+" to start", func() bool { return len(procsWith("sleep "+marker)) > 0 })
		send(cancelOf(3))
		testenv.WaitFor(t, "sleep "+marker+" to be killed", func() bool { return len(procsWith("sleep "+marker)) == 0 })
		testenv.WaitFor(t, "the answer to the cancelled call to be dropped", func() bool { return s.Metrics().Unanswered() == before+1 })
		// The dropped answer was due before this ping: had it been sent, it came first.
		send(`{"jsonrpc":"2.0","id":4,"method":"ping"}`)
		for _, id := range until(4) {
			if id == 3 {
				t.Error("the cancelled request 3 was answered")
			}
		}
	})

	t.Run("http", func(t *testing.T) {
		srv := httptest.NewServer(s.Handler())
		defer srv.Close()
		url := srv.URL + "/mcp"
		resp := rawPost(t, url, "", rawInitialize)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		sid := resp.Header.Get("Mcp-Session-Id")
		if sid == "" {
			t.Fatalf("no session: %d", resp.StatusCode)
		}
		rawPost(t, url, sid, initialized).Body.Close()
		resp = rawPost(t, url, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"bash","arguments":{"command":"true"}}}`)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		marker := fmt.Sprintf("1002.%d", time.Now().UnixNano()%1e9)
		before := s.Metrics().Unanswered()
		body := make(chan string, 1)
		go func() { // owned by the test: ends when the POST's stream does
			resp := rawPost(t, url, sid, call(3, marker))
			defer resp.Body.Close()
			var b strings.Builder
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				b.WriteString(sc.Text() + "\n")
			}
			body <- b.String()
		}()
		testenv.WaitFor(t, "sleep "+marker+" to start", func() bool { return len(procsWith("sleep "+marker)) > 0 })
		rawPost(t, url, sid, cancelOf(3)).Body.Close()
		testenv.WaitFor(t, "sleep "+marker+" to be killed", func() bool { return len(procsWith("sleep "+marker)) == 0 })
		select {
		case got := <-body:
			for line := range strings.Lines(got) {
				data, ok := strings.CutPrefix(strings.TrimSpace(line), "data:")
				if !ok {
					continue
				}
				var m struct {
					ID     json.RawMessage `json:"id"`
					Result json.RawMessage `json:"result"`
					Error  json.RawMessage `json:"error"`
				}
				if json.Unmarshal([]byte(data), &m) == nil && string(m.ID) == "3" && (m.Result != nil || m.Error != nil) {
					t.Errorf("the cancelled request 3 was answered: %s", data)
				}
			}
		case <-time.After(2 * time.Minute):
			t.Fatal("the cancelled call's stream did not end")
		}
		if got := s.Metrics().Unanswered(); got != before+1 {
			t.Errorf("%d answers dropped, want 1", got-before)
		}
	})
}
