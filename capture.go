package toolhost

import (
	"context"
	"errors"
	"net/url"

	"github.com/toolhost/toolhost/internal/host"
	"github.com/toolhost/toolhost/internal/screenshot"
)

// recorderCapturer serves the host's capture capability with internal/screenshot's recorder:
// Chromium through playwright-go, pinned to the preview's origin, the images stored under
// the project's agent captures. It is what keeps the browser driver out of package host.
type recorderCapturer struct{ rec *screenshot.Recorder }

var _ host.Capturer = recorderCapturer{}

// Capturer serves host.Config.Capturer with rec, for programs that assemble a host.Host
// themselves instead of using New.
func Capturer(rec *screenshot.Recorder) host.Capturer { return recorderCapturer{rec} }

func (c recorderCapturer) Capture(ctx context.Context, base *url.URL, pagePath, project string) (*host.Capture, error) {
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
