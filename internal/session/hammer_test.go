//go:build linux

package session_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolhost/toolhost/internal/session"
	"github.com/toolhost/toolhost/internal/testenv"
)

// hammerSwaps is how many rotations TestRotationHammer takes each path through: a
// hundred by default (a path took 25-45 s at load 16-25 on two cores, 23-42 s under -race
// at load 8-12), more for a soak with TOOLHOST_ROTATION_SWAPS=N (400 took 95-105 s).
func hammerSwaps(t *testing.T) int {
	v := os.Getenv("TOOLHOST_ROTATION_SWAPS")
	if v == "" {
		return 100
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("TOOLHOST_ROTATION_SWAPS=%q: want a positive number", v)
	}
	return n
}

// TestRotationHammer: several agents' worth of tool calls (write_file, read_file, and
// bash commands that write and list) through the real plugins, from goroutines at once,
// across a hundred rotations of sandboxes that live four minutes on a fake clock, on both
// paths (the workspace handed over; a snapshot restored, a remote provider's way). Every
// call must succeed, every file must be there with its contents at the end, and no
// sandbox may reach its end under the session.
//
// Time moves only when a call has returned (each worker moves the clock a step after
// each of its rounds), so however slowly this machine rotates, the clock cannot run past
// a sandbox's end unless the session lets calls run on a sandbox it is about to leave:
// with W workers, at most W steps pass once the session stops admitting calls to it (the
// last call), and W steps are less than both LastCallMargin and the time from the start
// of a rotation to its last call.
func TestRotationHammer(t *testing.T) {
	swaps := hammerSwaps(t)
	for _, restore := range []bool{false, true} {
		t.Run(map[bool]string{false: "handoff", true: "restore"}[restore], func(t *testing.T) {
			testHammer(t, restore, swaps)
		})
	}
}

func testHammer(t *testing.T, restore bool, swaps int) {
	const (
		workers = 4
		step    = 15 * time.Second
		ttl     = 4 * time.Minute
		margin  = 3 * time.Minute
		last    = 90 * time.Second
	)
	if workers*step >= last || workers*step >= margin-last {
		t.Fatal("the clock's steps must be small beside the margins (see the test's doc)")
	}
	c := newClocked(t, ttl)
	s := open(t, c.config(session.Config{
		ProjectID: "hammer", Snapshots: snapshots(t),
		TTL: ttl, MaxLifetime: ttl, KeepaliveMargin: margin, LastCallMargin: last,
		RetryInterval: 10 * time.Second, RestoreOnRotate: restore,
	}))
	hs := toolHost(t).OpenSession(s)
	ctx := context.Background()
	start := time.Now()

	var (
		mu      sync.Mutex
		want    = map[string]string{} // every file written, by path
		failure string
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if failure == "" {
			failure = fmt.Sprintf(format, args...)
		}
	}
	failed := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return failure != ""
	}
	call := func(tool string, args map[string]string) (string, bool) {
		in, _ := json.Marshal(args)
		rot := s.Rotations()
		res, err := hs.Dispatch(ctx, tool, in)
		if err != nil || res.IsError {
			fail("%s %v (rotation %d): %q %v", tool, args, rot, testenv.ResultText(res), err)
			return "", false
		}
		return testenv.ResultText(res), true
	}
	maxRounds := swaps * 40 // a rotation comes every 4 to 6 steps; far more rounds means none came
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			dir := fmt.Sprintf("w%d", w)
			mine := []string{}
			for i := 0; s.Rotations() < swaps && !failed(); i++ {
				if i == maxRounds {
					fail("worker %d: only %d rotations after %d rounds", w, s.Rotations(), i)
					return
				}
				name := fmt.Sprintf("%s/f%05d.txt", dir, i)
				content := fmt.Sprintf("worker %d round %d at %s\n", w, i, c.clock.Now().Format(time.RFC3339Nano))
				if i%3 == 2 {
					// A command that writes: it must run once, on a live sandbox.
					out, ok := call("bash", map[string]string{"command": fmt.Sprintf("echo '%s' > %s && ls %s | wc -l", strings.TrimSuffix(content, "\n"), name, dir)})
					if !ok {
						return
					}
					if !strings.Contains(out, fmt.Sprintf("\n%d\n", len(mine)+1)) {
						fail("worker %d round %d: bash sees the wrong files: %q", w, i, out)
						return
					}
				} else if _, ok := call("write_file", map[string]string{"path": name, "content": content}); !ok {
					return
				}
				mine = append(mine, name)
				mu.Lock()
				want[name] = content
				mu.Unlock()
				// Read back a file of this worker's, the one just written or an older one.
				back := mine[(i*7)%len(mine)]
				mu.Lock()
				wantBack := want[back]
				mu.Unlock()
				out, ok := call("read_file", map[string]string{"path": back})
				if !ok {
					return
				}
				if !strings.Contains(out, strings.TrimSuffix(wantBack, "\n")) {
					fail("worker %d round %d: %s reads %q, want %q", w, i, back, out, wantBack)
					return
				}
				c.clock.Advance(step)
			}
		})
	}
	wg.Wait()
	if failure != "" {
		t.Fatalf("%s\nafter %d rotations; the session's log:\n%s", failure, s.Rotations(), c.logs)
	}

	// Every file, with its contents: one digest over all of them, computed in the sandbox.
	var b strings.Builder
	for _, name := range slices.Sorted(maps.Keys(want)) {
		b.WriteString(name + "\n" + want[name])
	}
	sum := sha256.Sum256([]byte(b.String()))
	out, ok := call("bash", map[string]string{"command": "for f in $(ls -d w*/* | LC_ALL=C sort); do echo \"$f\"; cat \"$f\"; done | sha256sum; ls -d w*/* | wc -l"})
	if !ok {
		t.Fatal(failure)
	}
	if !strings.Contains(out, hex.EncodeToString(sum[:])) || !strings.Contains(out, fmt.Sprintf("\n%d\n", len(want))) {
		t.Fatalf("after %d rotations the workspace does not hold the %d files written: %q", s.Rotations(), len(want), out)
	}
	for _, sb := range c.provider.Sandboxes() {
		if sb.Expired() {
			t.Errorf("sandbox %s reached its end before the session moved on", sb.ID())
		}
	}
	if l := c.logs.String(); strings.Contains(l, "reported closed") || strings.Contains(l, "ended before it was saved") || strings.Contains(l, "ended on its own") {
		t.Errorf("a sandbox ended under the session:\n%s", l)
	}
	t.Logf("%d files written by %d workers across %d rotations in %s", len(want), workers, s.Rotations(), time.Since(start).Round(time.Millisecond))
}
