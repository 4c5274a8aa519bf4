//go:build linux

package e2b_test

import (
	"bytes"
	"context"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/sandbox/e2b"
	"github.com/toolhost/toolhost/internal/sandbox/e2b/e2bfake"
	"github.com/toolhost/toolhost/internal/session"
	"github.com/toolhost/toolhost/internal/snapshot"
)

// Quota counts after a scripted session: creations and CPU minutes per project and day,
// persisted in the data directory, added up across writers, with warnings near the
// plan's limits.
func TestQuotaAfterAScriptedSession(t *testing.T) {
	f := startFake(t, byHeader, e2bfake.Config{})
	dataDir := t.TempDir()
	ledger, err := e2b.OpenLedger(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	cfg := providerConfig(t, f, byHeader)
	cfg.Quota = ledger
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	cfg.Plan = e2b.Plan{Name: "tight", MaxLifetime: time.Hour, ConcurrentSandboxes: 1, CreationsPerSecond: 0.1, MonthlyCPUMinutes: 1e9}
	p := newProvider(t, cfg)
	ctx := context.Background()

	// Project alpha: a session that rotates twice (three sandboxes), then closes.
	st := mustDir(t)
	snaps, err := snapshot.New(snapshot.Config{Store: st, TempDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	s, err := session.Open(ctx, session.Config{Provider: p.ForProject("alpha"), ProjectID: "alpha", Snapshots: snaps,
		TTL: 10 * time.Minute, MaxLifetime: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WriteFile(ctx, "notes.txt", []byte("kept across rotations")); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := s.Rotate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if b, err := s.ReadFile(ctx, "notes.txt", 0); err != nil || string(b) != "kept across rotations" {
		t.Fatalf("after two rotations: %q %v", b, err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// Project beta: one sandbox, extended, left running.
	beta := newSandbox(t, p.ForProject("beta"), sandbox.CreateOptions{Timeout: 5 * time.Minute})
	if err := beta.SetTimeout(ctx, 20*time.Minute); err != nil {
		t.Fatal(err)
	}

	// A second host writes to the same store: its figures add up with these.
	other, err := e2b.OpenLedger(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	other.Created(ctx, e2b.Record{ID: "otherhost00000000000", Project: "beta", Template: "base", CPUs: 8,
		StartedAt: now.Add(-time.Second), EndAt: now.Add(time.Hour)}, e2b.Plan{}, slog.New(slog.DiscardHandler))
	closedAt := now.Add(-time.Second / 2)
	other.Closed(ctx, "otherhost00000000000", closedAt, slog.New(slog.DiscardHandler))

	u, err := e2b.QuotaReport(ctx, dataDir, cfg.Plan, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	today := time.Now().UTC().Format(time.DateOnly)
	if u.Creations != 5 || len(u.Days) != 2 {
		t.Fatalf("usage: %+v", u)
	}
	for _, d := range u.Days {
		wantN := map[string]int{"alpha": 3, "beta": 2}[d.Project]
		if d.Day != today || d.Creations != wantN || d.CPUMinutes <= 0 {
			t.Errorf("day %+v: want %d creations today, some CPU minutes", d, wantN)
		}
	}
	if u.Running != 1 {
		t.Errorf("running %d, want beta's sandbox", u.Running)
	}
	// The other host's sandbox: 0.5 s at 8 CPUs.
	if beta := u.Days[1].CPUMinutes; beta < 8*0.5/60 || math.IsNaN(beta) {
		t.Errorf("beta's CPU minutes %.4f miss the other host's", beta)
	}
	var text bytes.Buffer
	if err := u.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"sandboxes created  5", "running now        1 of 1", today, "alpha", "beta", "WARNING: creation rate", "WARNING: concurrent sandboxes"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("report does not say %q:\n%s", want, text.String())
		}
	}
	if strings.Contains(text.String(), "WARNING: monthly") {
		t.Errorf("a warning about monthly minutes, far from the limit:\n%s", text.String())
	}
	t.Logf("toolhost quota:\n%s", text.String())
	// The provider warned in its log when it created past the marks.
	if !strings.Contains(logs.String(), "E2B quota: creation rate") {
		t.Errorf("no creation-rate warning logged:\n%s", logs.String())
	}
	// The monthly figure warns when near.
	cfg.Plan.MonthlyCPUMinutes = u.CPUMinutes
	if u, _ := e2b.QuotaReport(ctx, dataDir, cfg.Plan, time.Now()); len(u.Warnings) == 0 || !strings.Contains(strings.Join(u.Warnings, ";"), "monthly minutes") {
		t.Errorf("no monthly warning at the limit: %v", u.Warnings)
	}
	// Another month has nothing.
	if u, _ := e2b.QuotaReport(ctx, dataDir, cfg.Plan, time.Now().AddDate(0, 2, 0)); u.Creations != 0 {
		t.Errorf("two months on: %+v", u)
	}
}
