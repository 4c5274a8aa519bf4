package session_test

import (
	"context"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/core/session"
)

// BenchmarkRotationPause: a call that lands on a rotation waits for it; this measures a
// forced rotation (save, create, restore, swap) plus the call, for a 50 MB workspace of
// 2,000 text files. BenchmarkCallNoRotation is the same call without one.
func BenchmarkRotationPause(b *testing.B) {
	for _, restore := range []bool{false, true} {
		b.Run(map[bool]string{false: "handoff", true: "restore"}[restore], func(b *testing.B) {
			benchRotation(b, restore)
		})
	}
}

func benchRotation(b *testing.B, restore bool) {
	s := open(b, session.Config{Provider: provider(b), ProjectID: "pause", Snapshots: snapshots(b), TTL: time.Hour,
		RestoreOnRotate: restore})
	ctx := context.Background()
	// 37 MiB of random bytes as base64 lines: 50 MB of text that compresses like source.
	res, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"bash", "-c",
		"mkdir -p src && cd src && head -c 38797312 /dev/urandom | base64 -w 100 | split -b 25000 -a 4 - f_ && du -sb . | cut -f1"},
		Timeout: 5 * time.Minute})
	if err != nil || res.ExitCode != 0 {
		b.Fatalf("populate: %v %s %s", err, res.Stdout, res.Stderr)
	}
	b.Logf("workspace: %s bytes", res.Stdout)
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
		for b.Loop() {
			if err := s.Rotate(ctx); err != nil {
				b.Fatal(err)
			}
			call()
		}
	})
}
