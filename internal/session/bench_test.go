//go:build linux

package session_test

import (
	"context"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/session"
)

// BenchmarkRotationPause: a call that lands on a rotation waits for it; this measures a
// forced rotation (save, new sandbox, move the work, restart the background server, swap)
// plus the call, for a 50 MB workspace of 2,000 text files with one background HTTP
// server. BenchmarkCallNoRotation is the same call without one. ms/server_back is the
// time from the start of the rotation until the restarted server answers again through
// the session's preview (what a take_screenshot right after a rotation waits for).
func BenchmarkRotationPause(b *testing.B) {
	for _, restore := range []bool{false, true} {
		b.Run(map[bool]string{false: "handoff", true: "restore"}[restore], func(b *testing.B) {
			benchRotation(b, restore)
		})
	}
}

func benchRotation(b *testing.B, restore bool) {
	s := open(b, session.Config{Provider: provider(b), ProjectID: "pause", Snapshots: snapshots(b), TTL: time.Hour,
		RestoreOnRotate: restore, Logger: slog.New(slog.DiscardHandler)})
	ctx := context.Background()
	// 37 MiB of random bytes as base64 lines: 50 MB of text that compresses like source.
	res, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"bash", "-c",
		"mkdir -p src && cd src && head -c 38797312 /dev/urandom | base64 -w 100 | split -b 25000 -a 4 - f_ && echo '<h1>up</h1>' > index.html && du -sb . | cut -f1"},
		Timeout: 5 * time.Minute})
	if err != nil || res.ExitCode != 0 {
		b.Fatalf("populate: %v %s %s", err, res.Stdout, res.Stderr)
	}
	b.Logf("workspace: %s bytes", res.Stdout)
	if _, err := s.Start(ctx, sandbox.ExecRequest{Argv: []string{"bash", "-c", "cd src && exec python3 -m http.server 8000 --bind 127.0.0.1"}}); err != nil {
		b.Fatal(err)
	}
	answers := func() {
		deadline := time.Now().Add(30 * time.Second)
		for {
			u, err := s.PreviewURL(ctx, 8000) // waits for a restarted server to listen
			if err == nil {
				resp, gerr := http.Get(u.String() + "/index.html")
				if gerr == nil {
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						return
					}
				}
				err = gerr
			}
			if time.Now().After(deadline) {
				b.Fatalf("the server does not answer: %v", err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	answers()
	call := func() {
		if _, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("call", func(b *testing.B) {
		for b.Loop() {
			call()
		}
	})
	b.Run("call_on_rotation", func(b *testing.B) {
		var back time.Duration
		n := 0
		for b.Loop() {
			start := time.Now()
			if err := s.Rotate(ctx); err != nil {
				b.Fatal(err)
			}
			call()
			b.StopTimer()
			answers()
			back += time.Since(start)
			n++
			s.Notice()
			b.StartTimer()
		}
		b.ReportMetric(float64(back.Milliseconds())/float64(n), "ms/server_back")
	})
}
