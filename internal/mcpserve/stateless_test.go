package mcpserve

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// connectRevision is an SDK client over streamable HTTP speaking revision (or the newest,
// when empty).
func connectRevision(t *testing.T, url, token, project, revision string) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	tr := &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1,
		HTTPClient: &http.Client{Transport: bearer{token: token, project: project, base: clientTransport}}}
	cs, err := c.Connect(context.Background(), tr, &mcp.ClientSessionOptions{ProtocolVersion: revision})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// TestTwoRevisions: one server answers a client of the stateless revision (2026-07-28)
// and one of the stateful 2025-11-25 at once. The stateless client's calls without a
// handle share the default session of its token and project; session_start gives a
// handle to a session of its own; another token cannot use that handle; session_end
// commits it.
func TestTwoRevisions(t *testing.T) {
	t.Parallel()
	s, _ := newServer(t, testConfig(t), Options{Tokens: []Token{{Name: "a", Value: tokenA}, {Name: "b", Value: tokenB}}})
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close) // after the clients' cleanups close their streams
	url := srv.URL + "/mcp"

	neu := connectRevision(t, url, tokenA, "two", "")
	old := connectRevision(t, url, tokenB, "two-old", statefulRevision)
	if v := neu.InitializeResult().ProtocolVersion; v != "2026-07-28" {
		t.Errorf("the newest client negotiated %q, want 2026-07-28", v)
	}
	if v := old.InitializeResult().ProtocolVersion; v != statefulRevision {
		t.Errorf("the older client negotiated %q, want %s", v, statefulRevision)
	}

	// Tools: the stateless revision's have the session argument and the session tools.
	tools := map[string]*mcp.Tool{}
	for tool, err := range neu.Tools(context.Background(), nil) {
		if err != nil {
			t.Fatal(err)
		}
		tools[tool.Name] = tool
		if tool.Title == "" {
			t.Errorf("the stateless revision's %s has no title", tool.Name)
		}
	}
	if tools[SessionStartTool] == nil || tools[SessionEndTool] == nil || tools["bash"] == nil {
		t.Fatalf("the stateless revision's tools: %v", tools)
	}
	if b, _ := tools["bash"].InputSchema.(map[string]any); b == nil || b["properties"].(map[string]any)[sessionArg] == nil {
		t.Errorf("bash's schema has no session argument: %v", tools["bash"].InputSchema)
	}
	for tool, err := range old.Tools(context.Background(), nil) {
		if err != nil {
			t.Fatal(err)
		}
		if tool.Name == SessionStartTool {
			t.Error("the stateful revision lists session_start")
		}
	}

	// Without a handle: one default session across requests.
	if res := call(t, neu, "write_file", map[string]any{"path": "a.txt", "content": "default\n"}); res.IsError {
		t.Fatalf("write_file: %s", text(res))
	}
	if res := call(t, neu, "read_file", map[string]any{"path": "a.txt"}); res.IsError || !strings.Contains(text(res), "default") {
		t.Errorf("the default session did not keep a.txt: %s", text(res))
	}
	// The older client has its own session, as ever.
	if res := call(t, old, "bash", map[string]any{"command": "ls a.txt"}); !strings.Contains(text(res), "No such file") {
		t.Errorf("the 2025-11-25 client sees the other's file: %s", text(res))
	}

	// A session of its own, by handle.
	res := call(t, neu, SessionStartTool, map[string]any{})
	st, _ := res.StructuredContent.(map[string]any)
	handle, _ := st["session"].(string)
	if res.IsError || handle == "" {
		t.Fatalf("session_start: %s %v", text(res), res.StructuredContent)
	}
	if res := call(t, neu, "bash", map[string]any{"command": "ls a.txt || echo none", sessionArg: handle}); !strings.Contains(text(res), "none") {
		t.Errorf("the new session sees the default session's file: %s", text(res))
	}
	if res := call(t, neu, "write_file", map[string]any{"path": "b.txt", "content": "mine", sessionArg: handle}); res.IsError {
		t.Fatalf("write_file in the session: %s", text(res))
	}
	// Another token's client cannot use the handle.
	other := connectRevision(t, url, tokenB, "two", "")
	if res := call(t, other, "read_file", map[string]any{"path": "b.txt", sessionArg: handle}); !res.IsError || !strings.Contains(text(res), "no session") {
		t.Errorf("another token used the handle: %s", text(res))
	}
	res = call(t, neu, SessionEndTool, map[string]any{sessionArg: handle})
	if res.IsError || !strings.Contains(text(res), "snapshot projects/two/snapshots/") {
		t.Errorf("session_end: %s", text(res))
	}
	if res := call(t, neu, "bash", map[string]any{"command": "true", sessionArg: handle}); !res.IsError || !strings.Contains(text(res), "has ended") {
		t.Errorf("a call to the ended session: %s", text(res))
	}
}
