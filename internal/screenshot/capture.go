package screenshot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image/png"
	"io"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/HugoSmits86/nativewebp"
	"github.com/playwright-community/playwright-go"
)

// grace is how long a capture may take to wind down after its context ends before the
// browser is killed (which makes every pending browser call fail).
const grace = 5 * time.Second

// CapturePair shoots the page at path on the preview origin base in the [Desktop] and
// [Mobile] viewports, concurrently, each in a fresh browser context pinned to base's origin
// (see the package documentation). path is checked with [Target] before anything starts.
//
// On success both shots are filled in. A page that answers with HTTP >= 400 is captured
// anyway; see [Pair.PageError]. On failure the error wraps one of the package's sentinel
// errors; a shot that succeeded is still filled in.
func (c *Capturer) CapturePair(ctx context.Context, base *url.URL, path string) (*Pair, error) {
	t0 := time.Now()
	shots, err := c.capture(ctx, base, path, []Viewport{Desktop, Mobile})
	p := &Pair{Elapsed: time.Since(t0)}
	if len(shots) == 2 {
		p.Desktop, p.Mobile = shots[0], shots[1]
		p.URL = p.Desktop.URL
	}
	return p, err
}

// Capture shoots one viewport; see [Capturer.CapturePair].
func (c *Capturer) Capture(ctx context.Context, base *url.URL, path string, vp Viewport) (*Shot, error) {
	shots, err := c.capture(ctx, base, path, []Viewport{vp})
	if len(shots) == 1 {
		return &shots[0], err
	}
	return nil, err
}

func (c *Capturer) enter() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.work.Add(1)
	return true
}

func (c *Capturer) capture(ctx context.Context, base *url.URL, path string, vps []Viewport) ([]Shot, error) {
	target, err := Target(base, path)
	if err != nil {
		return nil, err
	}
	for _, vp := range vps {
		if vp.Width <= 0 || vp.Height <= 0 || vp.Width > 4096 || vp.Height > 4096 {
			return nil, fmt.Errorf("screenshot: viewport %s: %dx%d is out of range", vp.Name, vp.Width, vp.Height)
		}
	}
	if !c.enter() {
		return nil, ErrClosed
	}
	defer c.work.Done()

	// CaptureTimeout bounds the capture's own work once a browser runs, never the wait
	// for one: a cold start on a loaded machine took most of the (then) 30 s, and the navigation
	// that followed got the 120 ms left. The start is bounded on its own (StartTimeout),
	// the probe by its dial timeout, and the wait for a slot by the captures holding them.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() { // owned by capture: ends when ctx (cancelled on return) or closing fires
		select {
		case <-c.closing:
			cancel(ErrClosed)
		case <-ctx.Done():
		}
	}()

	// Fail fast, before starting a browser, when nothing listens on the port.
	if err := probe(ctx, hostPort(target)); err != nil {
		return nil, fmt.Errorf("capturing %s: %w", target.Redacted(), err)
	}

	select {
	case c.sem <- struct{}{}:
		defer func() { <-c.sem }()
	case <-ctx.Done():
		if cause := context.Cause(ctx); errors.Is(cause, ErrClosed) {
			return nil, cause
		}
		return nil, fmt.Errorf("%w: waiting for a capture slot for %s: %w", ErrTimeout, target.Redacted(), context.Cause(ctx))
	}

	for attempt := 0; ; attempt++ {
		rt, err := c.acquire(ctx)
		if err != nil {
			return nil, err
		}
		shotCtx, cancelShots := context.WithTimeout(ctx, c.cfg.CaptureTimeout)
		shots, errs, navigated := c.runShots(shotCtx, rt, target, vps)
		expired := shotCtx.Err() != nil
		cancelShots()
		err = errors.Join(errs...)
		if err != nil && errors.Is(context.Cause(ctx), ErrClosed) {
			return shots, fmt.Errorf("%w during the capture: %w", ErrClosed, err)
		}
		if err == nil || attempt > 0 || expired || !errors.Is(err, ErrBrowser) || slices.Contains(navigated, true) {
			return shots, err
		}
		// No shot's request left the browser: it died under us (a crash, or killed) before
		// anything reached the origin, so start a new browser and try once more.
		c.log.Warn("screenshot: browser failed before navigation; restarting it", "err", err)
		rt.dead.Store(true)
	}
}

// runShots shoots each viewport concurrently; navigated[i] reports whether shot i's origin
// may have seen a request (its pin was asked for something).
func (c *Capturer) runShots(ctx context.Context, rt *runtime, target *url.URL, vps []Viewport) (shots []Shot, errs []error, navigated []bool) {
	shots = make([]Shot, len(vps))
	errs = make([]error, len(vps))
	navigated = make([]bool, len(vps))
	var wg sync.WaitGroup
	contexts := make([]*ctxSlot, len(vps))
	for i, vp := range vps {
		contexts[i] = &ctxSlot{}
		wg.Add(1)
		go func() { // owned by runShots, which waits on wg below
			defer wg.Done()
			defer func() {
				if r := recover(); r != nil {
					errs[i] = fmt.Errorf("%w: %s: panic in playwright-go: %v", ErrBrowser, vp.Name, r)
				}
			}()
			shots[i], errs[i] = c.shoot(ctx, rt, target, vp, contexts[i], &navigated[i])
		}()
	}
	waited := make(chan struct{})
	go func() { // owned by runShots: ends when the shots have returned
		wg.Wait()
		close(waited)
	}()
	select {
	case <-waited:
	case <-ctx.Done():
		// Closing the browser contexts fails their pending calls; if even that hangs,
		// kill the browser (the next capture starts a new one).
		var closers sync.WaitGroup
		for _, s := range contexts {
			closers.Go(s.close)
		}
		select {
		case <-waited:
		case <-time.After(grace):
			c.log.Error("screenshot: capture did not wind down; killing the browser", "browser_pid", rt.browserPID)
			rt.dead.Store(true)
			killTree(rt.browserPID)
			<-waited
		}
		closers.Wait() // the browser answered, or is dead
	}
	return shots, errs, navigated
}

// probe dials hostPort once so a closed port fails fast with [ErrConnectionRefused].
func probe(ctx context.Context, hostPort string) error {
	d := net.Dialer{Timeout: 5 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", hostPort)
	if err != nil {
		if isRefused(err) {
			return fmt.Errorf("%w: %w", ErrConnectionRefused, err)
		}
		if ctx.Err() != nil || isNetTimeout(err) {
			return fmt.Errorf("%w: connecting to %s: %w", ErrTimeout, hostPort, err)
		}
		return fmt.Errorf("%w: connecting to %s: %w", ErrNavigation, hostPort, err)
	}
	return conn.Close()
}

func isNetTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// ctxSlot holds a browser context so another goroutine can close it.
type ctxSlot struct {
	mu     sync.Mutex
	bc     playwright.BrowserContext
	closed bool
}

func (s *ctxSlot) set(bc playwright.BrowserContext) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.bc = bc
	return true
}

// close closes the slot's context exactly once, whoever asks first takes it:
// playwright-go's BrowserContext.Close is not safe to call from two goroutines at once.
func (s *ctxSlot) close() {
	s.mu.Lock()
	bc := s.bc
	s.bc = nil
	s.closed = true
	s.mu.Unlock()
	if bc != nil {
		_ = bc.Close() // returns when the browser answers or dies
	}
}

func msUntil(ctx context.Context, d time.Duration) float64 {
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(dl))
	}
	return float64(max(d, time.Millisecond).Milliseconds())
}

func (c *Capturer) shoot(ctx context.Context, rt *runtime, target *url.URL, vp Viewport, slot *ctxSlot, navigated *bool) (Shot, error) {
	t0 := time.Now()
	s := Shot{Viewport: vp, URL: target.String()}
	var (
		pmu      sync.Mutex
		pageErrs []string
	)
	pageErrors := func() []string {
		pmu.Lock()
		defer pmu.Unlock()
		return append([]string(nil), pageErrs...)
	}
	fail := func(kind error, what string, err error) (Shot, error) {
		s.PageErrors = pageErrors()
		s.Elapsed = time.Since(t0)
		return s, fmt.Errorf("%w: %s (%s): %s: %w", kind, target.Redacted(), vp.Name, what, err)
	}
	var marks []any // phase timings for the debug log
	mark := func(name string) { marks = append(marks, name, time.Since(t0).Round(time.Millisecond)) }
	defer c.warmUp(rt, vp) // the next capture's page, once this one's context is closed
	var (
		px   *pinProxy
		bc   playwright.BrowserContext
		page playwright.Page
	)
	if w := c.takeWarm(ctx, rt, vp); w != nil {
		// Made ahead, behind a pin with no target yet: it is given this capture's.
		px, bc, page = w.px, w.bc, w.page
		px.retarget(originOf(target), hostPort(target))
		defer px.close() // after the browser context is closed (defers run last-in first-out)
		if !slot.set(bc) {
			_ = bc.Close()
			return fail(ErrTimeout, "capture cancelled", context.Cause(ctx))
		}
		defer slot.close()
		bc.SetDefaultTimeout(msUntil(ctx, c.cfg.NavigationTimeout))
		mark("warm")
	} else {
		ln, err := rt.router.listen()
		if err != nil {
			return fail(ErrBrowser, "starting the origin pin", err)
		}
		px = newPinProxy(originOf(target), hostPort(target), c.log, ln, ln.proxyURL())
		defer px.close() // after the browser context is closed (defers run last-in first-out)
		bc, err = rt.browser.NewContext(c.contextOptions(rt, vp, px))
		if err != nil {
			return fail(browserKind(ctx, err), "new browser context", err)
		}
		if !slot.set(bc) {
			_ = bc.Close()
			return fail(ErrTimeout, "capture cancelled", context.Cause(ctx))
		}
		defer slot.close()
		bc.SetDefaultTimeout(msUntil(ctx, c.cfg.NavigationTimeout))

		mark("context")
		page, err = bc.NewPage()
		if err != nil {
			return fail(browserKind(ctx, err), "new page", err)
		}
	}
	// Whether a retry could repeat a request the origin saw: only the pin knows (a page
	// made ahead on a browser that has died since fails its navigation before anything
	// leaves it, and is worth one retry on a new browser).
	defer func() { *navigated = px.asked.Load() }()
	page.OnPageError(func(e error) { // called on playwright-go's dispatch goroutine
		pmu.Lock()
		defer pmu.Unlock()
		if len(pageErrs) < maxPageErrors {
			pageErrs = append(pageErrs, e.Error())
		}
	})

	mark("page")
	resp, err := page.Goto(target.String(), playwright.PageGotoOptions{
		WaitUntil: playwright.WaitUntilStateCommit,
		Timeout:   playwright.Float(msUntil(ctx, c.cfg.NavigationTimeout)),
	})
	if err != nil {
		return fail(c.navKind(ctx, px, err), "navigation", err)
	}
	if resp != nil {
		s.Status = resp.Status()
		switch h, _ := resp.HeaderValue(strings.ToLower(proxyErrHeader)); h {
		case "": // the preview server answered
		case "blocked":
			return fail(ErrOffOrigin, "navigation", fmt.Errorf("redirected off the origin; the pin refused it (%d)", s.Status))
		default: // the pin could not get an answer from the preview server
			uerr := px.upstreamErr()
			if uerr == nil {
				uerr = fmt.Errorf("no answer (%d from the pin)", s.Status)
			}
			return fail(upstreamKind(uerr), "fetching the page from the preview server", uerr)
		}
	}

	// Wait for load, then network idle, within the idle bound from commit.
	mark("commit")
	idleCtx, cancelIdle := context.WithTimeout(ctx, c.cfg.IdleBound)
	err = page.WaitForLoadState(playwright.PageWaitForLoadStateOptions{
		State: playwright.LoadStateLoad, Timeout: playwright.Float(msUntil(idleCtx, c.cfg.IdleBound)),
	})
	s.Loaded = err == nil
	if err == nil {
		err = page.WaitForLoadState(playwright.PageWaitForLoadStateOptions{
			State: playwright.LoadStateNetworkidle, Timeout: playwright.Float(msUntil(idleCtx, c.cfg.IdleBound)),
		})
		s.Idle = err == nil
	}
	cancelIdle()
	if err != nil && !errIsTimeout(err) {
		return fail(browserKind(ctx, err), "waiting for network idle", err)
	}
	if ctx.Err() != nil {
		return fail(ErrTimeout, "waiting for network idle", context.Cause(ctx))
	}

	s.FinalURL = page.URL()
	if !sameOrigin(s.FinalURL, originOf(target)) {
		return fail(ErrOffOrigin, "after navigation", fmt.Errorf("the page is at %s", s.FinalURL))
	}
	mark("idle")
	pngBytes, err := page.Screenshot(playwright.PageScreenshotOptions{
		Type:    playwright.ScreenshotTypePng,
		Timeout: playwright.Float(msUntil(ctx, 10*time.Second)),
	})
	if err != nil {
		return fail(browserKind(ctx, err), "screenshot", err)
	}
	s.Blocked, s.BlockedCount = px.blockedList()
	s.PNGBytes = len(pngBytes)
	if keepPNG {
		s.png = pngBytes
	}
	mark("png")
	s.WebP, err = pngToWebP(pngBytes)
	if err != nil {
		return fail(ErrBrowser, "encoding WebP", err)
	}
	s.PageErrors = pageErrors()
	mark("webp")
	c.log.Debug("screenshot: shot", append([]any{"viewport", vp.Name, "url", s.URL, "status", s.Status, "idle", s.Idle}, marks...)...)
	s.Elapsed = time.Since(t0)
	return s, nil
}

// pngToWebP re-encodes Chromium's PNG as lossless WebP.
func pngToWebP(b []byte) ([]byte, error) {
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("decoding the browser's PNG: %w", err)
	}
	var buf bytes.Buffer
	if err := nativewebp.Encode(&buf, img, nil); err != nil {
		return nil, fmt.Errorf("encoding WebP: %w", err)
	}
	return buf.Bytes(), nil
}

func mobileUA(version string) string {
	if version == "" {
		version = "136.0.0.0"
	}
	return "Mozilla/5.0 (Linux; Android 14; Pixel 7) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/" + version + " Mobile Safari/537.36"
}

func browserKind(ctx context.Context, err error) error {
	if ctx.Err() != nil || errIsTimeout(err) {
		return ErrTimeout
	}
	return ErrBrowser
}

// upstreamKind classifies the pin's failure to get a response from the preview server.
func upstreamKind(err error) error {
	switch {
	case isRefused(err):
		return ErrConnectionRefused
	case isNetTimeout(err):
		return ErrTimeout
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET),
		strings.Contains(err.Error(), "server closed idle connection"): // codecheck:errtext net/http's errServerClosedIdle, unexported
		// A port forwarder (a sandbox preview) accepts the connection and drops it when
		// nothing listens behind it.
		return ErrEmptyResponse
	}
	return ErrNavigation
}

// navKind classifies a failed page.Goto.
func (c *Capturer) navKind(ctx context.Context, px *pinProxy, err error) error {
	msg := err.Error()
	switch {
	case ctx.Err() != nil || errIsTimeout(err):
		return ErrTimeout
	case strings.Contains(msg, "ERR_CONNECTION_REFUSED"):
		return ErrConnectionRefused
	case strings.Contains(msg, "ERR_TIMED_OUT"), strings.Contains(msg, "ERR_CONNECTION_TIMED_OUT"):
		return ErrTimeout
	case strings.Contains(msg, "net::ERR_"):
		if uerr := px.upstreamErr(); uerr != nil {
			return upstreamKind(uerr)
		}
		if _, n := px.blockedList(); n > 0 {
			return ErrOffOrigin
		}
		return ErrNavigation
	case errors.Is(err, playwright.ErrTargetClosed):
		return browserKind(ctx, err)
	}
	return ErrBrowser
}
