package mcpserve

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/internal/testenv"
)

// TestHeldIdle: a held session that has no call for its idle timeout ends with its work
// committed, and a call to it then says so (404); with nothing left, CloseIfIdle closes
// the server, which then refuses new sessions (503).
func TestHeldIdle(t *testing.T) {
	t.Parallel()
	s, _ := newServer(t, testConfig(t), Options{})
	ctx := context.Background()
	h, err := s.StartHeld(ctx, "idle", "", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if s.CloseIfIdle(0) {
		t.Fatal("CloseIfIdle closed a server that holds a session")
	}
	res, err := s.CallHeld(ctx, h.ID, "write_file", json.RawMessage(`{"path":"a.txt","content":"kept"}`))
	if err != nil || res.IsError {
		t.Fatalf("write_file: %v %+v", err, res)
	}
	testenv.WaitFor(t, "the idle session to end", func() bool { return len(s.Held()) == 0 })
	_, err = s.CallHeld(ctx, h.ID, "bash", nil)
	var ae *apiError
	if !errors.As(err, &ae) || ae.status != http.StatusNotFound || !strings.Contains(err.Error(), "it was idle for 2s") ||
		!strings.Contains(err.Error(), "its work is snapshot projects/idle/snapshots/") {
		t.Errorf("a call to the idle-ended session: %v", err)
	}
	if !s.CloseIfIdle(0) {
		t.Fatal("CloseIfIdle did not close a server with nothing held")
	}
	_, err = s.StartHeld(ctx, "idle", "", 0)
	if !errors.As(err, &ae) || ae.status != http.StatusServiceUnavailable {
		t.Errorf("a start after CloseIfIdle: %v", err)
	}
}

// TestWorkspaces: a project named in Options.Workspaces works on its host directory, over
// MCP (HTTP, the project from the header) and as a held session alike; other projects
// keep their private workspaces.
func TestWorkspaces(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, _ := newServer(t, testConfig(t), Options{Workspaces: map[string]string{"repo": dir}})
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	ctx := context.Background()
	cs, err := connectHTTP(ctx, srv.URL+"/mcp", "", "repo", nil)
	if err != nil {
		t.Fatal(err)
	}
	if res := call(t, cs, "write_file", map[string]any{"path": "over-mcp.txt", "content": "mcp\n"}); res.IsError {
		t.Fatalf("write_file: %s", text(res))
	}
	cs.Close()
	if b, err := os.ReadFile(filepath.Join(dir, "over-mcp.txt")); err != nil || string(b) != "mcp\n" {
		t.Errorf("over-mcp.txt in the project's directory: %q %v", b, err)
	}
	h, err := s.StartHeld(ctx, "repo", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if h.Workspace != dir {
		t.Errorf("the held session's workspace is %q, want %q", h.Workspace, dir)
	}
	res, err := s.CallHeld(ctx, h.ID, "bash", json.RawMessage(`{"command":"cat over-mcp.txt"}`))
	if err != nil || res.IsError || !strings.Contains(res.Content[0].Text, "mcp") {
		t.Errorf("the held session does not see the directory: %v %+v", err, res)
	}
	if _, err := s.StopHeld(ctx, h.ID); err != nil {
		t.Fatal(err)
	}
	other, err := s.StartHeld(ctx, "other", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if other.Workspace != "" {
		t.Errorf("another project got the workspace %q", other.Workspace)
	}
}
