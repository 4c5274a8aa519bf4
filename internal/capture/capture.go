// Package capture adapts the screenshot recorder (internal/screenshot: Chromium through
// playwright-go) to what the host and a session ask of a capturer: host.Capturer for
// take_screenshot, session.AutoCapturer for the captures a session takes on its own. It is
// what keeps the browser driver out of packages host and session.
package capture

import (
	"context"
	"errors"
	"net/url"

	"github.com/toolhost/toolhost/internal/host"
	"github.com/toolhost/toolhost/internal/screenshot"
	"github.com/toolhost/toolhost/internal/session"
)

// Recorder serves the host's capture capability and a session's automatic captures with
// a screenshot recorder: Chromium pinned to the preview's origin, the images stored under
// the project's agent (or auto) captures.
type Recorder struct{ rec *screenshot.Recorder }

// Of adapts rec.
func Of(rec *screenshot.Recorder) Recorder { return Recorder{rec} }

var _ host.Capturer = Recorder{}

var _ session.AutoCapturer = Recorder{}

// CaptureAuto takes and stores the captures a session takes on its own (under auto/).
func (c Recorder) CaptureAuto(ctx context.Context, base *url.URL, project string) ([]string, error) {
	_, stored, err := c.rec.Shoot(ctx, base, "/", project, screenshot.KindAuto)
	if err != nil {
		return nil, err
	}
	keys := make([]string, len(stored))
	for i, st := range stored {
		keys[i] = st.Key
	}
	return keys, nil
}

// Capture takes both viewports of pagePath at base and stores them as the project's
// agent captures.
func (c Recorder) Capture(ctx context.Context, base *url.URL, pagePath, project string) (*host.Capture, error) {
	pair, stored, err := c.rec.Shoot(ctx, base, pagePath, project, screenshot.KindAgent)
	if pair == nil {
		return nil, classifyCapture(err)
	}
	out := &host.Capture{
		FinalURL: pair.Desktop.FinalURL,
		Desktop:  shotOf(&pair.Desktop), Mobile: shotOf(&pair.Mobile),
		Blocked: pair.Desktop.Blocked, PageErrors: pair.Desktop.PageErrors,
		StoreError: err,
	}
	for _, st := range stored {
		shot := &out.Desktop
		if st.Viewport == screenshot.Mobile.Name {
			shot = &out.Mobile
		}
		shot.Key, shot.URL = st.Key, st.URL
	}
	return out, nil
}

func shotOf(s *screenshot.Shot) host.CaptureShot {
	return host.CaptureShot{Width: s.Viewport.Width, Height: s.Viewport.Height, WebP: s.WebP, Status: s.Status, Idle: s.Idle}
}

// classifyCapture marks a capture failure with the host's class of it, keeping its
// message (written for the model) as it is.
func classifyCapture(err error) error {
	var class error
	switch {
	case errors.Is(err, screenshot.ErrBadPath), errors.Is(err, screenshot.ErrBadBase):
		class = host.ErrCaptureInvalid
	case errors.Is(err, screenshot.ErrTimeout):
		class = host.ErrCaptureTimeout
	case errors.Is(err, screenshot.ErrConnectionRefused):
		class = host.ErrCaptureUnreachable
	case errors.Is(err, screenshot.ErrOffOrigin):
		class = host.ErrCaptureOffOrigin
	default:
		return err
	}
	return classified{class: class, err: err}
}

type classified struct{ class, err error }

func (c classified) Error() string   { return c.err.Error() }
func (c classified) Unwrap() []error { return []error{c.class, c.err} }
