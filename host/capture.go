package host

import (
	"context"
	"encoding/json"
	"errors"
	"net/url"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/core/screenshot"
)

// devServer is what a sandbox that watches for dev servers (core/session) offers: the port
// of the one it saw start last, or 0.
type devServer interface {
	DevServerPort() int
}

// capture serves toolhost_capture.capture. The plugin names a port and a path; the URL is
// built here from the sandbox's own preview mapping, so the browser can reach nothing but
// what listens inside the sandbox (and package screenshot pins it to that origin).
func (h *Host) capture(ctx context.Context, inst *instance, stack []uint64) {
	outPtr, outCap := uint32(stack[2]), uint32(stack[3])
	var req abi.CaptureRequest
	if !inst.jsonArg(stack, "capture", 64<<10, &req) {
		return
	}
	stack[0] = h.doCapture(ctx, inst, req, outPtr, outCap)
}

func (h *Host) doCapture(ctx context.Context, inst *instance, req abi.CaptureRequest, outPtr, outCap uint32) uint64 {
	rec := h.cfg.Screenshots
	if rec == nil || rec.Capturer == nil {
		return inst.status(abi.StatusIO, "capture: this host has no browser configured for screenshots")
	}
	port := req.Port
	if port == 0 {
		port = inst.session.defaultPort
		if ds, ok := inst.sb.(devServer); ok && ds.DevServerPort() != 0 {
			port = ds.DevServerPort()
		}
	}
	if port == 0 {
		return inst.status(abi.StatusInvalid, "capture: no port given and no dev server seen in this session; pass the port your server listens on")
	}
	if port < 1 || port > 65535 {
		return inst.status(abi.StatusInvalid, "capture: port %d is not a TCP port (1-65535)", port)
	}
	base, err := inst.sb.PreviewURL(ctx, port)
	if err != nil {
		if errors.Is(err, sandbox.ErrPortClosed) {
			return inst.status(abi.StatusNotFound, "capture: connection refused: nothing in the sandbox listens on port %d; start the dev server (bash with background: true) and try again", port)
		}
		return inst.fileStatus("capture: preview of port "+itoa(port), err)
	}
	path := req.Path
	if path == "" {
		path = "/"
	}
	pair, stored, err := rec.Shoot(ctx, base, path, inst.session.project, screenshot.KindAgent)
	if pair == nil {
		return inst.captureStatus(err)
	}
	reply := abi.CaptureReply{Port: port, Page: pagePath(pair.Desktop.FinalURL, path),
		Desktop: wireShot(&pair.Desktop), Mobile: wireShot(&pair.Mobile),
		Blocked: pair.Desktop.Blocked, PageErrors: pair.Desktop.PageErrors}
	if err != nil {
		reply.StoreError = err.Error()
	}
	for _, st := range stored {
		shot := &reply.Desktop
		if st.Viewport == screenshot.Mobile.Name {
			shot = &reply.Mobile
		}
		shot.Key, shot.URL = st.Key, st.URL
	}
	header, _ := json.Marshal(reply)
	out := make([]byte, 0, len(header)+1+len(pair.Desktop.WebP)+len(pair.Mobile.WebP))
	out = append(append(append(append(out, header...), '\n'), pair.Desktop.WebP...), pair.Mobile.WebP...)
	return inst.reply(outPtr, outCap, out)
}

func wireShot(s *screenshot.Shot) abi.Shot {
	return abi.Shot{Width: s.Viewport.Width, Height: s.Viewport.Height, Bytes: len(s.WebP), Status: s.Status, Idle: s.Idle}
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
	case errors.Is(err, screenshot.ErrBadPath), errors.Is(err, screenshot.ErrBadBase):
		s = abi.StatusInvalid
	case errors.Is(err, screenshot.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		s = abi.StatusTimeout
	case errors.Is(err, screenshot.ErrConnectionRefused):
		s = abi.StatusNotFound
	case errors.Is(err, screenshot.ErrOffOrigin):
		s = abi.StatusPermission
	}
	return inst.status(s, "capture: %v", err)
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }
