//go:build linux

package screenshot

import (
	"image/color"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/toolhost/toolhost/internal/testenv"
)

// readyWarm is rt's warm page of vp once it is made, or nil while it is not.
func readyWarm(c *Capturer, vp Viewport) *warmSlot {
	c.mu.Lock()
	rt := c.rt
	c.mu.Unlock()
	if rt == nil {
		return nil
	}
	rt.warmMu.Lock()
	sl := rt.warm[warmKey(vp)]
	rt.warmMu.Unlock()
	if sl == nil {
		return nil
	}
	select {
	case <-sl.ready:
		if sl.err == nil {
			return sl
		}
	default:
	}
	return nil
}

// A warm page is made ahead for each viewport of the pair, is taken by the next capture of
// that viewport, and carries nothing from one capture to the next: the page below is green
// only when it finds no cookie and no localStorage entry of an earlier visit, and leaves
// both behind.
func TestWarmPagesAreTakenAndKeepNothing(t *testing.T) {
	c := newCapturer(t, Config{})
	base := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		html(w, 200, page("white", `<script>
const seen = document.cookie.includes('seen=1') || localStorage.getItem('seen') === '1';
document.body.style.background = seen ? 'rgb(255, 0, 0)' : 'rgb(12, 200, 34)';
document.cookie = 'seen=1; max-age=3600'; localStorage.setItem('seen', '1');
</script>`))
	}))
	green := color.RGBA{12, 200, 34, 255}
	p, err := c.CapturePair(t.Context(), base, "/")
	if err != nil {
		t.Fatal(err)
	}
	checkShot(t, p.Desktop, Desktop, green)
	checkShot(t, p.Mobile, Mobile, green)
	for range 3 {
		var before *warmSlot
		testenv.WaitFor(t, "a warm desktop page", func() bool { before = readyWarm(c, Desktop); return before != nil })
		s, err := c.Capture(t.Context(), base, "/", Desktop)
		if err != nil {
			t.Fatal(err)
		}
		checkShot(t, *s, Desktop, green)
		c.mu.Lock()
		rt := c.rt
		c.mu.Unlock()
		rt.warmMu.Lock()
		after := rt.warm[warmKey(Desktop)]
		rt.warmMu.Unlock()
		if after == before {
			t.Fatal("the capture did not take the warm page made for it")
		}
	}
}

// The pin of a warm page, made before anyone asked for a capture, lets nothing through:
// not a request, not a tunnel.
func TestPinWithoutTargetRefusesAll(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := newPinProxy("", "", testLogger(t), ln, "http://"+ln.Addr().String())
	defer p.close()
	up := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("the pin without a target let %s %s through", r.Method, r.URL)
	}))
	for _, r := range []*http.Request{
		httptest.NewRequest(http.MethodGet, up.String()+"/", nil),
		httptest.NewRequest(http.MethodConnect, up.Host, nil),
	} {
		if r.Method == http.MethodConnect {
			r.Host = up.Host
		}
		w := httptest.NewRecorder()
		p.ServeHTTP(w, r)
		if w.Code != http.StatusForbidden {
			t.Errorf("%s %s: status %d, want %d", r.Method, r.URL, w.Code, http.StatusForbidden)
		}
	}
	p.mu.Lock()
	n := len(p.blocked)
	p.mu.Unlock()
	if n != 2 {
		t.Errorf("%d requests noted blocked, want 2", n)
	}
}
