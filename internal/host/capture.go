package host

import (
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"strings"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
)

// Capturer takes the screenshots of the capture capability: both viewports of a page
// that a process serves inside the sandbox, stored under the session's project. The host
// links no browser: the embedding package (github.com/toolhost/toolhost) wires
// internal/screenshot's Playwright capturer in through this interface.
type Capturer interface {
	// Capture shoots pagePath on the preview origin base (scheme://host:port, which the
	// host built from the sandbox's own preview of a port, never from what a plugin said)
	// in the desktop (1280x800) and mobile (390x844) viewports, and stores both images
	// under project's agent captures. When only storing fails, the images come back with
	// Capture.StoreError set and a nil error. A capture that failed wraps
	// ErrCaptureInvalid, ErrCaptureTimeout, ErrCaptureUnreachable or ErrCaptureOffOrigin
	// when one applies; its message is written for the model.
	Capture(ctx context.Context, base *url.URL, pagePath, project string) (*Capture, error)
}

// Capture is a page shot in both viewports.
type Capture struct {
	// FinalURL is the page's URL when shot (on the preview origin by construction).
	FinalURL        string
	Desktop, Mobile CaptureShot
	// Blocked lists requests to other origins that were refused; PageErrors are uncaught
	// JavaScript errors of the page.
	Blocked    []string
	PageErrors []string
	// StoreError is why the images could not be stored, or nil.
	StoreError error
}

// CaptureShot is one viewport's image.
type CaptureShot struct {
	Width, Height int
	WebP          []byte // lossless WebP, Width x Height
	Status        int    // HTTP status of the page's document
	Idle          bool   // the network went idle before the shot
	Key, URL      string // where the image is stored; empty when it is not
}

// Errors a Capturer wraps so that the plugin gets the right status.
var (
	// ErrCaptureInvalid: the page path (or the preview origin) was refused before any
	// navigation.
	ErrCaptureInvalid = errors.New("capture refused")
	// ErrCaptureTimeout: the page did not answer in time.
	ErrCaptureTimeout = errors.New("capture timed out")
	// ErrCaptureUnreachable: nothing answered on the preview port.
	ErrCaptureUnreachable = errors.New("nothing answered on the preview port")
	// ErrCaptureOffOrigin: the page navigated away from the preview origin.
	ErrCaptureOffOrigin = errors.New("the page left the preview origin")
)

// decodeCapture decodes a capture request and resolves its port: the plugin names a port
// (or none, for the session's default) and a path; the policy decides on the port that
// will be shot.
func (h *Host) decodeCapture(_ context.Context, inst *instance, stack []uint64, c *hostCall) bool {
	c.outPtr, c.outCap = uint32(stack[2]), uint32(stack[3])
	var req abi.CaptureRequest
	if !inst.jsonArg(stack, c, "capture", 64<<10, &req) {
		return false
	}
	port := req.Port
	if port == 0 {
		port = inst.session.defaultPort
		if p := sandbox.DevServerPort(inst.sb); p != 0 {
			port = p
		}
	}
	if port == 0 {
		stack[0] = inst.status(abi.StatusInvalid, "capture: no port given and no dev server seen in this session; pass the port your server listens on")
		return false
	}
	if port < 1 || port > 65535 {
		stack[0] = inst.status(abi.StatusInvalid, "capture: port %d is not a TCP port (1-65535)", port)
		return false
	}
	c.req.Port = port
	c.raw = req.Path
	return true
}

// maxCaptureRetries bounds the captures taken again because the sandbox was replaced under
// the previous one.
const maxCaptureRetries = 3

// capture serves toolhost_capture.capture. The URL is built here from the sandbox's own
// preview mapping, so the browser can reach nothing but what listens inside the sandbox
// (and package screenshot pins it to that origin).
func (h *Host) capture(ctx context.Context, inst *instance, c *hostCall) uint64 {
	capt := h.cfg.Capturer
	if inst.session != nil && inst.session.capturer != nil {
		capt = inst.session.capturer
	}
	if capt == nil {
		return inst.status(abi.StatusIO, "capture: this host has no browser configured for screenshots")
	}
	port := c.req.Port
	base, err := inst.sb.PreviewURL(ctx, port)
	if err != nil {
		if errors.Is(err, sandbox.ErrPortClosed) {
			return inst.status(abi.StatusNotFound, "capture: connection refused: nothing in the sandbox listens on port %d; start the dev server (bash with background: true) and try again", port)
		}
		return inst.fileStatus("capture: preview of port "+itoa(port), err)
	}
	path := c.raw
	if path == "" {
		path = "/"
	}
	shot, err := capt.Capture(ctx, base, path, inst.session.project)
	// A sandbox replaced while the page was being fetched (a session's rotation) takes its
	// preview with it. The new sandbox has a preview of its own: shoot that instead, a few
	// times at most. The same URL again means the port really is closed.
	for range maxCaptureRetries {
		if !errors.Is(err, ErrCaptureUnreachable) {
			break
		}
		again, perr := inst.sb.PreviewURL(ctx, port)
		if perr != nil || again.String() == base.String() {
			break
		}
		base = again
		shot, err = capt.Capture(ctx, base, path, inst.session.project)
	}
	if err != nil {
		return inst.captureStatus(err)
	}
	reply := abi.CaptureReply{Port: port, Page: pagePath(shot.FinalURL, path),
		Desktop: wireShot(&shot.Desktop), Mobile: wireShot(&shot.Mobile),
		Blocked: shot.Blocked, PageErrors: shot.PageErrors}
	if shot.StoreError != nil {
		// The store's own error may name the host's paths: the log has it, the plugin
		// reads what happened.
		inst.p.h.log.Warn("screenshot not stored", "plugin", inst.p.name, "err", shot.StoreError)
		reply.StoreError = "the store refused them (the host's log says why)"
	}
	for _, s := range []*CaptureShot{&shot.Desktop, &shot.Mobile} {
		if s.Key != "" && shot.StoreError == nil {
			inst.stored = append(inst.stored, abi.StoredObject{URI: abi.StoreURIPrefix + s.Key,
				Name: s.Key[strings.LastIndexByte(s.Key, '/')+1:], MIMEType: "image/webp", Size: int64(len(s.WebP))})
		}
	}
	header, _ := json.Marshal(reply)
	out := make([]byte, 0, len(header)+1+len(shot.Desktop.WebP)+len(shot.Mobile.WebP))
	out = append(append(append(append(out, header...), '\n'), shot.Desktop.WebP...), shot.Mobile.WebP...)
	return inst.reply(c.outPtr, c.outCap, out)
}

func wireShot(s *CaptureShot) abi.Shot {
	return abi.Shot{Width: s.Width, Height: s.Height, Bytes: len(s.WebP), Status: s.Status, Idle: s.Idle,
		Key: s.Key, URL: webURL(s.URL)}
}

// webURL is u when it is a web address (a public base, a presigned URL) and "" otherwise:
// a directory store's "URL" is the image's path on the host, which no result may carry.
func webURL(u string) string {
	p, err := url.Parse(u)
	if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
		return ""
	}
	return u
}

// pagePath is the path and query of the final URL: the preview's host port means nothing
// to the model.
func pagePath(final, fallback string) string {
	u, err := url.Parse(final)
	if err != nil || final == "" {
		return fallback
	}
	return u.RequestURI()
}

// captureStatus says which failure stopped a capture, for the model: no browser,
// connection refused, timeout, a refused path, the page leaving its origin.
func (inst *instance) captureStatus(err error) uint64 {
	s := abi.StatusIO
	switch {
	case errors.Is(err, ErrCaptureInvalid):
		s = abi.StatusInvalid
	case errors.Is(err, ErrCaptureTimeout), errors.Is(err, context.DeadlineExceeded):
		s = abi.StatusTimeout
	case errors.Is(err, ErrCaptureUnreachable):
		s = abi.StatusNotFound
	case errors.Is(err, ErrCaptureOffOrigin):
		s = abi.StatusPermission
	}
	return inst.status(s, "capture: %v", err)
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }
