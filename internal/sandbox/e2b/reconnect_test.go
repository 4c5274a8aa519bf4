//go:build linux

package e2b_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/sandbox/e2b"
	"github.com/toolhost/toolhost/internal/sandbox/e2b/e2bfake"
)

// TestReconnectE2B: what is E2B's own in a reconnect (the conformance suite has the rest).
// The connect carries the timeout asked for, and only ever extends: a sandbox that ends
// later keeps its end. A paused sandbox is resumed (E2B's 201), its files restored. An ID
// of E2B's shape that E2B does not have is ErrGone; one of another shape (a local
// sandbox's) never reaches the API and is ErrForeign. The project view reconnects, lists
// and kills too. A sandbox created with labels carries them as metadata.
func TestReconnectE2B(t *testing.T) {
	ctx := context.Background()
	f := startFake(t, byHost, e2bfake.Config{MaxLifetime: 24 * time.Hour})
	cfg := providerConfig(t, f, byHost)
	cfg.Plan = e2b.PlanPro
	p := newProvider(t, cfg)
	view := p.ForProject("shop")
	labels := map[string]string{"toolhost_project": "shop", "toolhost_epoch": "3"}
	sb := newSandbox(t, view, sandbox.CreateOptions{Timeout: 2 * time.Hour, Labels: labels})
	if _, got := apiGet(t, f, sb.ID()); got["metadata"].(map[string]any)["toolhost_epoch"] != "3" ||
		got["metadata"].(map[string]any)["project"] != "shop" {
		t.Errorf("the sandbox's metadata: %v", got["metadata"])
	}
	end := sb.EndsAt()
	r := view.(sandbox.Reconnector)
	again, err := r.Reconnect(ctx, sb.ID(), sandbox.ReconnectOptions{Timeout: time.Minute, Labels: labels})
	if err != nil {
		t.Fatal(err)
	}
	if d := again.EndsAt().Sub(end); d < -2*time.Second || d > 2*time.Second {
		t.Errorf("a reconnect with a shorter timeout moved the end from %s to %s", end, again.EndsAt())
	}
	write := func(sb sandbox.Sandbox, name, content string) {
		if err := sb.WriteFile(ctx, name, []byte(content)); err != nil {
			t.Fatal(err)
		}
	}
	write(again, "kept.txt", "through the pause\n")

	// Paused (E2B keeps it; this provider never pauses, but another client may have).
	req, _ := http.NewRequest(http.MethodPost, "https://api."+f.Domain()+"/sandboxes/"+sb.ID()+"/pause", strings.NewReader(`{}`))
	req.Header.Set("X-API-Key", f.APIKey())
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Transport: f.Transport()}).Do(req)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("pause: %v %v", resp, err)
	}
	resp.Body.Close()
	resumed, err := r.Reconnect(ctx, sb.ID(), sandbox.ReconnectOptions{Timeout: 10 * time.Minute, Labels: labels})
	if err != nil {
		t.Fatalf("reconnect to a paused sandbox: %v", err)
	}
	if b, err := resumed.ReadFile(ctx, "kept.txt", 0); err != nil || string(b) != "through the pause\n" {
		t.Errorf("a file after the resume: %q %v", b, err)
	}
	if left := time.Until(resumed.EndsAt()); left < 9*time.Minute || left > 11*time.Minute {
		t.Errorf("the resumed sandbox ends in %s, want the 10 min asked for", left)
	}

	if _, err := r.Reconnect(ctx, "zzzzzzzzzzzzzzzzzzzz", sandbox.ReconnectOptions{}); !errors.Is(err, sandbox.ErrGone) {
		t.Errorf("reconnect to an ID E2B does not have: %v, want ErrGone", err)
	}
	if _, err := r.Reconnect(ctx, "local-0123456789ab", sandbox.ReconnectOptions{}); !errors.Is(err, sandbox.ErrForeign) {
		t.Errorf("reconnect to a local sandbox's ID: %v, want ErrForeign", err)
	}
	if _, err := r.Reconnect(ctx, sb.ID(), sandbox.ReconnectOptions{Timeout: 48 * time.Hour}); err == nil {
		t.Error("a reconnect past the plan's maximum lifetime was not refused")
	}
	infos, err := view.(sandbox.Lister).List(ctx, map[string]string{"toolhost_project": "shop"})
	if err != nil || len(infos) != 1 || infos[0].ID != sb.ID() || infos[0].State != "running" {
		t.Errorf("List: %+v %v", infos, err)
	}
	if err := view.(sandbox.Killer).Kill(ctx, sb.ID()); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconnect(ctx, sb.ID(), sandbox.ReconnectOptions{}); !errors.Is(err, sandbox.ErrGone) {
		t.Errorf("reconnect after a kill: %v, want ErrGone", err)
	}
}
