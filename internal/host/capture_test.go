package host_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/host"
	"github.com/toolhost/toolhost/internal/memsandbox"
	"github.com/toolhost/toolhost/internal/testenv"
	"github.com/toolhost/toolhost/internal/testplugins"
)

// fakeCapturer stands for the browser: it records what the host asked for and answers
// with two small images, or with err.
type fakeCapturer struct {
	mu    sync.Mutex
	bases []string
	paths []string
	err   error
	// unreachable: bases that answer as a sandbox that has gone would (ErrCaptureUnreachable).
	unreachable map[string]bool
	// urlBase, when set, stands for the stores' URLs ("https://cdn.example/" otherwise);
	// storeErr, for a store that failed.
	urlBase  string
	storeErr error
}

func (f *fakeCapturer) Capture(ctx context.Context, base *url.URL, pagePath, project string) (*host.Capture, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.bases, f.paths = append(f.bases, base.String()), append(f.paths, project+":"+pagePath)
	if f.err != nil {
		return nil, f.err
	}
	if f.unreachable[base.String()] {
		return nil, fmt.Errorf("%w: screenshot: connection refused", host.ErrCaptureUnreachable)
	}
	urlBase := f.urlBase
	if urlBase == "" {
		urlBase = "https://cdn.example/"
	}
	shot := func(w, h int) host.CaptureShot {
		return host.CaptureShot{Width: w, Height: h, WebP: []byte("RIFF-webp-" + fmt.Sprint(w)), Status: 200, Idle: true,
			Key: fmt.Sprintf("screenshots/%s/agent/x_%d.webp", project, w), URL: urlBase + fmt.Sprint(w)}
	}
	return &host.Capture{FinalURL: base.String() + pagePath, Desktop: shot(1280, 800), Mobile: shot(390, 844), StoreError: f.storeErr}, nil
}

// devServer is a sandbox wrapper that has seen a dev server start (as a session does);
// passthrough is a wrapper that adds nothing. The host must find the dev server through
// both.
type devServer struct {
	sandbox.Sandbox
	port int
}

func (d devServer) DevServerPort() int      { return d.port }
func (d devServer) Unwrap() sandbox.Sandbox { return d.Sandbox }

type passthrough struct{ sandbox.Sandbox }

func (p passthrough) Unwrap() sandbox.Sandbox { return p.Sandbox }

func captureHost(t *testing.T, c host.Capturer) *host.Host {
	t.Helper()
	wasm, err := testplugins.Build("plugins/screenshot")
	if err != nil {
		t.Fatal(err)
	}
	h, err := host.New(context.Background(), host.Config{DataDir: testplugins.DataDir(), Capturer: c,
		Plugins: []host.PluginSpec{{Path: wasm, Grants: []abi.Capability{abi.CapCapture}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(context.Background()) })
	return h
}

func shoot(t *testing.T, s *host.Dispatcher, input string) abi.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := s.Dispatch(ctx, "take_screenshot", json.RawMessage(input))
	if err != nil {
		t.Fatalf("take_screenshot %s: %v", input, err)
	}
	return res
}

// TestCaptureCapability: the host aims the capturer at the sandbox's own preview of the
// port (the dev server's when the plugin names none, found through wrappers), never at
// anything the plugin says, and turns what comes back into the plugin's reply.
func TestCaptureCapability(t *testing.T) {
	sb := memsandbox.New()
	t.Cleanup(func() { sb.Close(context.Background()) })
	ctx := context.Background()
	sb.Put("web/index.html", "<p>hi</p>")
	if _, err := sb.Start(ctx, sandbox.ExecRequest{Argv: []string{"python3", "-m", "http.server", "8000"}, Cwd: "web"}); err != nil {
		t.Fatal(err)
	}
	var preview *url.URL
	var err error
	if !testenv.Eventually(func() bool { preview, err = sb.PreviewURL(ctx, 8000); return err == nil }) {
		t.Fatalf("no preview: %v", err)
	}
	fc := &fakeCapturer{}
	hfc := captureHost(t, fc)
	s := hfc.OpenSession(passthrough{devServer{sb, 8000}}, host.WithProject("shop"))

	res := shoot(t, s, `{}`)
	if res.IsError || len(res.Content) != 3 || res.Content[0].Type != abi.ContentImage || res.Content[1].Type != abi.ContentImage {
		t.Fatalf("take_screenshot: %+v", res)
	}
	// The host (never the plugin) names what the call stored, for a client to read back.
	if len(res.Stored) != 2 || res.Stored[0].URI != "toolhost://store/screenshots/shop/agent/x_1280.webp" ||
		res.Stored[1].URI != "toolhost://store/screenshots/shop/agent/x_390.webp" || res.Stored[0].MIMEType != "image/webp" ||
		res.Stored[0].Size != int64(len("RIFF-webp-1280")) || res.Stored[0].Name != "x_1280.webp" {
		t.Errorf("the result's stored objects: %+v", res.Stored)
	}
	note := res.Content[2].Text
	for _, want := range []string{"on port 8000", "desktop 1280x800", "mobile 390x844", "stored at https://cdn.example/1280"} {
		if !strings.Contains(note, want) {
			t.Errorf("note %q lacks %q", note, want)
		}
	}
	shoot(t, s, `{"port":8000,"path":"/settings?tab=2"}`)
	if len(fc.bases) != 2 || fc.bases[0] != preview.String() || fc.bases[1] != preview.String() ||
		fc.paths[0] != "shop:/" || fc.paths[1] != "shop:/settings?tab=2" {
		t.Errorf("the capturer was asked for %v %v, want the preview %s of port 8000", fc.bases, fc.paths, preview)
	}

	// Nothing listens: the capturer is not even asked.
	res = shoot(t, s, `{"port":8001}`)
	if !res.IsError || !strings.Contains(testenv.ResultText(res), "nothing in the sandbox listens on port 8001") || len(fc.bases) != 2 {
		t.Errorf("a closed port: %q (%d captures)", testenv.ResultText(res), len(fc.bases))
	}
	// A failed capture reaches the model in words.
	fc.err = fmt.Errorf("%w: screenshot: connection refused (is the dev server running?)", host.ErrCaptureUnreachable)
	res = shoot(t, s, `{"port":8000}`)
	if !res.IsError || !strings.Contains(testenv.ResultText(res), "is the dev server running?") {
		t.Errorf("a failed capture: %q", testenv.ResultText(res))
	}

	// Without a dev server and without a port there is nothing to aim at.
	s = captureHost(t, fc).OpenSession(sb)
	if res := shoot(t, s, `{}`); !res.IsError || !strings.Contains(testenv.ResultText(res), "no port given and no dev server seen") {
		t.Errorf("no port: %q", testenv.ResultText(res))
	}
	// Without a capturer, captures say so.
	s = captureHost(t, nil).OpenSession(sb)
	if res := shoot(t, s, `{"port":8000}`); !res.IsError || !strings.Contains(testenv.ResultText(res), "no browser configured") {
		t.Errorf("no capturer: %q", testenv.ResultText(res))
	}
	// A session's own capturer (WithCapturer: one that stores through the session's
	// fenced store) takes its captures instead of the host's.
	own := &fakeCapturer{}
	before := len(fc.bases)
	s = hfc.OpenSession(sb, host.WithProject("shop"), host.WithCapturer(own))
	if res := shoot(t, s, `{"port":8000}`); res.IsError || len(own.bases) != 1 || len(fc.bases) != before {
		t.Errorf("with the session's capturer: %q (session's %d captures, host's %d more)", testenv.ResultText(res), len(own.bases), len(fc.bases)-before)
	}
}

// rotating is a session's view of a sandbox replaced after every preview it hands out:
// each PreviewURL is a new origin, the way a rotation gives the new sandbox its own.
type rotating struct {
	sandbox.Sandbox
	mu sync.Mutex
	n  int
}

func (r *rotating) PreviewURL(ctx context.Context, port int) (*url.URL, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	return url.Parse(fmt.Sprintf("http://127.0.0.1:%d/", 40000+r.n))
}

// TestCaptureStraddlingARotation: a preview that went away with its sandbox while the page
// was fetched is shot again in the sandbox that replaced it, a bounded number of times.
func TestCaptureStraddlingARotation(t *testing.T) {
	sb := memsandbox.New()
	t.Cleanup(func() { sb.Close(context.Background()) })
	fc := &fakeCapturer{unreachable: map[string]bool{"http://127.0.0.1:40001/": true}}
	s := captureHost(t, fc).OpenSession(&rotating{Sandbox: sb})
	res := shoot(t, s, `{"port":8000}`)
	if res.IsError || len(fc.bases) != 2 || fc.bases[1] != "http://127.0.0.1:40002/" {
		t.Fatalf("take_screenshot across a rotation: %q after captures of %v", testenv.ResultText(res), fc.bases)
	}
	// A sandbox replaced under every capture: the first and three more, then the error.
	fc.bases = nil
	for n := 3; n <= 6; n++ {
		fc.unreachable[fmt.Sprintf("http://127.0.0.1:%d/", 40000+n)] = true
	}
	if res := shoot(t, s, `{"port":8000}`); !res.IsError || len(fc.bases) != 4 || !strings.Contains(testenv.ResultText(res), "connection refused") {
		t.Errorf("previews refused four times: %q after captures of %v", testenv.ResultText(res), fc.bases)
	}
}

// A directory store's "URL" is the image's path on the host, and a store's error may name
// host paths: neither reaches the model's result.
func TestCaptureResultHasNoHostPath(t *testing.T) {
	sb := memsandbox.New()
	t.Cleanup(func() { sb.Close(context.Background()) })
	ctx := context.Background()
	sb.Put("index.html", "<p>hi</p>")
	if _, err := sb.Start(ctx, sandbox.ExecRequest{Argv: []string{"python3", "-m", "http.server", "8000"}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := sb.PreviewURL(ctx, 8000); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no preview of port 8000")
		}
		time.Sleep(20 * time.Millisecond)
	}
	const hostDir = "/var/lib/toolhost-secret-layout/store/data/"
	fc := &fakeCapturer{urlBase: hostDir}
	s := captureHost(t, fc).OpenSession(devServer{sb, 8000}, host.WithProject("shop"))
	res := shoot(t, s, `{"port":8000}`)
	if res.IsError || len(res.Content) != 3 {
		t.Fatalf("take_screenshot: %+v", res)
	}
	if txt := testenv.ResultText(res); strings.Contains(txt, hostDir) || strings.Contains(txt, "stored at") {
		t.Errorf("the result names a host path: %q", txt)
	}
	fc.storeErr = fmt.Errorf("open %sx.webp: permission denied", hostDir)
	res = shoot(t, s, `{"port":8000}`)
	if txt := testenv.ResultText(res); strings.Contains(txt, hostDir) {
		t.Errorf("the result names a host path: %q", txt)
	}
	if len(res.Stored) != 0 {
		t.Errorf("a store that failed, and the result links what it stored: %+v", res.Stored)
	}
}
