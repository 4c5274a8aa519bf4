package screenshot_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/toolhost/toolhost/internal/screenshot"
)

// The host owns one Capturer for the process. It builds base from the sandbox's preview
// mapping (never from plugin input) and passes the plugin's path as it came.
func Example() {
	c := screenshot.New(screenshot.Config{})
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Close(ctx) // stops the browser and the driver; no process is left
	}()

	base := &url.URL{Scheme: "http", Host: "127.0.0.1:41234"} // from Sandbox.PreviewURL(port)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := c.CapturePair(ctx, base, "/dashboard?tab=2")
	switch {
	case errors.Is(err, screenshot.ErrBadPath), errors.Is(err, screenshot.ErrNoBrowser),
		errors.Is(err, screenshot.ErrConnectionRefused), errors.Is(err, screenshot.ErrTimeout):
		fmt.Println("is_error:", err) // each message says what happened and what to do
		return
	case err != nil:
		fmt.Println("is_error:", err)
		return
	}
	if perr := p.PageError(); perr != nil {
		fmt.Println("page error (images attached):", perr)
	}
	fmt.Println(len(p.Desktop.WebP) > 0, p.Desktop.Idle, p.Mobile.Viewport.Width)
}
