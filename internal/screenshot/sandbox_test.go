//go:build linux

package screenshot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image/color"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/playwright-community/playwright-go"
	"golang.org/x/sys/unix"
)

// Tests of the browser's sandbox. The ones that start Chromium look at it from the host
// (/proc of its processes) and from inside (what a page can reach); the others drive the
// pieces (bubblewrap's arguments, the router, the forwarder's hand-over, the sealed copy)
// on the real kernel without a browser.

// sandboxUIDWant is the host uid the browser must run as.
func sandboxUIDWant() int {
	if os.Geteuid() == 0 {
		return DefaultSandboxUID
	}
	return os.Getuid()
}

// statusField returns the fields of a line of /proc/pid/status ("Uid", "CapEff", ...).
func statusField(t *testing.T, pid int, name string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatalf("reading the status of pid %d: %v", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.Fields(v)
		}
	}
	return nil
}

// sandboxProcs returns the browser's sandbox processes: bubblewrap (outside), its pid 1,
// the forwarder and Chromium's processes, and which of them are Chromium's.
func sandboxProcs(t *testing.T, c *Capturer) (all []proc, forwarder proc, browser []proc) {
	t.Helper()
	pid := c.BrowserPID()
	self, ok := readProc(pid)
	if !ok {
		t.Fatalf("the browser's sandbox (pid %d) is not running", pid)
	}
	exe, err := c.executable()
	if err != nil {
		t.Fatal(err)
	}
	all = append([]proc{self}, descendants(pid)...)
	for _, p := range all {
		switch {
		case strings.HasPrefix(p.cmdline, "/proc/self/fd/"):
			forwarder = p
		case strings.HasPrefix(p.cmdline, exe+" "):
			browser = append(browser, p)
		}
	}
	if forwarder.pid == 0 || len(browser) < 2 {
		t.Fatalf("expected a forwarder and Chromium's processes under pid %d; found %+v", pid, all)
	}
	return all, forwarder, browser
}

// TestBrowserSandboxFromTheHost: every process of the browser runs as the sandbox uid with no
// group and no capability, in namespaces of its own, under the seccomp filter, with a
// network of loopback only and a root without the host's /tmp or home.
func TestBrowserSandboxFromTheHost(t *testing.T) {
	c := newCapturer(t, Config{})
	base := serve(t, appHandler())
	p, err := c.CapturePair(t.Context(), base, "/") // the preview loads
	if err != nil {
		t.Fatal(err)
	}
	checkShot(t, p.Desktop, Desktop, color.RGBA{12, 200, 34, 255})
	all, forwarder, browser := sandboxProcs(t, c)

	want := strconv.Itoa(sandboxUIDWant())
	for _, p := range all {
		for _, f := range []string{"Uid", "Gid"} {
			if got := statusField(t, p.pid, f); len(got) != 4 || slices.ContainsFunc(got, func(s string) bool { return s != want }) {
				t.Errorf("pid %d (%.60s): %s %v, want %s everywhere", p.pid, p.cmdline, f, got, want)
			}
		}
		if os.Geteuid() == 0 {
			if got := statusField(t, p.pid, "Groups"); len(got) != 0 {
				t.Errorf("pid %d (%.60s): supplementary groups %v", p.pid, p.cmdline, got)
			}
		}
	}
	prog, err := seccompProgram()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range append(browser, forwarder) {
		if got := statusField(t, p.pid, "CapEff"); len(got) != 1 || got[0] != "0000000000000000" {
			t.Errorf("pid %d (%.60s): effective capabilities %v", p.pid, p.cmdline, got)
		}
		if got := statusField(t, p.pid, "Seccomp"); prog != nil && (len(got) != 1 || got[0] != "2") {
			t.Errorf("pid %d (%.60s): Seccomp %v, want 2 (filter)", p.pid, p.cmdline, got)
		}
		for _, ns := range []string{"mnt", "net", "pid", "user", "ipc", "uts"} {
			mine, _ := os.Readlink("/proc/self/ns/" + ns)
			its, err := os.Readlink("/proc/" + strconv.Itoa(p.pid) + "/ns/" + ns)
			if err != nil || its == mine {
				t.Errorf("pid %d: %s namespace %q (err %v) is the host's %q", p.pid, ns, its, err, mine)
			}
		}
	}

	b := browser[0]
	root := "/proc/" + strconv.Itoa(b.pid) + "/root"
	// The network namespace has loopback only.
	dev, err := os.ReadFile("/proc/" + strconv.Itoa(b.pid) + "/net/dev")
	if err != nil {
		t.Fatal(err)
	}
	var ifaces []string
	for _, line := range strings.Split(string(dev), "\n")[2:] {
		if name, _, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			ifaces = append(ifaces, name)
		}
	}
	if !slices.Equal(ifaces, []string{"lo"}) {
		t.Errorf("network interfaces in the browser's namespace: %v, want [lo]", ifaces)
	}
	// The mount namespace: no host /tmp, /root or home; /usr is there.
	marker, err := os.CreateTemp("", "toolhost-browser-marker-")
	if err != nil {
		t.Fatal(err)
	}
	marker.Close()
	t.Cleanup(func() { os.Remove(marker.Name()) })
	for _, path := range []string{marker.Name(), "/root", "/etc/shadow", "/etc/passwd", c.rt.router.(*router).dir, "/work"} {
		if _, err := os.Lstat(root + path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is visible in the browser's sandbox (err %v)", path, err)
		}
	}
	if _, err := os.Stat(root + "/usr/share"); err != nil {
		t.Errorf("/usr/share is not visible in the sandbox (so the checks above prove nothing): %v", err)
	}
	home, err := os.ReadDir(root + "/home")
	if err != nil || len(home) != 1 || home[0].Name() != "browser" {
		t.Errorf("/home in the sandbox: %v (err %v), want only browser", home, err)
	}
	// No host path of ours in the sandbox's mount table: not the router's directory, not
	// this binary.
	mi, err := os.ReadFile("/proc/" + strconv.Itoa(b.pid) + "/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Executable()
	for _, host := range []string{c.rt.router.(*router).dir, exe, filepath.Dir(exe), os.TempDir() + "/"} {
		if strings.Contains(string(mi), " "+host) {
			t.Errorf("the sandbox's mountinfo shows %s:\n%s", host, mi)
		}
	}
	// Chromium (same uid) cannot look into the forwarder: it is not dumpable, so its /proc
	// entries belong to root, while Chromium's own belong to the sandbox user.
	for _, tc := range []struct {
		p    proc
		want int
	}{{forwarder, 0}, {b, sandboxUIDWant()}} {
		var st unix.Stat_t
		if err := unix.Stat("/proc/"+strconv.Itoa(tc.p.pid)+"/environ", &st); err != nil {
			t.Fatal(err)
		}
		if int(st.Uid) != tc.want && !(tc.want == 0 && os.Geteuid() != 0) {
			t.Errorf("/proc/%d/environ (%.40s) belongs to uid %d, want %d", tc.p.pid, tc.p.cmdline, st.Uid, tc.want)
		}
	}
	// The forwarder runs this binary: the file itself when the sandbox uid may execute it,
	// else a sealed copy in memory.
	if os.Geteuid() == 0 {
		var st unix.Stat_t
		if err := unix.Stat("/proc/self/exe", &st); err != nil {
			t.Fatal(err)
		}
		fexe, err := os.Readlink("/proc/" + strconv.Itoa(forwarder.pid) + "/exe")
		switch {
		case err != nil:
			t.Errorf("the forwarder's executable: %v", err)
		case canExec(&st, DefaultSandboxUID) && fexe != exe:
			t.Errorf("the forwarder runs %s, want this binary %s", fexe, exe)
		case !canExec(&st, DefaultSandboxUID) && !strings.HasPrefix(fexe, "/memfd:toolhost-browser-forwarder"):
			t.Errorf("the forwarder runs %s, want a sealed memfd copy (this binary's mode is %o)", fexe, st.Mode&0o7777)
		}
		t.Logf("the forwarder runs %s", fexe)
	}
	t.Logf("sandbox processes: %d; forwarder pid %d; browser pid %d (%s)", len(all), forwarder.pid, b.pid, want)
}

// newRawContext is a browser context of the running browser, without the origin pin
// (what a bug in the pin, or a page with its own proxy settings, would get), and a function
// that opens url in a new page of it and returns the page's HTML.
func newRawContext(t *testing.T, c *Capturer, opts playwright.BrowserNewContextOptions) func(url string) (playwright.Page, string, error) {
	t.Helper()
	rt, err := c.acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	bc, err := rt.browser.NewContext(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bc.Close() })
	return func(url string) (playwright.Page, string, error) {
		pg, err := bc.NewPage() // a new page each time: an error page would interrupt the next navigation
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pg.Goto(url, playwright.PageGotoOptions{Timeout: playwright.Float(10000)}); err != nil {
			return pg, "", err
		}
		body, err := pg.Content()
		return pg, body, err
	}
}

// TestBrowserSeesNoHostFiles: a page cannot load the host's secrets or /tmp, because they
// are not in the browser's mount namespace at all; the same page loads what is (/usr).
func TestBrowserSeesNoHostFiles(t *testing.T) {
	c := newCapturer(t, Config{})
	marker, err := os.CreateTemp("", "toolhost-browser-marker-")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(marker, "host secret")
	marker.Close()
	t.Cleanup(func() { os.Remove(marker.Name()) })
	open := newRawContext(t, c, playwright.BrowserNewContextOptions{})
	goTo := func(u string) (string, error) {
		_, body, err := open(u)
		return body, err
	}
	if body, err := goTo("file:///usr/share/"); err != nil || !strings.Contains(body, "fonts") {
		t.Fatalf("file:///usr/share/ (the control) = %.200q, %v", body, err)
	}
	for _, u := range []string{"file:///etc/shadow", "file:///root/", "file://" + marker.Name(), "file://" + c.rt.router.(*router).dir} {
		body, err := goTo(u)
		if err == nil || !strings.Contains(err.Error(), "ERR_FILE_NOT_FOUND") || strings.Contains(body, "host secret") {
			t.Errorf("%s: %.200q, %v; want net::ERR_FILE_NOT_FOUND", u, body, err)
		}
	}
	body, err := goTo("file:///etc/")
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{"shadow", "passwd", "hostname", "resolv.conf"} {
		if strings.Contains(body, secret) {
			t.Errorf("file:///etc/ lists %s", secret)
		}
	}
}

// TestBrowserNetworkOnlyThroughTheRouter: a browser context whose proxy settings let it
// connect directly (bypassing the origin pin) reaches nothing: not a server on the host's
// loopback, not an external address, no name resolves. Without a proxy of its own it gets
// the forwarder, which refuses an address no capture owns. Captures go on working.
func TestBrowserNetworkOnlyThroughTheRouter(t *testing.T) {
	c := newCapturer(t, Config{})
	var hits atomic.Int64
	host := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		html(w, 200, page("rgb(255, 0, 0)", "SECRET"))
	}))
	direct := newRawContext(t, c, playwright.BrowserNewContextOptions{
		Proxy: &playwright.Proxy{Server: "http://127.0.0.1:1", Bypass: playwright.String("*")},
	})
	// Chromium sees no interface but loopback and calls itself offline: so does the kernel.
	offline := []string{"ERR_INTERNET_DISCONNECTED", "ERR_NETWORK_UNREACHABLE", "ERR_ADDRESS_UNREACHABLE", "ERR_NAME_NOT_RESOLVED"}
	for _, tc := range []struct {
		url  string
		want []string
	}{
		// Connected directly (not to the proxy, which would be ERR_PROXY_CONNECTION_FAILED)
		// and refused: nothing listens on that port in the browser's namespace.
		{host.String() + "/", []string{"ERR_CONNECTION_REFUSED"}},
		{"http://1.1.1.1/", offline},
		{"http://example.com/", offline},
	} {
		_, _, err := direct(tc.url)
		if err == nil || !slices.ContainsFunc(tc.want, func(w string) bool { return strings.Contains(err.Error(), "net::"+w) }) {
			t.Errorf("direct %s: err = %v, want one of %v", tc.url, err, tc.want)
		}
	}
	// A page's own fetch, no-cors (an opaque answer counts as reaching the server).
	pg, _, err := direct("about:blank")
	if err != nil {
		t.Fatal(err)
	}
	res, err := pg.Evaluate(`u => fetch(u, {mode: 'no-cors'}).then(() => 'reached', e => 'failed: ' + e)`, host.String()+"/fetch")
	if err != nil || !strings.HasPrefix(fmt.Sprint(res), "failed") {
		t.Errorf("direct fetch: %v, %v", res, err)
	}

	unpinned := newRawContext(t, c, playwright.BrowserNewContextOptions{})
	_, _, err = unpinned(host.String() + "/")
	if err == nil || !strings.Contains(err.Error(), "net::ERR_") {
		t.Errorf("context without a proxy: err = %v, want a network error", err)
	}
	t.Logf("context without a proxy: %v", err)

	if n := hits.Load(); n != 0 {
		t.Errorf("the host's server saw %d requests from the browser", n)
	}
	p, err := c.CapturePair(t.Context(), serve(t, appHandler()), "/")
	if err != nil {
		t.Fatal(err)
	}
	checkShot(t, p.Mobile, Mobile, color.RGBA{12, 200, 34, 255})
}

// TestNoBubblewrap: without bubblewrap there is no browser; the error says what to install.
func TestNoBubblewrap(t *testing.T) {
	old := bwrapPath
	bwrapPath = filepath.Join(t.TempDir(), "bwrap")
	t.Cleanup(func() { bwrapPath = old })
	c := New(Config{Logger: testLogger(t)})
	defer c.Close(context.Background())
	if err := c.Check(); !errors.Is(err, ErrNoBrowser) || !strings.Contains(err.Error(), "bubblewrap") {
		t.Errorf("Check = %v, want ErrNoBrowser naming bubblewrap", err)
	}
	_, err := c.CapturePair(t.Context(), serve(t, appHandler()), "/")
	if !errors.Is(err, ErrNoBrowser) || !strings.Contains(err.Error(), "Debian package bubblewrap") {
		t.Errorf("CapturePair = %v, want ErrNoBrowser naming the package", err)
	}
	t.Log(err)
	if pid := c.BrowserPID(); pid != 0 {
		t.Errorf("a browser (pid %d) runs without bubblewrap", pid)
	}
}

func TestBwrapArgs(t *testing.T) {
	spec := sandboxSpec{chromium: "/usr/lib/chromium/chromium-headless-shell", routerFD: 5, exeFD: 6, seccompFD: 7,
		args: []string{"--headless", "--user-data-dir=" + sandboxProfile}}
	opts, cmd := bwrapArgs(spec)
	joined := " " + strings.Join(opts, " ") + " "
	for _, want := range []string{
		" --unshare-all ", " --unshare-user --uid 1000 --gid 1000 ", " --disable-userns ",
		" --die-with-parent ", " --new-session ", " --clearenv ", " --cap-drop ALL ",
		" --ro-bind /usr /usr ", " --proc /proc ", " --dev /dev ",
		" --size " + strconv.Itoa(sandboxTmpSize) + " --tmpfs /tmp ",
		" --size " + strconv.Itoa(sandboxShmSize) + " --tmpfs /dev/shm ",
		" --size " + strconv.Itoa(sandboxHomeSize) + " --tmpfs " + sandboxHome + " ",
		" --remount-ro / ", " --seccomp 7 ", " --setenv " + envForwarder + " 5,6 ",
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("bwrap options lack %q:%s", want, joined)
		}
	}
	for _, bad := range []string{"--share-net", "--bind ", "--dev-bind", " /root", " /home ", " /tmp /tmp", os.TempDir() + "/"} {
		if strings.Contains(joined, bad) {
			t.Errorf("bwrap options contain %q:%s", bad, joined)
		}
	}
	// Every bind is read-only and of a system directory or /etc file.
	for i, a := range opts {
		if a == "--ro-bind" || a == "--ro-bind-try" {
			src := opts[i+1]
			if src != "/usr" && !strings.HasPrefix(src, "/etc/") && !strings.HasPrefix(src, "/var/cache/fontconfig") && !slices.Contains([]string{"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}, src) {
				t.Errorf("unexpected bind of %s", src)
			}
		}
	}
	if !slices.Equal(cmd[:2], []string{"/proc/self/fd/6", spec.chromium}) || !slices.Equal(cmd[2:], spec.args) {
		t.Errorf("command %q", cmd)
	}
	// A browser outside /usr gets its directory, read-only, and nothing more.
	spec.chromium, spec.seccompFD = "/opt/chrome/chrome", -1
	opts, _ = bwrapArgs(spec)
	joined = " " + strings.Join(opts, " ") + " "
	if !strings.Contains(joined, " --ro-bind /opt/chrome /opt/chrome ") || strings.Contains(joined, "--seccomp") {
		t.Errorf("browser in /opt, no seccomp:%s", joined)
	}
}

func TestSandboxedArgs(t *testing.T) {
	profile, err := os.MkdirTemp("", "playwright_chromiumdev_profile-")
	if err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	got := sandboxedArgs([]string{"--headless", "--user-data-dir=" + profile, "--proxy-server=http://10.0.0.1:1", "--remote-debugging-pipe"})
	want := []string{"--headless", "--remote-debugging-pipe", "--user-data-dir=" + sandboxProfile,
		"--proxy-server=http://127.0.0.1:3128", "--proxy-bypass-list=<-loopback>", "--no-sandbox"}
	if !slices.Equal(got, want) {
		t.Errorf("sandboxedArgs = %q, want %q", got, want)
	}
	if _, err := os.Stat(profile); !errors.Is(err, os.ErrNotExist) {
		os.Remove(profile)
		t.Errorf("Playwright's empty host profile %s was not removed: %v", profile, err)
	}
	sandboxedArgs([]string{"--user-data-dir=" + other}) // not Playwright's: left alone
	if _, err := os.Stat(other); err != nil {
		t.Errorf("a directory that is not Playwright's profile was touched: %v", err)
	}
}

// fakeForwarder connects to the router as a wrapper does and sends what it is told.
func fakeForwarder(t *testing.T, r *router) *net.UnixConn {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: r.path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// tcpPair returns both ends of a TCP connection on the host's loopback.
func tcpPair(t *testing.T) (client, server *net.TCPConn) {
	t.Helper()
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.DialTCP("tcp4", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	server, err = ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func TestRouter(t *testing.T) {
	r, err := newRouter(testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(r.dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("router directory %s: %v, %v; want mode 0700", r.dir, st.Mode(), err)
	}
	pl, err := r.listen()
	if err != nil {
		t.Fatal(err)
	}
	l := pl.(*routeListener)
	if ip := l.Addr().(*net.TCPAddr).IP.To4(); ip[0] != 127 || ip[1] == 0 || !strings.HasSuffix(l.proxyURL(), ":3128") {
		t.Errorf("route address %v, proxy %s", ip, l.proxyURL())
	}
	fw := fakeForwarder(t, r)
	send := func(msg []byte, conn *net.TCPConn) {
		t.Helper()
		f, err := conn.File()
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, _, err := fw.WriteMsgUnix(msg, syscall.UnixRights(int(f.Fd())), nil); err != nil {
			t.Fatal(err)
		}
		conn.Close() // as the forwarder does: the host has its copy
	}

	// A connection to the listener's address reaches it, both ways.
	client, server := tcpPair(t)
	send(l.ip[:], server)
	got, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(got, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("read %q, %v", buf, err)
	}
	if _, err := got.Write([]byte("pong")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(client, buf); err != nil || string(buf) != "pong" {
		t.Fatalf("read %q, %v", buf, err)
	}
	got.Close()

	// An address nobody listens on: closed.
	client, server = tcpPair(t)
	send([]byte{127, 0, 0, 1}, server)
	client.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := client.Read(buf); err == nil {
		t.Errorf("a connection to an unrouted address was not closed (read %d bytes)", n)
	}

	// A closed listener: its address is free and its connections are closed.
	l.Close()
	client, server = tcpPair(t)
	send(l.ip[:], server)
	client.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := client.Read(buf); err == nil {
		t.Error("a connection to a closed route was not closed")
	}
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close: %v", err)
	}

	// A descriptor that is not a socket is closed, and the sandbox may go on.
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := fw.WriteMsgUnix([]byte{127, 1, 1, 1}, syscall.UnixRights(int(pw.Fd())), nil); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	pr.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := pr.Read(buf); !errors.Is(err, io.EOF) {
		t.Errorf("the pipe's write end stayed open in the router: %v", err)
	}
	pr.Close()

	// A malformed message ends that sandbox's connection.
	client, server = tcpPair(t)
	send([]byte{127, 1, 2, 3, 4}, server)
	fw.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := fw.Read(buf); !errors.Is(err, io.EOF) {
		t.Errorf("after a malformed message: read %v, want EOF (connection dropped)", err)
	}
	if _, err := client.Read(buf); err == nil {
		t.Error("the descriptor of a malformed message was not closed")
	}

	fw2 := fakeForwarder(t, r)
	r.close()
	fw2.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := fw2.Read(buf); err == nil {
		t.Error("close left a sandbox's connection open")
	}
	if _, err := os.Stat(r.dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("close left %s: %v", r.dir, err)
	}
	if _, err := r.listen(); err == nil {
		t.Error("listen after close succeeded")
	}
}

// TestForwarderHandOver: what the browser sends to the forwarder's port arrives, as the same
// connection, at the other end of its router socket, with the address dialled.
func TestForwarderHandOver(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]*net.UnixConn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "pair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c.(*net.UnixConn)
		defer c.Close()
	}
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); forward(ln, conns[0], testLogger(t)) }()
	defer func() { ln.Close(); <-done }()

	client, err := net.DialTCP("tcp4", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	buf, oob := make([]byte, 16), make([]byte, syscall.CmsgSpace(4))
	conns[1].SetReadDeadline(time.Now().Add(10 * time.Second))
	n, oobn, _, _, err := conns[1].ReadMsgUnix(buf, oob)
	if err != nil {
		t.Fatal(err)
	}
	got, err := parseRights(oob[:oobn])
	if err != nil || n != 4 || !bytes.Equal(buf[:4], []byte{127, 0, 0, 1}) || len(got) != 1 {
		t.Fatalf("message %v, %d descriptors, %v", buf[:n], len(got), err)
	}
	f := os.NewFile(uintptr(got[0]), "handed-over")
	defer f.Close()
	if _, err := client.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 5)
	if _, err := io.ReadFull(f, b); err != nil || string(b) != "hello" {
		t.Fatalf("read %q, %v", b, err)
	}
}

func TestCanExec(t *testing.T) {
	const u = DefaultSandboxUID
	for _, tc := range []struct {
		uid, gid uint32
		mode     uint32
		want     bool
	}{
		{0, 0, 0o755, true}, {0, 0, 0o750, false}, {0, 0, 0o700, false},
		{0, u, 0o750, true}, {0, u, 0o705, false}, {u, 0, 0o700, true}, {u, 0, 0o077, false},
	} {
		st := unix.Stat_t{Uid: tc.uid, Gid: tc.gid, Mode: unix.S_IFREG | tc.mode}
		if got := canExec(&st, u); got != tc.want {
			t.Errorf("canExec(%d:%d %o) = %v", tc.uid, tc.gid, tc.mode, got)
		}
	}
}

// TestSealedCopyRunsAsSandboxUser: a binary the sandbox user may not execute (mode 0700,
// root's) is handed over as a sealed memfd, which that user runs through /proc/self/fd.
func TestSealedCopyRunsAsSandboxUser(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI runs as root; this test needs root to start a process as the sandbox uid")
		}
		t.Skip("needs root: the memfd copy is made only when dropping to the sandbox uid")
	}
	src, err := os.ReadFile("/usr/bin/id")
	if err != nil {
		t.Fatal(err)
	}
	private := filepath.Join(t.TempDir(), "id")
	if err := os.WriteFile(private, src, 0o700); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(private, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	m, err := sealedCopy(fd, "toolhost-test")
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(m), "memfd")
	defer f.Close()
	if _, err := unix.Write(m, []byte("x")); !errors.Is(err, unix.EPERM) {
		t.Errorf("writing the sealed copy: %v, want EPERM", err)
	}
	link, _ := os.Readlink("/proc/self/fd/" + strconv.Itoa(m))
	if !strings.HasPrefix(link, "/memfd:toolhost-test") {
		t.Errorf("the copy is %s, not a memfd", link)
	}
	cmd := exec.Command("/proc/self/fd/3", "-u")
	cmd.ExtraFiles = []*os.File{f}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: DefaultSandboxUID, Gid: DefaultSandboxUID, Groups: []uint32{}}}
	out, err := cmd.Output()
	if err != nil || strings.TrimSpace(string(out)) != strconv.Itoa(DefaultSandboxUID) {
		t.Errorf("running the copy as the sandbox uid: %q, %v", out, err)
	}
	// The original is what that user could not run.
	cmd = exec.Command(private, "-u")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: DefaultSandboxUID, Gid: DefaultSandboxUID, Groups: []uint32{}}}
	if err := cmd.Run(); err == nil {
		t.Error("the sandbox uid ran a 0700 root binary: the control proves nothing")
	}
}

// BenchmarkSealedCopy: what the wrapper pays per browser start when this binary is not
// executable by the sandbox uid (copy into a sealed memfd).
func BenchmarkSealedCopy(b *testing.B) {
	fd, err := unix.Open("/proc/self/exe", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(st.Size)
	for b.Loop() {
		m, err := sealedCopy(fd, "toolhost-bench")
		if err != nil {
			b.Fatal(err)
		}
		unix.Close(m)
	}
}
