package mcpserve

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
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
	deadline := time.Now().Add(2 * time.Minute)
	for len(s.Held()) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the idle session was not ended")
		}
		time.Sleep(50 * time.Millisecond)
	}
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
