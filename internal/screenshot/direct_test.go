//go:build linux

package screenshot

import (
	"image/color"
	"testing"
)

// TestDirect: the path systems other than Linux take (the browser as a plain process,
// the pin proxies on the loopback), run here: a pair is captured, and the origin pin holds
// as it does in the sandbox (TestOriginPin's page, which reaches for another origin in
// every way a page can).
func TestDirect(t *testing.T) {
	c := newCapturer(t, Config{direct: true})
	base := serve(t, appHandler())
	p, err := c.CapturePair(t.Context(), base, "/")
	if err != nil {
		t.Fatal(err)
	}
	green := color.RGBA{12, 200, 34, 255}
	checkShot(t, p.Desktop, Desktop, green)
	checkShot(t, p.Mobile, Mobile, green)
	if _, ok := c.rt.router.(directNet); !ok {
		t.Errorf("the browser's network is %T, want the direct one", c.rt.router)
	}
	t.Run("origin pin", func(t *testing.T) { originPin(t, Config{direct: true}) })
}
