package session

import (
	"context"
	"net/url"
	"slices"
	"time"
)

const (
	devServerWatch = 60 * time.Second       // how long after a background start to look
	devServerPoll  = 200 * time.Millisecond // how often
)

// DevServerPort is the port the session last saw a background process start listening
// on, or 0: take_screenshot's default.
func (s *Workspace) DevServerPort() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.devPort
}

func (s *Workspace) listening(ctx context.Context) ([]int, error) {
	sb, release, err := s.current(ctx, 0)
	if err != nil {
		return nil, err
	}
	defer release()
	return s.listeningOn(ctx, sb)
}

// watchDevServer watches for a port that was not listening before to start listening,
// remembers it as the dev server's and captures it on its own. With rearm (after a
// rotation restarted the dev server) it waits for the dev server's own port to listen
// again and captures it anew.
func (s *Workspace) watchDevServer(ctx context.Context, before []int, rearm bool) {
	ctx, cancel := context.WithTimeout(ctx, devServerWatch)
	defer cancel()
	t := time.NewTicker(devServerPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ports, err := s.listening(ctx)
		if err != nil {
			continue
		}
		if rearm {
			port := s.DevServerPort()
			if slices.Contains(ports, port) {
				s.log.Info("session: dev server listening again after a rotation", "port", port)
				s.autoCapture(ctx, port, "dev server restarted")
				return
			}
			continue
		}
		for _, p := range ports {
			if slices.Contains(before, p) {
				continue
			}
			s.mu.Lock()
			seen := s.devPort == p // another watcher got there first
			s.devPort = p
			s.mu.Unlock()
			if seen {
				return
			}
			s.log.Info("session: dev server listening", "port", p)
			s.autoCapture(ctx, p, "dev server started")
			return
		}
	}
}

// AutoCapturer takes and stores the screenshots nobody asked for: both viewports of the
// page at base (a preview of the sandbox), stored as the project's automatic captures. It
// returns the keys it stored. The root package adapts the screenshot recorder to it, so a
// session links no browser.
type AutoCapturer interface {
	CaptureAuto(ctx context.Context, base *url.URL, project string) (keys []string, err error)
}

// autoCapture shoots both viewports of the dev server's root and stores them under
// auto/. Failures are logged, never returned: nobody asked for this capture.
func (s *Workspace) autoCapture(ctx context.Context, port int, why string) {
	rec := s.cfg.Screenshots
	if rec == nil || port == 0 {
		return
	}
	base, err := s.PreviewURL(ctx, port)
	if err != nil {
		s.log.Warn("session: auto-capture skipped", "why", why, "port", port, "err", err)
		return
	}
	keys, err := rec.CaptureAuto(ctx, base, s.cfg.ProjectID)
	if err != nil && ctx.Err() != nil { // the session closed meanwhile (Close cancels ctx first)
		s.log.Debug("session: auto-capture ended by the session's close", "why", why, "port", port, "err", err)
		return
	}
	if err != nil {
		s.log.Warn("session: auto-capture failed", "why", why, "port", port, "err", err)
		return
	}
	s.log.Info("session: auto-captured", "why", why, "port", port, "keys", keys)
}
