//go:build linux

package e2b_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"golang.org/x/image/webp"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/capture"
	"github.com/toolhost/toolhost/internal/host"
	"github.com/toolhost/toolhost/internal/sandbox/e2b"
	"github.com/toolhost/toolhost/internal/sandbox/e2b/e2bfake"
	"github.com/toolhost/toolhost/internal/screenshot"
	"github.com/toolhost/toolhost/internal/session"
	"github.com/toolhost/toolhost/internal/snapshot"
	"github.com/toolhost/toolhost/internal/store/dir"
	"github.com/toolhost/toolhost/internal/testenv"
	"github.com/toolhost/toolhost/internal/testplugins"
)

// A session on E2B through three rotations, with a dev server in the background and a
// screenshot after each. E2B sandboxes cannot outlive the plan's maximum (here 30 s), and
// a remote provider cannot hand a workspace over, so every rotation saves a snapshot,
// creates a new sandbox and restores the snapshot into it. Every file written survives;
// the dev server, which the session restarts in each new sandbox, serves the restored
// page after each rotation.
//
// The plan's lifetime is the session's whole time scale: each sandbox rotates once it has
// less than the 12 s keepalive margin left, so a rotation, and a screenshot taken right
// after one, have about 18 s before the next. Shorter plans (12 s with a 5 s margin) were
// not enough under -race on a machine that runs other suites at once: a pack of the
// workspace took 2 s, a capture 11 s, a sandbox ended before its save and a capture
// straddled the next rotation. Under a heavier load still (32 and more on 2 cores) one call
// can outlast a sandbox's whole remaining life (a capture took 87 s): the sandbox ends
// under that call, nothing can rotate it meanwhile, and the session recovers from the
// last snapshot and says that later changes are lost. That is the honest outcome, and the
// test accepts it only when the session said so (and counts it); a file lost without that
// note fails.
func TestSessionRotatesOnE2B(t *testing.T) {
	needPython(t)
	capt := capturer(t)
	f := startFake(t, byHost, e2bfake.Config{})
	cfg := providerConfig(t, f, byHost)
	const life = 30 * time.Second
	cfg.Plan = e2b.Plan{Name: "test", MaxLifetime: life}
	ledger := e2b.NewLedger(mustDir(t), "")
	cfg.Quota = ledger
	p := newProvider(t, cfg)

	st := mustDir(t)
	snaps, err := snapshot.New(snapshot.Config{Store: st, TempDir: t.TempDir(), Backoff: 10 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	rec := &screenshot.Recorder{Capturer: capt, Store: st, Logger: slog.New(slog.DiscardHandler)}
	ctx := context.Background()
	if err := capt.Start(ctx); err != nil { // the browser runs before any sandbox does
		t.Fatal(err)
	}
	s, err := session.Open(ctx, session.Config{
		Provider: p.ForProject("rotating"), ProjectID: "rotating", Snapshots: snaps, Screenshots: capture.Of(rec),
		TTL: life, MaxLifetime: life, KeepaliveMargin: 12 * time.Second,
		RetryInterval: 100 * time.Millisecond, Logger: testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	h, err := host.New(ctx, host.Config{DataDir: testplugins.DataDir(), Plugins: builtins(t), Capturer: capture.Of(rec), Store: st})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(context.Background()) })
	e := &toolEnv{t: t, s: h.OpenSession(s, host.WithProject("rotating"))}

	page := `<!doctype html><body style="margin:0;background:#3366cc"><h1>rotation</h1></body>`
	in, _ := json.Marshal(map[string]string{"path": "site/index.html", "content": page})
	e.expect("write_file", string(in), false)
	e.expect("bash", `{"command":"cd site && exec python3 -m http.server 8000","background":true}`, false, "Started in background")
	// The server listens before the loop looks for rotations: one restarts what ran, but
	// a screenshot waits only for ports that were listening.
	e.expect("bash", `{"command":"for i in $(seq 1 300); do (exec 3<>/dev/tcp/127.0.0.1/8000) 2>/dev/null && exit 0; sleep 0.1; done; exit 1"}`, false, "[exit 0]")

	want := map[string]string{}
	shots := 0
	seen := s.Rotations()
	sandboxes := map[string]bool{s.SandboxID(): true}
	deadline := time.Now().Add(3 * testenv.HangBound)
	announced := 0 // sandboxes that ended under a call, with the loss said
	for i := 0; shots < 3; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("only %d rotations (%d screenshots) after %d calls", s.Rotations(), shots, i)
		}
		name := fmt.Sprintf("work/file-%03d.txt", i)
		content := fmt.Sprintf("call %d in sandbox %s\n", i, s.SandboxID())
		in, _ := json.Marshal(map[string]string{"path": name, "content": content})
		said := e.expect("write_file", string(in), false)
		res := e.call("bash", `{"command":"ls work"}`)
		got := testenv.ResultText(res)
		if res.IsError && strings.Contains(got, "was replaced") { // it ended under this very call
			said += got
			res = e.call("bash", `{"command":"ls work"}`)
			got = testenv.ResultText(res)
		}
		if res.IsError {
			t.Fatalf("call %d: bash ls: %s", i, got)
		}
		said += got
		if strings.Contains(said, "changes made since it are lost") {
			// The sandbox ended under a call longer than its remaining life, and the
			// session said so: what the snapshot had is what there is.
			announced++
			t.Logf("call %d: a sandbox ended under a call and the session said changes were lost", i)
			for n := range want {
				if !strings.Contains(got, strings.TrimPrefix(n, "work/")+"\n") {
					delete(want, n)
				}
			}
		}
		want[name] = content
		for n := range want {
			if !strings.Contains(got, strings.TrimPrefix(n, "work/")+"\n") {
				t.Fatalf("call %d (rotation %d): bash does not see %s, and no loss was said: %q", i, s.Rotations(), n, got)
			}
		}
		if c := strings.Count(got, "file-"); c != len(want) {
			t.Fatalf("call %d (rotation %d): bash sees %d files, want %d: %q", i, s.Rotations(), c, len(want), got)
		}
		if r := s.Rotations(); r != seen {
			seen = r
			sandboxes[s.SandboxID()] = true
			// The session restarted the dev server in the new sandbox (the restore path: a
			// remote provider hands nothing over), and take_screenshot waits for it.
			res := e.call("take_screenshot", `{"port":8000}`)
			if res.IsError {
				t.Fatalf("rotation %d: take_screenshot after the session restarted the dev server: %q", r, testenv.ResultText(res))
			}
			checkShot(t, res)
			shots++
		}
		time.Sleep(50 * time.Millisecond)
	}
	for name, content := range want {
		in, _ := json.Marshal(map[string]string{"path": name})
		if got := e.expect("read_file", string(in), false); !strings.Contains(got, strings.TrimSuffix(content, "\n")) {
			t.Errorf("after %d rotations %s reads %q; want %q", s.Rotations(), name, got, content)
		}
	}
	if len(sandboxes) < 4 {
		t.Errorf("%d sandboxes over %d rotations", len(sandboxes), s.Rotations())
	}
	t.Logf("%d files across %d rotations and %d sandboxes, %d screenshots; %d sandboxes ended under a call, the loss said", len(want), s.Rotations(), len(sandboxes), shots, announced)
}

func mustDir(t testing.TB) *dir.Store {
	t.Helper()
	st, err := dir.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// checkShot decodes the desktop capture and checks the page's color.
func checkShot(t *testing.T, res abi.Result) {
	t.Helper()
	if len(res.Content) < 3 || res.Content[0].Source == nil { // a fourth block may be the session's notice
		t.Fatalf("take_screenshot: %+v", res.Content)
	}
	raw, err := base64.StdEncoding.DecodeString(res.Content[0].Source.Data)
	if err != nil {
		t.Fatal(err)
	}
	img, err := webp.Decode(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	r, g, b, _ := img.At(1200, 700).RGBA()
	if r>>8 > 0x3b || r>>8 < 0x2b || g>>8 < 0x5e || g>>8 > 0x6e || b>>8 < 0xc4 || b>>8 > 0xd4 {
		t.Errorf("pixel %02x%02x%02x, want the page's 3366cc", r>>8, g>>8, b>>8)
	}
}

// A sandbox that vanishes under a session (E2B issue #1381) is replaced: the session
// restores the newest snapshot into a new sandbox and the next calls work.
func TestSessionRecoversFromAVanishedSandbox(t *testing.T) {
	f := startFake(t, byHeader, e2bfake.Config{})
	p := newProvider(t, providerConfig(t, f, byHeader))
	snaps, err := snapshot.New(snapshot.Config{Store: mustDir(t), TempDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := session.Open(ctx, session.Config{Provider: p, ProjectID: "vanish", Snapshots: snaps,
		TTL: 10 * time.Minute, MaxLifetime: time.Hour, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	if err := s.WriteFile(ctx, "saved.txt", []byte("in the snapshot")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, "before"); err != nil {
		t.Fatal(err)
	}
	first := s.SandboxID()
	if !f.Vanish(first) {
		t.Fatal("no such sandbox")
	}
	b, err := s.ReadFile(ctx, "saved.txt", 0)
	if err != nil || string(b) != "in the snapshot" || s.SandboxID() == first {
		t.Fatalf("after the sandbox vanished: %q %v (sandbox %s, was %s)", b, err, s.SandboxID(), first)
	}
}
