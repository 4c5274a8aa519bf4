package screenshot

import (
	"fmt"
	"net"
	"os"
	goruntime "runtime"

	"github.com/playwright-community/playwright-go"
)

// browserNet is the browser's way out: each capture gets a listener of its own, which its
// pin proxy (proxy.go) serves and whose URL is the capture's browser context's proxy.
// Linux's is the router of the browser's bubblewrap sandbox (router.go); elsewhere, and
// in the direct mode, it is the loopback (directNet).
type browserNet interface {
	listen() (pinListener, error)
	close()
}

// pinListener is one capture's listener.
type pinListener interface {
	net.Listener
	proxyURL() string
}

// directNet gives each capture a TCP listener on the loopback: the browser runs as a
// process of this user, not in bubblewrap (systems other than Linux), and reaches the
// pin proxies like any program of the machine. Chromium's own sandbox confines its
// renderers there; the pin still decides every connection a page makes.
type directNet struct{}

func (directNet) listen() (pinListener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listening on the loopback for the origin pin: %w", err)
	}
	return loopbackListener{ln}, nil
}

func (directNet) close() {}

type loopbackListener struct{ net.Listener }

func (l loopbackListener) proxyURL() string { return "http://" + l.Addr().String() }

// directLaunchOptions starts exe itself, with Chromium's own sandbox (which cannot run
// as root on Linux: there, only the direct mode of tests runs it, without).
func (c *Capturer) directLaunchOptions(exe string) playwright.BrowserTypeLaunchOptions {
	return playwright.BrowserTypeLaunchOptions{
		ExecutablePath:  playwright.String(exe),
		Headless:        playwright.Bool(true),
		Args:            append(append([]string(nil), baseArgs...), c.cfg.Args...),
		Timeout:         playwright.Float(float64(c.cfg.StartTimeout.Milliseconds())),
		HandleSIGINT:    playwright.Bool(false),
		HandleSIGTERM:   playwright.Bool(false),
		HandleSIGHUP:    playwright.Bool(false),
		ChromiumSandbox: playwright.Bool(!(goruntime.GOOS == "linux" && os.Geteuid() == 0)),
	}
}
