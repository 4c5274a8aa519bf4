package screenshot

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/playwright-community/playwright-go"
)

// Flags on top of Playwright's own defaults (which already include --no-sandbox,
// --headless, --disable-background-networking, --disable-component-update, --no-first-run,
// --disable-dev-shm-usage, --disable-extensions and --disable-breakpad). The wrapper adds
// the sandbox's own (sandboxedArgs).
var baseArgs = []string{
	"--disable-gpu",
	"--disable-sync",
	"--disable-quic",
	"--disable-default-apps",
	// WebRTC may not send UDP that bypasses the context's proxy (the origin pin).
	"--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
}

// startMu serialises driver starts in this process, so the new driver child can be told
// apart from another Capturer's; claimed holds the driver pids already taken.
var (
	startMu   sync.Mutex
	claimedMu sync.Mutex
	claimed   = map[int]bool{}
)

func claim(pid int, on bool) {
	claimedMu.Lock()
	defer claimedMu.Unlock()
	if on {
		claimed[pid] = true
	} else {
		delete(claimed, pid)
	}
}

func isClaimed(pid int) bool {
	claimedMu.Lock()
	defer claimedMu.Unlock()
	return claimed[pid]
}

// Capturer captures pages in one shared browser. It is safe for concurrent use. The driver
// and the browser start on the first capture and are restarted when they die; Close stops
// them. The zero value is not usable; use [New].
type Capturer struct {
	cfg Config
	log *slog.Logger
	sem chan struct{}

	closing   chan struct{} // closed by Close: in-flight captures give up
	closeOnce sync.Once
	work      sync.WaitGroup // start goroutines and in-flight captures

	mu       sync.Mutex
	closed   bool
	starting chan struct{} // non-nil while a start runs; closed when it ends
	startErr error
	rt       *runtime // nil until started
}

// runtime is one driver and its browser.
type runtime struct {
	pw         *playwright.Playwright
	browser    playwright.Browser
	router     browserNet // the browser's only way out
	driverPID  int
	browserPID int // bubblewrap, the driver's child; the browser runs inside
	version    string
	dead       atomic.Bool // set when a capture saw the browser fail; acquire replaces it

	// Pages made ahead, one per viewport of the pair (warm.go).
	warmMu     sync.Mutex
	warm       map[string]*warmSlot
	warmClosed bool
}

// New returns a Capturer. Nothing starts until the first capture.
func New(cfg Config) *Capturer {
	cfg = cfg.withDefaults()
	return &Capturer{
		cfg:     cfg,
		log:     cfg.Logger,
		sem:     make(chan struct{}, cfg.MaxConcurrent),
		closing: make(chan struct{}),
	}
}

// Check reports, without starting anything, whether the browser, the driver and
// bubblewrap (the browser's sandbox) are installed; the error wraps [ErrNoBrowser] and says
// what is missing.
func (c *Capturer) Check() error {
	if err := c.checkSandbox(); err != nil {
		return err
	}
	if _, err := c.executable(); err != nil {
		return err
	}
	_, err := c.driverDir()
	return err
}

// executable returns the browser binary with symbolic links resolved (the sandbox shows
// /usr and the browser's own directory only).
func (c *Capturer) executable() (string, error) {
	if p := c.cfg.ExecutablePath; p != "" {
		if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return "", fmt.Errorf("%w: Chromium executable %s is missing or not executable", ErrNoBrowser, p)
		}
		return resolveExecutable(p)
	}
	for _, p := range defaultExecutables {
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return resolveExecutable(p)
		}
	}
	return "", fmt.Errorf("%w: no Chromium found (looked for %s)", ErrNoBrowser, strings.Join(defaultExecutables, ", "))
}

func resolveExecutable(p string) (string, error) {
	abs, err := filepath.Abs(p)
	if err == nil {
		abs, err = filepath.EvalSymlinks(abs)
	}
	if err != nil {
		return "", fmt.Errorf("%w: resolving the Chromium executable %s: %w", ErrNoBrowser, p, err)
	}
	return abs, nil
}

// DriverVersion is the Playwright driver version playwright-go pins (npm playwright-core).
func DriverVersion() string {
	d, err := playwright.NewDriver(&playwright.RunOptions{DriverDirectory: os.DevNull, Verbose: false})
	if err != nil {
		return ""
	}
	return d.Version
}

func (c *Capturer) driverDir() (string, error) {
	v := DriverVersion()
	dir := c.cfg.DriverDir
	if dir == "" {
		dir = os.Getenv("PLAYWRIGHT_DRIVER_PATH")
	}
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("%w: no driver directory and no home directory: %w", ErrNoBrowser, err)
		}
		dir = filepath.Join(home, ".cache", "ms-playwright-go", v)
	}
	pj, err := os.ReadFile(filepath.Join(dir, "package", "package.json"))
	if err != nil {
		return "", fmt.Errorf("%w: the Playwright driver (npm playwright-core %s) is not in %s", ErrNoBrowser, v, dir)
	}
	if !strings.Contains(string(pj), `"version": "`+v+`"`) {
		return "", fmt.Errorf("%w: the Playwright driver in %s is not playwright-core %s", ErrNoBrowser, dir, v)
	}
	node := os.Getenv("PLAYWRIGHT_NODEJS_PATH")
	if node == "" {
		node = filepath.Join(dir, "node")
	}
	if _, err := os.Stat(node); err != nil {
		return "", fmt.Errorf("%w: no node at %s", ErrNoBrowser, node)
	}
	return dir, nil
}

// acquire returns a connected browser, starting or restarting the driver and browser as
// needed. Waiting is bounded by ctx; a start outlives a caller that gives up and is kept.
func (c *Capturer) acquire(ctx context.Context) (*runtime, error) {
	for attempt := 0; ; attempt++ {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, ErrClosed
		}
		if rt := c.rt; rt != nil && rt.browser.IsConnected() && !rt.dead.Load() {
			c.mu.Unlock()
			return rt, nil
		}
		if c.starting == nil {
			if attempt >= 2 {
				err := c.startErr
				c.mu.Unlock()
				if err == nil {
					err = fmt.Errorf("%w: the browser disconnected right after starting", ErrBrowser)
				}
				return nil, err
			}
			old := c.rt
			c.rt = nil
			c.starting = make(chan struct{})
			c.work.Add(1)
			go c.start(c.starting, old) // owned by c: Close waits on c.work
		}
		ch := c.starting
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			if cause := context.Cause(ctx); errors.Is(cause, ErrClosed) {
				return nil, cause
			}
			return nil, fmt.Errorf("%w: starting the browser: %w", ErrTimeout, ctx.Err())
		case <-c.closing:
			return nil, ErrClosed
		}
		c.mu.Lock()
		err := c.startErr
		c.mu.Unlock()
		if err != nil {
			return nil, err
		}
	}
}

// start tears down old (a dead runtime), starts a new one and publishes it (or the error).
func (c *Capturer) start(done chan struct{}, old *runtime) {
	defer c.work.Done()
	if old != nil {
		c.log.Warn("screenshot: browser disconnected; restarting", "browser_pid", old.browserPID)
		c.stopRuntime(old, 10*time.Second)
	}
	t0 := time.Now()
	rt, err := c.launch()
	if err == nil {
		// Its pages start now, before anyone can take it: the capture waiting for this
		// start takes them instead of making its own beside them (warm.go).
		c.warmUp(rt, warmViewports...)
	}
	c.mu.Lock()
	closed := c.closed
	if err == nil && !closed {
		c.rt = rt
	}
	c.startErr = err
	c.starting = nil
	c.mu.Unlock()
	close(done)
	if err == nil && closed {
		c.stopRuntime(rt, 10*time.Second)
		return
	}
	if err != nil {
		c.log.Error("screenshot: starting the browser failed", "err", err)
		return
	}
	c.log.Info("screenshot: browser started", "version", rt.version, "driver_pid", rt.driverPID,
		"browser_pid", rt.browserPID, "elapsed", time.Since(t0).Round(time.Millisecond))
}

func (c *Capturer) launch() (*runtime, error) {
	if err := c.checkSandbox(); err != nil {
		return nil, err
	}
	exe, err := c.executable()
	if err != nil {
		return nil, err
	}
	dir, err := c.driverDir()
	if err != nil {
		return nil, err
	}
	startMu.Lock()
	defer startMu.Unlock()

	// playwright.Run is not cancellable; a watchdog kills the driver if it hangs, which
	// makes Run return.
	var (
		wmu       sync.Mutex
		driverPID int
		finished  bool
	)
	findDriver := func() int {
		wmu.Lock()
		defer wmu.Unlock()
		if driverPID == 0 {
			driverPID = findDriverChild(dir)
		}
		return driverPID
	}
	watchdog := time.AfterFunc(c.cfg.StartTimeout, func() {
		wmu.Lock()
		f := finished
		wmu.Unlock()
		if !f {
			if pid := findDriver(); pid > 0 {
				c.log.Error("screenshot: driver start timed out; killing it", "pid", pid)
				killTree(pid)
			}
		}
	})
	defer watchdog.Stop()

	pw, err := runDriver(dir)
	if err != nil {
		wmu.Lock()
		finished = true
		wmu.Unlock()
		if pid := findDriver(); pid > 0 {
			killTree(pid)
		}
		return nil, fmt.Errorf("%w: starting the Playwright driver in %s: %w", ErrBrowser, dir, err)
	}
	pid := findDriver()
	claim(pid, true)
	rt := &runtime{pw: pw, driverPID: pid}

	rt.router, err = c.newBrowserNet()
	if err == nil {
		rt.browser, err = c.launchBrowser(pw, exe, rt.router)
	}
	wmu.Lock()
	finished = true
	wmu.Unlock()
	if err != nil {
		c.stopRuntime(rt, 10*time.Second)
		return nil, fmt.Errorf("%w: launching %s in its sandbox: %w", ErrBrowser, exe, err)
	}
	rt.version = rt.browser.Version()
	for _, p := range descendants(pid) {
		if p.ppid == pid {
			rt.browserPID = p.pid
			break
		}
	}
	rt.browser.OnDisconnected(func(playwright.Browser) {
		c.log.Debug("screenshot: browser disconnected", "browser_pid", rt.browserPID)
	})
	return rt, nil
}

// launchBrowser launches the browser in its sandbox, once more if it died while it started
// (Playwright says "target closed": a Chromium that crashed before its first page, seen on
// a loaded machine), never more: a browser that cannot start twice is reported.
func (c *Capturer) launchBrowser(pw *playwright.Playwright, exe string, router browserNet) (playwright.Browser, error) {
	b, err := pw.Chromium.Launch(c.launchOptions(exe, router))
	if err != nil && errors.Is(err, playwright.ErrTargetClosed) {
		c.log.Warn("screenshot: the browser died while it started; launching it again", "err", err)
		b, err = pw.Chromium.Launch(c.launchOptions(exe, router))
	}
	return b, err
}

// runDriver starts the driver with neither Stderr nor Logger set: setting Stderr alone
// redirects the standard library's global log, and Logger replaces a global in
// playwright-go. The driver's stderr is this process's stderr (quiet unless DEBUG=pw:*).
func runDriver(dir string) (pw *playwright.Playwright, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("playwright-go panicked: %v", r)
		}
	}()
	return playwright.Run(&playwright.RunOptions{
		DriverDirectory:     dir,
		SkipInstallBrowsers: true,
		Verbose:             false,
	})
}

// findDriverChild finds this process's unclaimed child running the driver from dir.
func findDriverChild(dir string) int {
	self := os.Getpid()
	cli := filepath.Join(dir, "package", "cli.js")
	for _, p := range procs() {
		if p.ppid == self && !isClaimed(p.pid) && strings.Contains(p.cmdline, cli) && strings.HasSuffix(p.cmdline, "run-driver") {
			return p.pid
		}
	}
	return 0
}

// stopRuntime closes the browser and the driver, killing them if they do not stop within
// bound, and waits until their processes are gone (bounded too).
func (c *Capturer) stopRuntime(rt *runtime, bound time.Duration) {
	if rt == nil {
		return
	}
	// Remember every process to wait for before anything exits and gets re-parented.
	var watch []int
	if rt.driverPID > 0 {
		watch = append(watch, rt.driverPID)
		for _, p := range descendants(rt.driverPID) {
			watch = append(watch, p.pid)
		}
	}
	rt.closeWarm()
	done := make(chan struct{})
	go func() { // owned by stopRuntime, which waits for it below
		defer close(done)
		defer func() { _ = recover() }()
		if rt.browser != nil {
			_ = rt.browser.Close()
		}
		_ = rt.pw.Stop()
	}()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		c.log.Warn("screenshot: browser and driver did not stop in time; killing them",
			"driver_pid", rt.driverPID, "browser_pid", rt.browserPID)
		for _, pid := range watch {
			killTree(pid)
		}
		<-done // Stop returns once the driver is dead (its stdout closes)
	}
	// Chromium's helpers may outlive the driver for a moment; then they are orphans.
	deadline := time.Now().Add(5 * time.Second)
	for {
		var left []int
		for _, pid := range watch {
			if alive(pid) {
				left = append(left, pid)
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			c.log.Warn("screenshot: killing leftover browser processes", "pids", left)
			for _, pid := range left {
				killTree(pid)
			}
			deadline = time.Now().Add(5 * time.Second)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		time.Sleep(20 * time.Millisecond)
	}
	claim(rt.driverPID, false)
	if rt.router != nil {
		rt.router.close()
	}
}

// Close stops in-flight captures, then the browser and the driver, and waits until no
// process of theirs is left. It is bounded by ctx (after which it kills what is left) and
// safe to call more than once.
func (c *Capturer) Close(ctx context.Context) error {
	c.closeOnce.Do(func() { close(c.closing) })
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()

	waited := make(chan struct{})
	go func() { // owned by Close: ends when the captures and starts have ended
		c.work.Wait()
		close(waited)
	}()
	var err error
	select {
	case <-waited:
	case <-ctx.Done():
		err = fmt.Errorf("screenshot: close: waiting for captures: %w", ctx.Err())
	}

	c.mu.Lock()
	rt := c.rt
	c.rt = nil
	c.mu.Unlock()
	bound := 10 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		bound = max(time.Until(dl), 100*time.Millisecond)
	}
	c.stopRuntime(rt, bound)
	if err != nil {
		<-waited // in-flight work fails fast once the browser is gone
	}
	return err
}

// Start starts the driver and the browser now rather than on the first capture (to take
// the start-up cost off that capture). Waiting is bounded by ctx; the start goes on if ctx
// ends first.
func (c *Capturer) Start(ctx context.Context) error {
	_, err := c.acquire(ctx)
	return err
}

// BrowserPID returns the process id of the browser's sandbox (bubblewrap, which the driver
// started and which holds the browser), or 0 when no browser runs.
func (c *Capturer) BrowserPID() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rt == nil {
		return 0
	}
	return c.rt.browserPID
}

// errIsTimeout reports whether a playwright error is a timeout.
func errIsTimeout(err error) bool {
	return errors.Is(err, playwright.ErrTimeout)
}
