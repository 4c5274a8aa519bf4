//go:build !linux

package screenshot

import (
	"os"
	"path/filepath"
	goruntime "runtime"

	"github.com/playwright-community/playwright-go"
)

// Elsewhere than Linux the browser runs as a process of this user with Chromium's own
// sandbox (no bubblewrap here), its pages pinned to their origin by the pin proxies on
// the loopback (directNet). What it shoots there is E2B's previews: the local sandbox
// provider is Linux's.

var defaultExecutables = otherExecutables()

func otherExecutables() []string {
	switch goruntime.GOOS {
	case "darwin":
		return []string{
			"/Applications/Google Chrome.app/Contents/MacOS/Google Chrome",
			"/Applications/Chromium.app/Contents/MacOS/Chromium",
		}
	case "windows":
		var out []string
		for _, env := range []string{"ProgramFiles", "ProgramFiles(x86)", "LocalAppData"} {
			if d := os.Getenv(env); d != "" {
				out = append(out, filepath.Join(d, "Google", "Chrome", "Application", "chrome.exe"))
			}
		}
		return out
	}
	return []string{"/usr/local/bin/chromium", "/usr/bin/chromium"}
}

func (c *Capturer) checkSandbox() error { return nil }

func (c *Capturer) newBrowserNet() (browserNet, error) { return directNet{}, nil }

func (c *Capturer) launchOptions(exe string, _ browserNet) playwright.BrowserTypeLaunchOptions {
	return c.directLaunchOptions(exe)
}
