package screenshot

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/playwright-community/playwright-go"
)

// One warm page per viewport of the pair: a browser context and its page, made ahead of
// need behind a pin that has no target yet (it refuses everything), so that a capture
// starts with navigation instead of waiting for Chromium to make a context and a page
// (NewPage alone is 150-300 ms on full Chromium). Each is used once, for one capture,
// exactly as a context made for that capture would be: it has loaded nothing before, so
// no state passes from one capture to another. The next one is made when a capture is
// done with its own, in the background, and again when the browser restarts.

// warmPage is a context and page made ahead for one viewport.
type warmPage struct {
	px   *pinProxy
	bc   playwright.BrowserContext
	page playwright.Page
}

// warmSlot is a warm page being made or made: ready is closed once w or err is set. A
// capture that takes a slot still being made waits for it rather than making a page of its
// own beside it (two at once on a busy browser take as long as one after the other).
type warmSlot struct {
	ready     chan struct{}
	w         *warmPage
	err       error
	abandoned atomic.Bool // the capture that took it gave up: the maker closes what it made
}

// warmViewports are the viewports kept warm: the pair's.
var warmViewports = []Viewport{Desktop, Mobile}

func warmKey(vp Viewport) string {
	return fmt.Sprintf("%s %dx%d %v", vp.Name, vp.Width, vp.Height, vp.Mobile)
}

func isWarmViewport(vp Viewport) bool {
	return slices.Contains(warmViewports, vp)
}

// warmUp starts making rt's missing warm pages, in the background (owned by c.work: Close
// waits).
func (c *Capturer) warmUp(rt *runtime, vps ...Viewport) {
	for _, vp := range vps {
		if !isWarmViewport(vp) {
			continue
		}
		k := warmKey(vp)
		rt.warmMu.Lock()
		if rt.warm == nil {
			rt.warm = map[string]*warmSlot{}
		}
		if rt.warm[k] != nil || rt.warmClosed || !c.enter() {
			rt.warmMu.Unlock()
			continue
		}
		sl := &warmSlot{ready: make(chan struct{})}
		rt.warm[k] = sl
		rt.warmMu.Unlock()
		go func() { // owned by c.work: Close waits for it
			defer c.work.Done()
			sl.w, sl.err = c.makeWarm(rt, vp)
			close(sl.ready)
			rt.warmMu.Lock()
			closed := rt.warmClosed
			rt.warmMu.Unlock()
			if sl.err != nil {
				c.log.Debug("screenshot: no warm page", "viewport", vp.Name, "err", sl.err)
			} else if closed || sl.abandoned.Load() {
				sl.w.close()
			}
		}()
	}
}

// makeWarm makes a context and page for vp behind a pin without a target.
func (c *Capturer) makeWarm(rt *runtime, vp Viewport) (w *warmPage, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic in playwright-go: %v", r)
		}
	}()
	ln, err := rt.router.listen()
	if err != nil {
		return nil, err
	}
	px := newPinProxy("", "", c.log, ln, ln.proxyURL())
	bc, err := rt.browser.NewContext(c.contextOptions(rt, vp, px))
	if err != nil {
		px.close()
		return nil, err
	}
	page, err := bc.NewPage()
	if err != nil {
		_ = bc.Close()
		px.close()
		return nil, err
	}
	return &warmPage{px: px, bc: bc, page: page}, nil
}

// takeWarm returns rt's warm page for vp, waiting for one being made (within ctx), or nil.
func (c *Capturer) takeWarm(ctx context.Context, rt *runtime, vp Viewport) *warmPage {
	if !isWarmViewport(vp) {
		return nil
	}
	k := warmKey(vp)
	rt.warmMu.Lock()
	sl := rt.warm[k]
	delete(rt.warm, k)
	rt.warmMu.Unlock()
	if sl == nil {
		return nil
	}
	select {
	case <-sl.ready:
	case <-ctx.Done():
		sl.abandoned.Store(true)
		select {
		case <-sl.ready: // made meanwhile: the maker may have missed the flag
			if sl.err == nil {
				sl.w.close()
			}
		default:
		}
		return nil
	}
	if sl.err != nil {
		return nil
	}
	return sl.w
}

// closeWarm closes rt's warm pages and makes no more; pages still being made are closed
// by their makers.
func (rt *runtime) closeWarm() {
	rt.warmMu.Lock()
	rt.warmClosed = true
	slots := rt.warm
	rt.warm = nil
	rt.warmMu.Unlock()
	for _, sl := range slots {
		select {
		case <-sl.ready:
			if sl.err == nil {
				sl.w.close()
			}
		default:
		}
	}
}

func (w *warmPage) close() {
	func() {
		defer func() { _ = recover() }()
		_ = w.bc.Close()
	}()
	w.px.close()
}

// contextOptions are the options of a capture's browser context for vp behind px.
func (c *Capturer) contextOptions(rt *runtime, vp Viewport, px *pinProxy) playwright.BrowserNewContextOptions {
	opts := playwright.BrowserNewContextOptions{
		Viewport:          &playwright.Size{Width: vp.Width, Height: vp.Height},
		DeviceScaleFactor: playwright.Float(1),
		IsMobile:          playwright.Bool(vp.Mobile),
		HasTouch:          playwright.Bool(vp.Mobile),
		ServiceWorkers:    playwright.ServiceWorkerPolicyBlock,
		AcceptDownloads:   playwright.Bool(false),
		Proxy: &playwright.Proxy{
			Server: px.addr(),
			// Chromium never proxies loopback unless told; the pin must see everything.
			Bypass: playwright.String("<-loopback>"),
		},
	}
	if vp.Mobile {
		opts.UserAgent = playwright.String(mobileUA(rt.version))
	}
	return opts
}
