package host_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"image"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/image/webp"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/screenshot"
	"github.com/toolhost/toolhost/core/session"
	"github.com/toolhost/toolhost/core/snapshot"
	"github.com/toolhost/toolhost/core/store/dir"
	"github.com/toolhost/toolhost/host"
)

const page = `<!doctype html><html><head><style>html,body{margin:0;height:100%;background:#3366cc}</style></head>
<body><h1 style="color:#fff;font:40px sans-serif">toolhost</h1></body></html>`

// busy never lets the network go idle: a request every 100 ms.
const busy = `<!doctype html><html><body style="background:#00aa00">
<script>setInterval(()=>fetch('/index.html?'+Math.random()),100)</script></body></html>`

type shotEnv struct {
	*env
	rec  *screenshot.Recorder
	cap  *screenshot.Capturer
	sess *session.Session
}

func newShotEnv(t *testing.T) *shotEnv {
	t.Helper()
	return newShotEnvWith(t, false)
}

// newShotEnvWith makes a session whose rotations restore the snapshot (restore) or hand
// the workspace over.
func newShotEnvWith(t *testing.T, restore bool) *shotEnv {
	t.Helper()
	capt := screenshot.New(screenshot.Config{IdleBound: 2 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err := capt.Check(); err != nil {
		t.Skipf("no browser to capture with (make test installs Chromium and the driver): %v", err)
	}
	t.Cleanup(func() { capt.Close(context.Background()) })
	st, err := dir.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	snaps, err := snapshot.New(snapshot.Config{Store: st, TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	rec := &screenshot.Recorder{Capturer: capt, Store: st}
	sess, err := session.Open(context.Background(), session.Config{
		Provider: newProvider(t), ProjectID: "shots", Snapshots: snaps, Screenshots: rec, RestoreOnRotate: restore,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sess.Close(context.Background()) })
	h, err := host.New(context.Background(), host.Config{DataDir: e2eDataDir, Plugins: builtins(t), Screenshots: rec, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(context.Background()) })
	return &shotEnv{env: &env{t: t, s: h.OpenSession(sess, host.WithProject("shots"))}, rec: rec, cap: capt, sess: sess}
}

func decode(t *testing.T, c abi.Content) image.Image {
	t.Helper()
	if c.Type != abi.ContentImage || c.Source == nil || c.Source.MediaType != "image/webp" {
		t.Fatalf("block is not a WebP image: %+v", c)
	}
	raw, err := base64.StdEncoding.DecodeString(c.Source.Data)
	if err != nil {
		t.Fatal(err)
	}
	img, err := webp.Decode(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("WebP does not decode: %v", err)
	}
	return img
}

func near(a, b uint32) bool { return a>>8 >= b-8 && a>>8 <= b+8 }

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestTakeScreenshotOfSandboxDevServer(t *testing.T) {
	e := newShotEnv(t)
	ctx := context.Background()
	e.expect("write_file", `{"path":"site/index.html","content":`+quote(page)+`}`, false)
	e.expect("write_file", `{"path":"site/busy.html","content":`+quote(busy)+`}`, false)
	e.expect("bash", `{"command":"cd site && exec python3 -m http.server 8000","background":true}`, false, "Started in background")
	waitFor(t, "the session to see the dev server", func() bool { return e.sess.DevServerPort() == 8000 })

	// Auto-capture fires when the dev server starts listening.
	waitFor(t, "an auto-capture after the dev server started", func() bool {
		l, _ := e.rec.List(ctx, "shots", screenshot.KindAuto)
		return len(l) >= 2
	})

	pid := 0
	for i := range 2 { // twice: the browser is reused
		res := e.call("take_screenshot", `{}`)
		if res.IsError || len(res.Content) != 3 {
			t.Fatalf("take_screenshot: %+v", res)
		}
		desk, mob := decode(t, res.Content[0]), decode(t, res.Content[1])
		if b := desk.Bounds(); b.Dx() != 1280 || b.Dy() != 800 {
			t.Errorf("desktop is %v, want 1280x800", b)
		}
		if b := mob.Bounds(); b.Dx() != 390 || b.Dy() != 844 {
			t.Errorf("mobile is %v, want 390x844", b)
		}
		for _, img := range []image.Image{desk, mob} {
			r, g, b, _ := img.At(img.Bounds().Dx()-5, img.Bounds().Dy()-5).RGBA()
			if !near(r, 0x33) || !near(g, 0x66) || !near(b, 0xcc) {
				t.Errorf("pixel is %02x%02x%02x, want the page's 3366cc", r>>8, g>>8, b>>8)
			}
		}
		note := res.Content[2].Text
		for _, want := range []string{"desktop 1280x800", "mobile 390x844", "on port 8000", "stored at ", "screenshots/shots/agent/"} {
			if !strings.Contains(note, want) {
				t.Errorf("note %q does not say %q", note, want)
			}
		}
		if i == 0 {
			pid = e.cap.BrowserPID()
		} else if e.cap.BrowserPID() != pid || pid == 0 {
			t.Errorf("browser pid %d then %d: not reused", pid, e.cap.BrowserPID())
		}
	}
	if l, _ := e.rec.List(ctx, "shots", screenshot.KindAgent); len(l) != 4 {
		t.Errorf("%d agent captures stored, want 4 (two pairs)", len(l))
	}

	// A commit captures on its own too.
	before, _ := e.rec.List(ctx, "shots", screenshot.KindAuto)
	if _, err := e.sess.Commit(ctx, "phase 1"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "an auto-capture after the commit", func() bool {
		l, _ := e.rec.List(ctx, "shots", screenshot.KindAuto)
		return len(l) >= len(before)+2
	})

	// A page that never goes idle is shot at the bound, and the result says so.
	res := e.call("take_screenshot", `{"port":8000,"path":"/busy.html"}`)
	if res.IsError || !strings.Contains(res.Content[2].Text, "still loading") {
		t.Errorf("busy page: %q", resultText(res))
	}
	// A 404 page is captured and its status reported.
	res = e.call("take_screenshot", `{"path":"/missing.html"}`)
	if res.IsError || !strings.Contains(res.Content[2].Text, "HTTP 404") {
		t.Errorf("missing page: %q", resultText(res))
	}

	if pid := e.cap.BrowserPID(); pid != 0 {
		e.cap.Close(ctx)
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
			t.Errorf("browser %d still runs after Close", pid)
		}
	}
}

// A background HTTP server started through bash answers and is screenshotted after each
// of three rotations, on both paths, with nothing done by the agent: the session restarts
// the server, take_screenshot waits for it to listen again, the first result after each
// rotation says what was restarted, and the session's own capture of the dev server
// re-arms.
func TestScreenshotAfterThreeRotations(t *testing.T) {
	for _, restore := range []bool{false, true} {
		t.Run(map[bool]string{false: "handoff", true: "restore"}[restore], func(t *testing.T) {
			e := newShotEnvWith(t, restore)
			ctx := context.Background()
			e.expect("write_file", `{"path":"site/index.html","content":`+quote(page)+`}`, false)
			e.expect("bash", `{"command":"cd site && exec python3 -m http.server 8000","background":true}`, false, "Started in background")
			waitFor(t, "the session to see the dev server", func() bool { return e.sess.DevServerPort() == 8000 })
			autos := func() int { l, _ := e.rec.List(ctx, "shots", screenshot.KindAuto); return len(l) }
			waitFor(t, "the first auto-capture", func() bool { return autos() >= 2 })
			for r := 1; r <= 3; r++ {
				before := autos()
				if err := e.sess.Rotate(ctx); err != nil {
					t.Fatal(err)
				}
				res := e.call("take_screenshot", `{}`)
				if res.IsError || len(res.Content) != 4 {
					t.Fatalf("rotation %d: take_screenshot: %q", r, resultText(res))
				}
				for _, img := range []image.Image{decode(t, res.Content[0]), decode(t, res.Content[1])} {
					r, g, b, _ := img.At(img.Bounds().Dx()-5, img.Bounds().Dy()-5).RGBA()
					if !near(r, 0x33) || !near(g, 0x66) || !near(b, 0xcc) {
						t.Errorf("pixel is %02x%02x%02x, want the page's 3366cc", r>>8, g>>8, b>>8)
					}
				}
				if n := res.Content[3].Text; !strings.Contains(n, "were restarted") || !strings.Contains(n, "python3 -m http.server 8000") {
					t.Errorf("rotation %d: notice %q", r, n)
				}
				e.expect("bash", `{"command":"python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8000/').status)\""}`, false, "200\n")
				waitFor(t, "an auto-capture after the rotation", func() bool { return autos() >= before+2 })
			}
			if e.sess.Rotations() != 3 {
				t.Errorf("%d rotations", e.sess.Rotations())
			}
		})
	}
}

func TestTakeScreenshotRefusals(t *testing.T) {
	e := newShotEnv(t)
	e.expect("take_screenshot", `{}`, true, "no port given and no dev server seen")
	e.expect("take_screenshot", `{"port":8001}`, true, "connection refused", "8001")
	e.expect("take_screenshot", `{"port":0}`, true, "invalid input")

	// A port the host listens on is not the sandbox's: it cannot be aimed at.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	hostPort := ln.Addr().(*net.TCPAddr).Port
	e.expect("take_screenshot", `{"port":`+strconv.Itoa(hostPort)+`}`, true, "connection refused")

	e.expect("write_file", `{"path":"index.html","content":"<p>hi</p>"}`, false)
	e.expect("bash", `{"command":"exec python3 -m http.server 8002","background":true}`, false)
	waitFor(t, "the dev server", func() bool { return e.sess.DevServerPort() == 8002 })
	for _, path := range []string{"//evil.example/", "@evil.example", `\\evil.example\x`, "http://evil.example/", "/\\evil.example", "javascript:alert(1)"} {
		in, _ := json.Marshal(map[string]string{"path": path})
		e.expect("take_screenshot", string(in), true, "Error: could not take the screenshot")
	}
}

func quote(s string) string { b, _ := json.Marshal(s); return string(b) }
