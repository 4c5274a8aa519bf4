//go:build linux

package screenshot

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/base64"
	"errors"
	"fmt"
	"image"
	"image/color"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/image/webp"

	"github.com/toolhost/toolhost/internal/testenv"
)

// Tests here drive real Chromium through the real Playwright driver against pages served by
// net/http on 127.0.0.1. They skip, saying why, when scripts/setup-browser.sh has not run.

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// newCapturer returns a Capturer closed at the end of the test, or skips the test when the
// browser or the driver is not installed.
func newCapturer(t testing.TB, cfg Config) *Capturer {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	c := New(cfg)
	if err := c.Check(); err != nil {
		if errors.Is(err, ErrNoBrowser) {
			testenv.Skipf(t, "Chromium or the Playwright driver is not installed (run scripts/setup-browser.sh): %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

// serve starts an HTTP server on 127.0.0.1 for the test and returns its origin.
func serve(t testing.TB, h http.Handler) *url.URL {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	return mustURL(t, "http://"+ln.Addr().String())
}

func page(bg, body string) string {
	return `<!doctype html><html><head><meta name="viewport" content="width=device-width, initial-scale=1">
<style>html,body{margin:0;height:100%;background:` + bg + `;font-family:sans-serif}</style></head>
<body>` + body + `</body></html>`
}

func html(w http.ResponseWriter, status int, s string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, s)
}

func decode(t testing.TB, b []byte) image.Image {
	t.Helper()
	img, err := webp.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("decoding WebP (%d bytes): %v", len(b), err)
	}
	return img
}

func checkShot(t *testing.T, s Shot, vp Viewport, want color.RGBA) {
	t.Helper()
	img := decode(t, s.WebP)
	if got := img.Bounds().Size(); got.X != vp.Width || got.Y != vp.Height {
		t.Errorf("%s: image is %dx%d, want %dx%d", vp.Name, got.X, got.Y, vp.Width, vp.Height)
	}
	for _, pt := range []image.Point{{vp.Width / 2, vp.Height - 5}, {5, 5}, {vp.Width - 5, vp.Height / 2}} {
		r, g, b, _ := img.At(pt.X, pt.Y).RGBA()
		got := color.RGBA{uint8(r >> 8), uint8(g >> 8), uint8(b >> 8), 255}
		if got != want {
			t.Errorf("%s: pixel %v is %v, want %v", vp.Name, pt, got, want)
		}
	}
	if s.PNGBytes <= 0 || len(s.WebP) == 0 {
		t.Errorf("%s: PNG %d bytes, WebP %d bytes", vp.Name, s.PNGBytes, len(s.WebP))
	}
}

// appHandler serves a page with a known background that makes a delayed XHR, like an app
// fetching its data.
func appHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		html(w, 200, page("rgb(12, 200, 34)", `<h1 id=h>Hello</h1><p>toolhost screenshot test</p>
<script>setTimeout(()=>fetch('/api/data').then(r=>r.text()).then(t=>{document.getElementById('h').textContent=t}),50)</script>`))
	})
	mux.HandleFunc("/api/data", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "Loaded")
	})
	return mux
}

func TestCapturePairSizesAndPixels(t *testing.T) {
	c := newCapturer(t, Config{})
	base := serve(t, appHandler())
	p, err := c.CapturePair(t.Context(), base, "/")
	if err != nil {
		t.Fatal(err)
	}
	green := color.RGBA{12, 200, 34, 255}
	checkShot(t, p.Desktop, Desktop, green)
	checkShot(t, p.Mobile, Mobile, green)
	for _, s := range []Shot{p.Desktop, p.Mobile} {
		if s.Status != 200 || !s.Idle || !s.Loaded || s.BlockedCount != 0 {
			t.Errorf("%s: status %d idle %v loaded %v blocked %v", s.Viewport.Name, s.Status, s.Idle, s.Loaded, s.Blocked)
		}
		if s.FinalURL != base.String()+"/" {
			t.Errorf("%s: final URL %q", s.Viewport.Name, s.FinalURL)
		}
	}
	if err := p.PageError(); err != nil {
		t.Errorf("PageError = %v", err)
	}
	t.Logf("pair %v; desktop %v PNG %d B WebP %d B; mobile %v PNG %d B WebP %d B", p.Elapsed,
		p.Desktop.Elapsed, p.Desktop.PNGBytes, len(p.Desktop.WebP), p.Mobile.Elapsed, p.Mobile.PNGBytes, len(p.Mobile.WebP))
}

func TestMobileIsMobile(t *testing.T) {
	c := newCapturer(t, Config{})
	var uas sync.Map
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		// Red unless the page sees a 390 px wide touch screen.
		html(w, 200, page("rgb(255, 0, 0)", `<script>
if (innerWidth === 390 && navigator.maxTouchPoints > 0 && devicePixelRatio === 1) document.documentElement.style.background = document.body.style.background = 'rgb(0, 0, 255)';
</script>`))
	})
	mux.HandleFunc("/favicon.ico", func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) })
	base := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		uas.Store(r.UserAgent(), true)
		mux.ServeHTTP(w, r)
	}))
	s, err := c.Capture(t.Context(), base, "/", Mobile)
	if err != nil {
		t.Fatal(err)
	}
	checkShot(t, *s, Mobile, color.RGBA{0, 0, 255, 255})
	mobileUA := false
	uas.Range(func(k, _ any) bool { mobileUA = mobileUA || strings.Contains(k.(string), "Mobile"); return true })
	if !mobileUA {
		t.Error("no request had a mobile user agent")
	}
}

func TestSSRFPathsRefusedBeforeNavigation(t *testing.T) {
	c := newCapturer(t, Config{})
	var hits atomic.Int64
	base := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		html(w, 200, page("white", "should not be reached"))
	}))
	for _, p := range ssrfPaths {
		if _, err := c.CapturePair(t.Context(), base, p); !errors.Is(err, ErrBadPath) {
			t.Errorf("CapturePair(%q) err = %v, want ErrBadPath", p, err)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the server saw %d requests", n)
	}
	if pid := c.BrowserPID(); pid != 0 {
		t.Errorf("a browser (pid %d) was started for refused paths", pid)
	}
}

// TestOriginPin: a page the agent wrote tries to reach other origins on the host (another
// loopback port, standing in for metadata services and the host's own servers) with
// subresources, an iframe, fetch, a WebSocket, a navigation and a redirect. None may reach it.
func TestOriginPin(t *testing.T) { originPin(t, Config{}) }

// originPin: a page that reaches for another origin in every way a page can gets none of
// it, in the browser cfg makes.
func originPin(t *testing.T, cfg Config) {
	cfg.IdleBound = 2 * time.Second
	c := newCapturer(t, cfg)
	var otherHits atomic.Int64
	other := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		otherHits.Add(1)
		html(w, 200, page("rgb(255, 0, 0)", "SECRET"))
	}))
	// Plain TCP listener: counts WebSocket (and any other) connection attempts.
	wsLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wsHits atomic.Int64
	wsDone := make(chan struct{})
	go func() {
		defer close(wsDone)
		for {
			conn, err := wsLn.Accept()
			if err != nil {
				return
			}
			wsHits.Add(1)
			conn.Close()
		}
	}()
	t.Cleanup(func() { wsLn.Close(); <-wsDone })

	o := other.String()
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		html(w, 200, page("rgb(12, 200, 34)", fmt.Sprintf(`
<img src="%[1]s/img.png"><iframe src="%[1]s/frame"></iframe>
<link rel="stylesheet" href="%[1]s/style.css">
<script src="%[1]s/script.js"></script>
<img src="/redirect-img">
<script>fetch(%[1]q + '/fetch').catch(()=>{}); try { new WebSocket('ws://%[2]s/ws') } catch (e) {}
window.open(%[1]q + '/popup');</script>`, o, wsLn.Addr())))
	})
	mux.HandleFunc("/redirect-img", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, o+"/via-redirect.png", http.StatusFound)
	})
	mux.HandleFunc("/go-away", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, o+"/redirected", http.StatusFound)
	})
	mux.HandleFunc("/navigate-away", func(w http.ResponseWriter, r *http.Request) {
		html(w, 200, page("white", `<script>location.href = `+fmt.Sprintf("%q", o+"/navigated")+`</script>`))
	})
	base := serve(t, mux)

	s, err := c.Capture(t.Context(), base, "/", Desktop)
	if err != nil {
		t.Fatal(err)
	}
	checkShot(t, *s, Desktop, color.RGBA{12, 200, 34, 255})
	if s.BlockedCount == 0 {
		t.Error("no request was reported blocked")
	}
	t.Logf("blocked %d: %v", s.BlockedCount, s.Blocked)
	for _, want := range []string{o + "/img.png", o + "/frame", o + "/via-redirect.png", "CONNECT " + wsLn.Addr().String()} {
		found := false
		for _, b := range s.Blocked {
			found = found || b == want
		}
		if !found {
			t.Errorf("%s not in Blocked", want)
		}
	}

	_, err = c.Capture(t.Context(), base, "/go-away", Desktop)
	if !errors.Is(err, ErrOffOrigin) {
		t.Errorf("redirect off origin: err = %v, want ErrOffOrigin", err)
	}
	t.Logf("redirect: %v", err)
	_, err = c.Capture(t.Context(), base, "/navigate-away", Desktop)
	if !errors.Is(err, ErrOffOrigin) {
		t.Errorf("script navigation off origin: err = %v, want ErrOffOrigin", err)
	}
	t.Logf("script navigation: %v", err)
	if n := otherHits.Load(); n != 0 {
		t.Errorf("the other origin saw %d requests", n)
	}
	if n := wsHits.Load(); n != 0 {
		t.Errorf("the WebSocket listener saw %d connections", n)
	}
}

func TestNeverIdleCapturedAtBound(t *testing.T) {
	const bound = 1500 * time.Millisecond
	c := newCapturer(t, Config{IdleBound: bound})
	stop := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		html(w, 200, page("rgb(0, 0, 255)", `<script>fetch('/poll')</script>`))
	})
	mux.HandleFunc("/poll", func(w http.ResponseWriter, r *http.Request) {
		select { // a long poll that never answers
		case <-r.Context().Done():
		case <-stop:
		}
	})
	base := serve(t, mux)
	t.Cleanup(func() { close(stop) }) // runs before the server's cleanup
	p, err := c.CapturePair(t.Context(), base, "/")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []Shot{p.Desktop, p.Mobile} {
		if s.Idle || !s.Loaded {
			t.Errorf("%s: idle %v loaded %v; want idle false, loaded true", s.Viewport.Name, s.Idle, s.Loaded)
		}
		if s.Elapsed < bound {
			t.Errorf("%s: took %v, less than the idle bound", s.Viewport.Name, s.Elapsed)
		}
	}
	checkShot(t, p.Desktop, Desktop, color.RGBA{0, 0, 255, 255})
	checkShot(t, p.Mobile, Mobile, color.RGBA{0, 0, 255, 255})
	t.Logf("pair %v", p.Elapsed)
}

func TestConnectionRefused(t *testing.T) {
	c := newCapturer(t, Config{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, err = c.CapturePair(t.Context(), mustURL(t, "http://"+addr), "/")
	if !errors.Is(err, ErrConnectionRefused) {
		t.Fatalf("err = %v, want ErrConnectionRefused", err)
	}
	t.Log(err)
}

// TestPreviewServerGoesAway: the port answered the probe, but the server is gone when the
// browser connects (the dial happens in the origin pin).
func TestPreviewServerGoesAway(t *testing.T) {
	c := newCapturer(t, Config{})
	base := serve(t, appHandler())
	if _, err := c.Capture(t.Context(), base, "/", Desktop); err != nil { // warm up
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := mustURL(t, "http://"+ln.Addr().String())
	var once sync.Once
	accepted := make(chan struct{})
	go func() {
		conn, err := ln.Accept() // the probe
		if err == nil {
			conn.Close()
		}
		ln.Close()
		once.Do(func() { close(accepted) })
	}()
	t.Cleanup(func() { ln.Close(); <-accepted })
	_, err = c.Capture(t.Context(), target, "/", Desktop)
	if !errors.Is(err, ErrConnectionRefused) {
		t.Fatalf("err = %v, want ErrConnectionRefused", err)
	}
	t.Log(err)
}

func TestHTTPErrorStatusCaptured(t *testing.T) {
	c := newCapturer(t, Config{})
	base := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		html(w, 500, page("rgb(255, 0, 0)", `<h1>Internal Server Error</h1><script>throw new Error("boom")</script>`))
	}))
	p, err := c.CapturePair(t.Context(), base, "/broken")
	if err != nil {
		t.Fatal(err)
	}
	if p.Desktop.Status != 500 || p.Mobile.Status != 500 {
		t.Errorf("status %d/%d, want 500", p.Desktop.Status, p.Mobile.Status)
	}
	checkShot(t, p.Desktop, Desktop, color.RGBA{255, 0, 0, 255})
	if len(p.Mobile.PageErrors) != 1 || !strings.Contains(p.Mobile.PageErrors[0], "boom") {
		t.Errorf("PageErrors = %q, want the uncaught boom", p.Mobile.PageErrors)
	}
	if err := p.PageError(); !errors.Is(err, ErrPageStatus) {
		t.Errorf("PageError = %v, want ErrPageStatus", err)
	} else {
		t.Log(err)
	}
}

func TestNavigationTimeout(t *testing.T) {
	c := newCapturer(t, Config{NavigationTimeout: time.Second})
	stop := make(chan struct{})
	base := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select { // accepts, never answers
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	t.Cleanup(func() { close(stop) })
	t0 := time.Now()
	_, err := c.CapturePair(t.Context(), base, "/")
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	t.Logf("after %v: %v", time.Since(t0), err)
}

func TestContextDeadline(t *testing.T) {
	c := newCapturer(t, Config{})
	stop := make(chan struct{})
	base := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	t.Cleanup(func() { close(stop) })
	// Deadline while starting the browser: the start goes on and is kept for later.
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	_, err := c.CapturePair(ctx, base, "/")
	cancel()
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	t.Logf("while starting: %v", err)
	// Deadline while the page does not answer (and inside the navigation timeout).
	if _, err := c.acquire(t.Context()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(t.Context(), 800*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, err = c.CapturePair(ctx, base, "/")
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	if d := time.Since(t0); d > 800*time.Millisecond+grace {
		t.Errorf("returned after %v", d)
	}
	t.Logf("after %v: %v", time.Since(t0), err)
}

func TestNoBrowser(t *testing.T) {
	base := serve(t, appHandler())
	for _, cfg := range []Config{
		{ExecutablePath: "/nonexistent/chromium"},
		{DriverDir: t.TempDir()},
	} {
		cfg.Logger = testLogger(t)
		c := New(cfg)
		if err := c.Check(); !errors.Is(err, ErrNoBrowser) {
			t.Errorf("Check = %v, want ErrNoBrowser", err)
		}
		_, err := c.CapturePair(t.Context(), base, "/")
		if !errors.Is(err, ErrNoBrowser) || !strings.Contains(err.Error(), "setup-browser.sh") {
			t.Errorf("CapturePair = %v, want ErrNoBrowser saying how to install", err)
		}
		t.Log(err)
		if err := c.Close(t.Context()); err != nil {
			t.Error(err)
		}
	}
}

// ownProcs returns the descendants of this test process that are browsers or drivers.
func ownProcs() []proc {
	var out []proc
	for _, p := range descendants(os.Getpid()) {
		if strings.Contains(p.cmdline, "chromium") || strings.Contains(p.cmdline, "cli.js") {
			out = append(out, p)
		}
	}
	return out
}

func TestBrowserReusedRestartedAndGoneAfterClose(t *testing.T) {
	c := newCapturer(t, Config{})
	base := serve(t, appHandler())
	if _, err := c.CapturePair(t.Context(), base, "/"); err != nil {
		t.Fatal(err)
	}
	pid := c.BrowserPID()
	if !alive(pid) {
		t.Fatalf("browser pid %d is not alive", pid)
	}
	var routerDirs []string // the browsers' private directories on the host
	c.mu.Lock()
	routerDirs = append(routerDirs, c.rt.router.(*router).dir)
	c.mu.Unlock()
	if _, err := os.Stat(routerDirs[0]); err != nil {
		t.Errorf("the browser's router directory: %v", err)
	}
	c.mu.Lock()
	driver := c.rt.driverPID
	c.mu.Unlock()
	if _, err := c.CapturePair(t.Context(), base, "/"); err != nil {
		t.Fatal(err)
	}
	if got := c.BrowserPID(); got != pid {
		t.Errorf("browser pid changed from %d to %d: not reused", pid, got)
	}

	// A browser that died is replaced on the next capture.
	killTree(pid)
	testenv.WaitFor(t, fmt.Sprintf("the killed browser (pid %d) to die", pid), func() bool { return !alive(pid) })
	// The capture right after the death must succeed: it restarts the browser itself.
	p, err := c.CapturePair(t.Context(), base, "/")
	if err != nil {
		t.Fatal(err)
	}
	checkShot(t, p.Desktop, Desktop, color.RGBA{12, 200, 34, 255})
	newPID := c.BrowserPID()
	if newPID == pid || !alive(newPID) {
		t.Errorf("browser pid after restart %d (before %d)", newPID, pid)
	}
	c.mu.Lock()
	newDriver := c.rt.driverPID
	routerDirs = append(routerDirs, c.rt.router.(*router).dir)
	c.mu.Unlock()

	mine := map[int]bool{driver: true, newDriver: true}
	for _, d := range descendants(newDriver) {
		mine[d.pid] = true
	}
	if len(mine) < 4 {
		t.Errorf("found only %d driver/browser processes: %v", len(mine), mine)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for pid := range mine {
		if alive(pid) {
			p, _ := readProc(pid)
			t.Errorf("process %d (%s) is still alive after Close", pid, p.cmdline)
		}
	}
	for _, p := range ownProcs() {
		if mine[p.pid] || mine[p.ppid] {
			t.Errorf("leftover process %d: %s", p.pid, p.cmdline)
		}
	}
	if c.BrowserPID() != 0 {
		t.Error("BrowserPID after Close")
	}
	for _, dir := range routerDirs {
		if _, err := os.Stat(dir); err == nil {
			t.Errorf("browser router directory %s left behind", dir)
		}
	}
	if _, err := c.CapturePair(t.Context(), base, "/"); !errors.Is(err, ErrClosed) {
		t.Errorf("capture after Close: %v, want ErrClosed", err)
	}
}

func TestConcurrentCaptures(t *testing.T) {
	// Eight pages at once in one browser: a liveness bound well above the default, for a
	// loaded machine (this test is about concurrency, not speed).
	c := newCapturer(t, Config{CaptureTimeout: 3 * time.Minute})
	base := serve(t, appHandler())
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			p, err := c.CapturePair(t.Context(), base, fmt.Sprintf("/?n=%d", i))
			if err == nil && (len(p.Desktop.WebP) == 0 || len(p.Mobile.WebP) == 0) {
				err = errors.New("empty image")
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// TestCloseDuringCapture: Close cancels a capture in flight and still leaves nothing behind.
func TestCloseDuringCapture(t *testing.T) {
	c := newCapturer(t, Config{IdleBound: 10 * time.Second, CaptureTimeout: time.Minute})
	stop := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		html(w, 200, page("white", `<script>fetch('/poll')</script>`))
	})
	polling := make(chan struct{})
	var polled sync.Once
	mux.HandleFunc("/poll", func(w http.ResponseWriter, r *http.Request) {
		polled.Do(func() { close(polling) })
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	})
	base := serve(t, mux)
	t.Cleanup(func() { close(stop) })
	errc := make(chan error, 1)
	go func() { // owned here: Close ends the capture, and the test waits for it below
		_, err := c.CapturePair(context.Background(), base, "/")
		errc <- err
	}()
	// The page's request hangs: the capture is inside its idle wait.
	select {
	case <-polling:
	case err := <-errc:
		t.Fatalf("the capture ended before its page polled: %v", err)
	case <-time.After(testenv.HangBound):
		t.Fatalf("the page never polled within %s", testenv.HangBound)
	}
	c.mu.Lock()
	driver := c.rt.driverPID
	c.mu.Unlock()
	tree := append(descendants(driver), proc{pid: driver})
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	err := <-errc
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("capture during Close: err = %v, want ErrClosed", err)
	}
	t.Logf("Close took %v; capture: %v", time.Since(t0), err)
	for _, p := range tree {
		if alive(p.pid) {
			t.Errorf("process %d (%s) is alive after Close", p.pid, p.cmdline)
		}
	}
}

// TestSameOriginWebSocket: a WebSocket to the preview origin (a dev server's hot reload) goes
// through the origin pin's CONNECT tunnel.
func TestSameOriginWebSocket(t *testing.T) {
	c := newCapturer(t, Config{})
	var conns sync.WaitGroup
	stop := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		html(w, 200, page("rgb(255, 0, 0)", `<script>
const ws = new WebSocket('ws://' + location.host + '/ws');
ws.onmessage = e => { if (e.data === 'hi') document.documentElement.style.background = document.body.style.background = 'rgb(0, 0, 255)' };
</script>`))
	})
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		// Just enough of RFC 6455: the handshake and one unmasked text frame.
		h := sha1.Sum([]byte(r.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
		conn, rw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		conns.Add(1)
		defer conns.Done()
		defer conn.Close()
		fmt.Fprintf(rw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n", base64.StdEncoding.EncodeToString(h[:]))
		rw.Write([]byte{0x81, 2, 'h', 'i'})
		rw.Flush()
		go func() { <-stop; conn.Close() }()
		_, _ = io.Copy(io.Discard, conn) // until the browser goes
	})
	base := serve(t, mux)
	t.Cleanup(func() { close(stop); conns.Wait() })
	s, err := c.Capture(t.Context(), base, "/", Desktop)
	if err != nil {
		t.Fatal(err)
	}
	checkShot(t, *s, Desktop, color.RGBA{0, 0, 255, 255})
	if s.BlockedCount != 0 {
		t.Errorf("blocked: %v", s.Blocked)
	}
}

// TestDriverDeath: the driver (and with it the browser) is killed; the next capture starts
// both again.
func TestDriverDeath(t *testing.T) {
	c := newCapturer(t, Config{})
	base := serve(t, appHandler())
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	driver, browser := c.rt.driverPID, c.rt.browserPID
	c.mu.Unlock()
	killTree(driver)
	p, err := c.CapturePair(t.Context(), base, "/")
	if err != nil {
		t.Fatal(err)
	}
	checkShot(t, p.Mobile, Mobile, color.RGBA{12, 200, 34, 255})
	if pid := c.BrowserPID(); pid == browser || !alive(pid) {
		t.Errorf("browser pid %d after the driver's death (before: %d)", pid, browser)
	}
	if alive(driver) || alive(browser) {
		t.Errorf("killed driver %d or browser %d still alive", driver, browser)
	}
}

// TestEmptyResponse: the port accepts and drops every connection, as a sandbox's port
// forwarder does when nothing listens behind it.
func TestEmptyResponse(t *testing.T) {
	c := newCapturer(t, Config{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conn.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	_, err = c.CapturePair(t.Context(), mustURL(t, "http://"+ln.Addr().String()), "/")
	if !errors.Is(err, ErrEmptyResponse) {
		t.Fatalf("err = %v, want ErrEmptyResponse", err)
	}
	t.Log(err)
}
