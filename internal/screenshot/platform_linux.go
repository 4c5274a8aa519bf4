package screenshot

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"

	"github.com/playwright-community/playwright-go"
	"github.com/toolhost/toolhost/internal/reexec"
)

// On Linux the browser runs in a bubblewrap sandbox of its own (sandbox.go), its network
// only the router's (router.go); Config's direct mode, for tests of the other systems'
// path, runs it as on them.

var defaultExecutables = []string{
	"/usr/lib/chromium/chromium-headless-shell", // the Debian wrappers in /usr/bin add a shell process
	"/usr/lib/chromium/chromium",
	"/usr/bin/chromium-headless-shell",
	"/usr/bin/chromium",
}

func (c *Capturer) checkSandbox() error {
	if c.cfg.direct {
		return nil
	}
	return checkBwrap()
}

func checkBwrap() error {
	if st, err := os.Stat(bwrapPath); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("%w: bubblewrap (%s) is missing: install the Debian package bubblewrap; the browser runs only inside it", ErrNoBrowser, bwrapPath)
	}
	return nil
}

func (c *Capturer) newBrowserNet() (browserNet, error) {
	if c.cfg.direct {
		return directNet{}, nil
	}
	if err := reexec.Check(); err != nil { // the wrapper is this binary, re-executed
		return nil, fmt.Errorf("the browser's sandbox: %w", err)
	}
	return newRouter(c.log)
}

// launchOptions makes Playwright start the browser exe in its sandbox, its network going
// through rtr: the executable Playwright runs is this process's own binary, which the
// environment turns into the wrapper (sandbox.go).
func (c *Capturer) launchOptions(exe string, n browserNet) playwright.BrowserTypeLaunchOptions {
	rtr, ok := n.(*router)
	if !ok {
		return c.directLaunchOptions(exe)
	}
	wc, _ := json.Marshal(wrapperConfig{Bwrap: bwrapPath, Chromium: exe, Router: rtr.path, UID: c.cfg.SandboxUID})
	return playwright.BrowserTypeLaunchOptions{
		ExecutablePath: playwright.String("/proc/" + strconv.Itoa(os.Getpid()) + "/exe"),
		Env:            map[string]string{envWrapper: string(wc)},
		Headless:       playwright.Bool(true),
		Args:           append(append([]string(nil), baseArgs...), c.cfg.Args...),
		Timeout:        playwright.Float(float64(c.cfg.StartTimeout.Milliseconds())),
		HandleSIGINT:   playwright.Bool(false),
		HandleSIGTERM:  playwright.Bool(false),
		HandleSIGHUP:   playwright.Bool(false),
		// Chromium's own sandbox needs user namespaces, which ours disables: ours is the sandbox.
		ChromiumSandbox: playwright.Bool(false),
	}
}
