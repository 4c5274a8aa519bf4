//go:build linux

package session_test

import (
	"context"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/session"
)

// BenchmarkRotationPause: how long a rotation holds up the agent. A caller runs `true` in
// the session back to back while the session rotates (save, move the work, restart the
// background server, swap); pause-ms is the longest of its calls that overlapped the
// rotation, call-ms the median of the calls around it (a warm `bash true`, the floor),
// pause/call their ratio, all from the same run. The workspace is 50 MB of 2,000 text
// files with one background HTTP server. handoff: the local provider hands the workspace
// over (the save runs ahead, while calls go on); with spares, the next sandbox is taken
// from the provider's pool; restore (RestoreOnRotate, what a remote provider does): the
// new sandbox is restored from the snapshot. ms/server_back is the time from the start of
// the rotation until the restarted server answers again through the session's preview
// (what a take_screenshot right after a rotation waits for). held-ms is the median of the
// part of each rotation during which no call can run (the session's own "pause" in its
// "session: rotated" log line: after a save ahead, the move and the restart), and
// blocked/call is (held + call) / call: the most a call that arrives at the rotation's
// start waits, over the floor. pause-ms is larger than held + call when calls during the
// save ahead are slowed by the save's compression on the same cores.
//
//	go test -run '^$' -bench RotationPause -benchtime 5x -count 3 ./internal/session
func BenchmarkRotationPause(b *testing.B) {
	for _, c := range []struct {
		name    string
		restore bool
		pool    int
	}{{"handoff", false, 0}, {"handoff_spare", false, 1}, {"restore", true, 0}} {
		b.Run(c.name, func(b *testing.B) { benchRotation(b, c.restore, c.pool) })
	}
}

func benchRotation(b *testing.B, restore bool, pool int) {
	p := provider(b, pool)
	p.Warm(sandbox.CreateOptions{})
	held := &heldLog{}
	s := open(b, session.Config{Provider: p, ProjectID: "pause", Snapshots: snapshots(b), TTL: time.Hour,
		RestoreOnRotate: restore, Logger: slog.New(held)})
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
	b.Run("call_on_rotation", func(b *testing.B) {
		var back time.Duration
		var pauses, calls []time.Duration
		for b.Loop() {
			b.StopTimer()
			answers()
			s.Notice()
			b.StartTimer()
			stop := make(chan struct{})
			var during, around []time.Duration
			var rotating atomic.Bool
			var callErr error
			done := make(chan struct{})
			go func() { // owned by this iteration: ends when stop is closed
				defer close(done)
				for {
					select {
					case <-stop:
						return
					default:
					}
					overlapped := rotating.Load()
					t0 := time.Now()
					if _, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil {
						callErr = err
						return
					}
					d := time.Since(t0)
					if overlapped || rotating.Load() {
						during = append(during, d)
					} else {
						around = append(around, d)
					}
				}
			}()
			time.Sleep(20 * time.Millisecond) // calls before the rotation
			start := time.Now()
			rotating.Store(true)
			if err := s.Rotate(ctx); err != nil {
				b.Fatal(err)
			}
			rotating.Store(false)
			time.Sleep(20 * time.Millisecond) // calls after it
			close(stop)
			<-done
			if callErr != nil {
				b.Fatal(callErr)
			}
			b.StopTimer()
			answers()
			back += time.Since(start)
			b.StartTimer()
			if len(during) > 0 {
				pauses = append(pauses, slices.Max(during))
			}
			calls = append(calls, around...)
		}
		slices.Sort(pauses)
		slices.Sort(calls)
		if len(pauses) > 0 && len(calls) > 0 {
			pause, call := pauses[len(pauses)/2], calls[len(calls)/2]
			b.ReportMetric(float64(pause.Microseconds())/1000, "pause-ms")
			b.ReportMetric(float64(call.Microseconds())/1000, "call-ms")
			b.ReportMetric(float64(pause)/float64(call), "pause/call")
			if h := held.median(); h > 0 {
				b.ReportMetric(float64(h.Microseconds())/1000, "held-ms")
				b.ReportMetric(float64(h+call)/float64(call), "blocked/call")
			}
		}
		b.ReportMetric(float64(back.Milliseconds())/float64(b.N), "ms/server_back")
	})
}

// heldLog keeps the "pause" of every "session: rotated" record: how long the rotation held
// the session (the calls) itself.
type heldLog struct {
	mu   sync.Mutex
	held []time.Duration
}

func (h *heldLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *heldLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *heldLog) WithGroup(string) slog.Handler            { return h }

func (h *heldLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "session: rotated" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "pause" {
			h.mu.Lock()
			h.held = append(h.held, a.Value.Duration())
			h.mu.Unlock()
			return false
		}
		return true
	})
	return nil
}

func (h *heldLog) median() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.held) == 0 {
		return 0
	}
	d := slices.Clone(h.held)
	slices.Sort(d)
	return d[len(d)/2]
}
