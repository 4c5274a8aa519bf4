// Package screenshot captures a sandbox's preview in a real browser: playwright-go driving
// Debian's Chromium, with the Playwright driver installed offline (scripts/setup-browser.sh).
//
// One [Capturer] per process holds one driver and one browser, started on first use and
// reused; every capture gets a fresh browser context. [Capturer.CapturePair] shoots the
// desktop (1280x800) and mobile (390x844) viewports concurrently after network idle, with a
// bounded wait, and returns lossless WebP images.
//
// # Where the browser may go
//
// The caller never hands this package a URL built by a plugin. It passes the preview origin
// it got from the sandbox (scheme://host:port) and the plugin's path; [Target] validates the
// path and joins it so the result can only be on that origin. The page itself is untrusted
// too (the agent wrote it), so every browser context is pinned to the origin at the network
// level: its proxy is a small HTTP proxy in this process that forwards requests and tunnels
// to the preview's host:port only and answers everything else with 403. That covers what
// request interception cannot: redirects, subresources, iframes, popups, fetch/XHR,
// WebSockets and workers. Service workers are blocked and WebRTC may not use UDP outside the
// proxy. A top-level navigation that ends off the origin is an error ([ErrOffOrigin]);
// blocked subrequests are listed in [Shot.Blocked].
//
// # The browser's sandbox
//
// Chromium parses and runs what a hostile sandbox serves, so it never runs on the host as
// it is: it runs in a bubblewrap of its own (sandbox.go), and a browser that is taken over
// holds nothing. In force, always (there is no unsandboxed mode; without bubblewrap,
// captures fail with [ErrNoBrowser] naming the package to install):
//
//   - Identity: when this process runs as root, the sandbox runs as an unprivileged host
//     uid and gid ([Config.SandboxUID], default [DefaultSandboxUID]) with no supplementary
//     group; inside it is uid 1000 in a user namespace of its own, without capabilities,
//     and may not make further user namespaces. Otherwise it runs as this process's user.
//   - Files: a new root with /usr, the /bin and /lib links and a few /etc files (loader,
//     fonts, time zone, CA certificates) read-only; a fresh /proc and /dev; tmpfs mounts,
//     bounded in size, for /tmp (256 MiB), /dev/shm (64 MiB) and the home holding the
//     profile (64 MiB). Nothing of the host's home, /root, /tmp, data directory or any
//     workspace, and no host path of this program or its sockets (its binary is run from
//     an inherited descriptor).
//   - Network: a namespace with loopback only. Each browser context's proxy is a loopback
//     address in there; a forwarder in the sandbox hands every connection, as a
//     descriptor, to this process (router.go), which gives it to that context's origin pin.
//     Nothing else answers: no host port, no outside address, no name server.
//   - Processes: new pid, ipc and uts namespaces, a new session, and the sandbox dies with
//     the driver that started it. The seccomp filter of package internal/seccomp (the one
//     every toolhost sandbox gets) is installed before the first process runs.
//
// Chromium's own sandbox is off (--no-sandbox): it needs the user namespaces ours refuses.
// Not bounded here: the browser's memory and processes as a whole (a cgroup's job).
package screenshot

import (
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Errors a caller branches on (with errors.Is). Each error returned by a capture wraps one of
// them and says what was being done with which URL; the message is written for the model that
// reads the tool result.
var (
	// ErrNoBrowser: Chromium or the Playwright driver is not installed where expected.
	ErrNoBrowser = errors.New("screenshot: browser not installed (run scripts/setup-browser.sh, or make test / make run, which run it)")
	// ErrBadPath: the plugin-supplied path was refused before any navigation.
	ErrBadPath = errors.New("screenshot: path refused")
	// ErrBadBase: the host-built preview origin is not scheme://host:port.
	ErrBadBase = errors.New("screenshot: invalid preview origin")
	// ErrConnectionRefused: nothing listens on the preview port.
	ErrConnectionRefused = errors.New("screenshot: connection refused (nothing is listening on the preview port; is the dev server running?)")
	// ErrEmptyResponse: the preview port accepted the connection and closed it without an
	// answer. Behind a port forwarder (a sandbox preview) this is usually what "nothing is
	// listening on that port inside the sandbox" looks like.
	ErrEmptyResponse = errors.New("screenshot: the preview server closed the connection without answering (is the dev server listening on that port inside the sandbox?)")
	// ErrTimeout: the page did not answer in time, or the context's deadline passed.
	ErrTimeout = errors.New("screenshot: timed out")
	// ErrNavigation: the navigation failed for another network reason.
	ErrNavigation = errors.New("screenshot: navigation failed")
	// ErrOffOrigin: the page redirected or navigated off the preview origin.
	ErrOffOrigin = errors.New("screenshot: page left the preview origin")
	// ErrPageStatus: returned by [Pair.PageError] when the page answered with HTTP >= 400.
	ErrPageStatus = errors.New("screenshot: page answered with an HTTP error")
	// ErrBrowser: the browser or driver failed or crashed during the capture.
	ErrBrowser = errors.New("screenshot: browser failed")
	// ErrClosed: the Capturer was closed.
	ErrClosed = errors.New("screenshot: capturer closed")
)

// Viewport is one emulated screen. The image is exactly Width x Height pixels (device scale
// factor 1).
type Viewport struct {
	Name   string // "desktop", "mobile"
	Width  int
	Height int
	Mobile bool // isMobile + hasTouch + a mobile user agent
}

// The two viewports of a pair.
var (
	Desktop = Viewport{Name: "desktop", Width: 1280, Height: 800}
	Mobile  = Viewport{Name: "mobile", Width: 390, Height: 844, Mobile: true}
)

// Shot is one captured viewport.
type Shot struct {
	Viewport Viewport
	URL      string // the URL navigated to
	FinalURL string // the page's URL when shot (same origin, by construction)
	// Status is the HTTP status of the main document. A status >= 400 is still captured
	// (the error page is what the agent needs to see); see [Pair.PageError].
	Status int
	// Idle is true when the network went idle (no request for 500 ms) within the idle bound;
	// false means the page was shot at the bound while still busy (e.g. a long poll).
	Idle bool
	// Loaded is true when the load event fired before the shot.
	Loaded bool
	WebP   []byte // lossless WebP (VP8L), Width x Height
	// PNGBytes is the size of the PNG Chromium returned for the same pixels.
	PNGBytes int
	// Blocked lists requests to other origins that the origin pin refused (at most
	// maxBlocked, first first); BlockedCount counts them all.
	Blocked      []string
	BlockedCount int
	// PageErrors are uncaught JavaScript errors seen on the page (at most maxPageErrors).
	PageErrors []string
	Elapsed    time.Duration

	png []byte // Chromium's PNG, kept only when keepPNG is set (benchmarks)
}

// keepPNG makes shots keep Chromium's PNG; set only by benchmarks, before any capture.
var keepPNG bool

// Pair is the desktop and mobile shots of one page.
type Pair struct {
	URL     string
	Desktop Shot
	Mobile  Shot
	Elapsed time.Duration
}

// PageError returns an error wrapping [ErrPageStatus] when the page answered with an HTTP
// status >= 400 in either viewport, else nil. The images are valid either way.
func (p *Pair) PageError() error {
	for _, s := range []*Shot{&p.Desktop, &p.Mobile} {
		if s.Status >= 400 {
			return fmt.Errorf("%w: %s answered %d", ErrPageStatus, s.URL, s.Status)
		}
	}
	return nil
}

// Config configures a [Capturer]. The zero value works on a machine set up by
// scripts/setup-browser.sh.
type Config struct {
	// ExecutablePath is the Chromium binary. Default: the first present of
	// /usr/lib/chromium/chromium-headless-shell, /usr/lib/chromium/chromium,
	// /usr/bin/chromium-headless-shell, /usr/bin/chromium. It runs in the browser's sandbox,
	// which shows /usr; a binary elsewhere gets its own directory bound read-only, and that
	// directory must be reachable by the sandbox uid.
	ExecutablePath string
	// DriverDir holds the Playwright driver (package/cli.js and node). Default:
	// $PLAYWRIGHT_DRIVER_PATH, else ~/.cache/ms-playwright-go/<version>.
	DriverDir string
	// IdleBound is the longest wait for network idle after the page commits. Default 3 s.
	IdleBound time.Duration
	// NavigationTimeout bounds the wait for the main document's response. Default 10 s.
	NavigationTimeout time.Duration
	// CaptureTimeout bounds the work of one CapturePair or Capture call once the browser
	// runs (navigation, the wait for network idle, the shots), on top of its context.
	// Starting the browser is not counted: StartTimeout bounds it. Default 60 s: a hang
	// bound (a page that does not answer fails at NavigationTimeout), which Chromium on a
	// loaded 2-core machine (load 40) came close to with 30.
	CaptureTimeout time.Duration
	// StartTimeout bounds starting the driver and the browser. Default 60 s (a hang bound).
	StartTimeout time.Duration
	// MaxConcurrent is how many captures (pairs count as one) run at once. Default 2.
	MaxConcurrent int
	// Args are extra Chromium flags, after the built-in ones.
	Args []string
	// SandboxUID is the host uid (and gid) the browser's sandbox runs as when this process
	// runs as root; inside, the browser is uid 1000. It must not be 0. Default
	// [DefaultSandboxUID], the id the local sandbox provider gives its sandboxes. Ignored
	// when this process does not run as root: the sandbox then runs as this process's user.
	SandboxUID int
	// Logger receives the package's logs. Default slog.Default().
	Logger *slog.Logger

	// direct runs the browser as it runs on systems other than Linux (no bubblewrap, the
	// pin proxies on the loopback): tests of that path set it on Linux.
	direct bool
}

// DefaultSandboxUID is the host uid and gid the browser's bubblewrap runs as when the host
// runs as root: unprivileged, outside the ranges distributions hand out, and next to, not
// the same as, the id the local sandbox provider gives its sandboxes (2100000000), so that
// a sandbox and the browser that renders its pages share nothing.
const DefaultSandboxUID = 2100000001

func (c Config) withDefaults() Config {
	if c.IdleBound <= 0 {
		c.IdleBound = 3 * time.Second
	}
	if c.NavigationTimeout <= 0 {
		c.NavigationTimeout = 10 * time.Second
	}
	if c.CaptureTimeout <= 0 {
		c.CaptureTimeout = time.Minute
	}
	if c.StartTimeout <= 0 {
		c.StartTimeout = time.Minute
	}
	if c.MaxConcurrent <= 0 {
		c.MaxConcurrent = 2
	}
	if c.SandboxUID <= 0 {
		c.SandboxUID = DefaultSandboxUID
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}
