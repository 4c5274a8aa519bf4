//go:build linux

package screenshot

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/toolhost/toolhost/internal/reexec"
	"github.com/toolhost/toolhost/internal/seccomp"
)

// The browser's sandbox.
//
// Playwright starts the browser itself (the driver spawns ExecutablePath with Chromium's
// arguments and speaks to it over --remote-debugging-pipe, descriptors 3 and 4), so the
// sandbox has to sit between the driver and Chromium. The ExecutablePath this package gives
// Playwright is this very binary, as /proc/<pid>/exe of the capturing process (always the
// exact code of the host, even if the file on disk was replaced since), and the launch
// environment makes it the wrapper: reexec.Main takes over at the start of main, prepares
// descriptors, drops to the sandbox uid when it runs as root, and replaces itself with
// bubblewrap. No wrapper process stays behind: the driver's child is bubblewrap itself.
//
// Inside, bubblewrap runs the forwarder, again this binary, re-executed from an inherited
// descriptor (/proc/self/fd/N) so that no host path of it is mounted anywhere. The
// forwarder listens on port forwardPort in the sandbox's network namespace, which has
// nothing but loopback, starts Chromium as its child with the pipe descriptors, and hands
// every connection Chromium makes to it, as a descriptor, over a unix socket the wrapper
// connected to the host's router (router.go) before the sandbox was made. The router passes
// it to the origin pin proxy of the browser context that dialled it: each context gets its
// own loopback address (127.x.y.z, random), which the forwarder reads off the accepted
// connection. So the browser reaches the pin proxies and nothing else, no socket or path of
// the host is visible inside, and the forwarder never copies a byte.

// Environment variables that turn this binary into the wrapper or the forwarder.
const (
	// envWrapper carries a wrapperConfig (JSON): run the wrapper instead of main. Playwright
	// passes it in the launch options' Env, which is the whole environment of the wrapper.
	envWrapper = "TOOLHOST_BROWSER_WRAPPER"
	// envForwarder carries "ROUTERFD,EXEFD": run the forwarder instead of main. bubblewrap
	// sets it inside the sandbox.
	envForwarder = "TOOLHOST_BROWSER_FORWARDER"
)

// bwrapPath is bubblewrap (Debian package bubblewrap). A variable so that a test can make it
// missing.
var bwrapPath = "/usr/bin/bwrap"

// The sandbox's layout and bounds.
const (
	sandboxID      = 1000 // the browser's uid and gid inside
	sandboxHome    = "/home/browser"
	sandboxProfile = sandboxHome + "/profile" // Chromium's --user-data-dir
	// forwardPort is where the forwarder listens inside; the browser contexts' proxies are
	// 127.x.y.z:forwardPort.
	forwardPort = 3128
	// Sizes of the sandbox's tmpfs mounts (memory, charged when used). Playwright passes
	// --disable-dev-shm-usage, so Chromium's shared memory lives in /tmp.
	sandboxTmpSize  = 256 << 20
	sandboxShmSize  = 64 << 20
	sandboxHomeSize = 64 << 20
)

// sandboxEtc are the host files bound read-only into the sandbox when present: what the
// loader, fontconfig, the time zone and TLS to an https preview need; nothing secret.
var sandboxEtc = []string{
	"/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives",
	"/etc/fonts", "/var/cache/fontconfig", "/etc/localtime",
	"/etc/ssl/certs", "/etc/ca-certificates",
}

// init registers the wrapper and the forwarder as this package's reexec helpers: a binary
// whose main calls reexec.Main (toolhost.Reexec) first becomes one of them when its
// variable is set. newBrowserNet refuses to launch the sandboxed browser without that entry
// point (reexec.Check).
func init() {
	reexec.Register(envWrapper, func(v string) int { return wrapperMain(v, os.Args[1:]) })
	reexec.Register(envForwarder, func(v string) int { return forwarderMain(v, os.Args[1:]) })
}

// wrapperConfig is what the capturer tells the wrapper, through envWrapper.
type wrapperConfig struct {
	Bwrap    string `json:"bwrap"`
	Chromium string `json:"chromium"` // absolute, symbolic links resolved
	Router   string `json:"router"`   // the host router's unix socket
	// UID is the host uid (and gid) bubblewrap runs as when the wrapper runs as root.
	UID int `json:"uid"`
}

// wrapperMain is the wrapper's whole life: it returns only when the sandbox could not be
// started, and its log goes to the driver, which shows it in the launch error.
func wrapperMain(raw string, args []string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	var cfg wrapperConfig
	err := json.Unmarshal([]byte(raw), &cfg)
	if err == nil {
		err = execSandbox(cfg, args)
	}
	log.Error("screenshot: starting the browser's sandbox failed", "err", err)
	return 1
}

// execSandbox replaces this process with bubblewrap running the forwarder and Chromium with
// args (Playwright's). It returns only on failure.
func execSandbox(cfg wrapperConfig, args []string) error {
	drop := os.Geteuid() == 0
	if drop && cfg.UID <= 0 {
		return fmt.Errorf("the browser's sandbox uid must be unprivileged, got %d", cfg.UID)
	}
	for _, fd := range []int{3, 4} { // Playwright's pipe
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return fmt.Errorf("descriptor %d (Playwright's pipe to the browser): %w", fd, err)
		}
	}
	var fds []int // ours, closed if exec fails
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	router, err := dialRouter(cfg.Router)
	if err != nil {
		return err
	}
	fds = append(fds, router)
	exe, err := forwarderExecutable(drop, cfg.UID)
	if err != nil {
		return err
	}
	fds = append(fds, exe)
	spec := sandboxSpec{chromium: cfg.Chromium, routerFD: router, exeFD: exe, seccompFD: -1, args: sandboxedArgs(args)}
	prog, err := seccompProgram()
	if err != nil {
		return fmt.Errorf("building the seccomp filter: %w", err)
	}
	if prog != nil {
		if spec.seccompFD, err = memfdData("browser-seccomp", prog); err != nil {
			return err
		}
		fds = append(fds, spec.seccompFD)
	}
	options, command := bwrapArgs(spec)
	argsFD, err := memfdData("browser-bwrap-args", nulJoin(options))
	if err != nil {
		return err
	}
	fds = append(fds, argsFD)

	// bubblewrap and the sandbox inherit exactly stdio, the pipe and ours.
	closeInherited(append([]int{3, 4}, fds...))
	for _, fd := range fds {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0); err != nil {
			return fmt.Errorf("clearing close-on-exec on descriptor %d: %w", fd, err)
		}
	}
	// Credentials are per thread in Linux; execve keeps the calling thread's. So drop them
	// on this (locked) thread only, and exec from it.
	goruntime.LockOSThread()
	if drop {
		if err := dropTo(cfg.UID); err != nil {
			return err
		}
	}
	argv := append([]string{"bwrap", "--args", strconv.Itoa(argsFD), "--"}, command...)
	err = syscall.Exec(cfg.Bwrap, argv, []string{})
	return fmt.Errorf("exec %s: %w", cfg.Bwrap, err)
}

// dropTo sets this thread's uid, gid and groups to id (no supplementary groups).
func dropTo(id int) error {
	if _, _, e := syscall.RawSyscall(syscall.SYS_SETGROUPS, 0, 0, 0); e != 0 {
		return fmt.Errorf("setgroups([]): %w", e)
	}
	if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESGID, uintptr(id), uintptr(id), uintptr(id)); e != 0 {
		return fmt.Errorf("setresgid(%d): %w", id, e)
	}
	if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESUID, uintptr(id), uintptr(id), uintptr(id)); e != 0 {
		return fmt.Errorf("setresuid(%d): %w", id, e)
	}
	return nil
}

// dialRouter connects to the host's router (as the host user, before any drop) and returns
// the descriptor, close-on-exec.
func dialRouter(path string) (int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("socket for the router: %w", err)
	}
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("connecting to the router at %s: %w", path, err)
	}
	return fd, nil
}

// forwarderExecutable returns a descriptor of this binary that the sandbox user can
// execute: the file itself when its mode lets uid (or, without drop, this user) run it,
// else a sealed in-memory copy.
func forwarderExecutable(drop bool, uid int) (int, error) {
	fd, err := unix.Open("/proc/self/exe", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("opening this executable: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("stat of this executable: %w", err)
	}
	if !drop || canExec(&st, uid) {
		return fd, nil
	}
	m, err := sealedCopy(fd, "toolhost-browser-forwarder")
	unix.Close(fd)
	return m, err
}

// canExec reports whether uid, with gid uid and no other group, may execute a file with st.
func canExec(st *unix.Stat_t, uid int) bool {
	switch {
	case int(st.Uid) == uid:
		return st.Mode&0o100 != 0
	case int(st.Gid) == uid:
		return st.Mode&0o010 != 0
	}
	return st.Mode&0o001 != 0
}

// sealedCopy copies the file at fd into a memfd that nobody can change any more, mode 0555.
func sealedCopy(fd int, name string) (int, error) {
	m, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_EXEC)
	if errors.Is(err, unix.EINVAL) { // kernels before 6.3 know no MFD_EXEC
		m, err = unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	}
	if err != nil {
		return -1, fmt.Errorf("memfd for a copy of this executable: %w", err)
	}
	err = copyFD(m, fd)
	if err == nil {
		err = unix.Fchmod(m, 0o555)
	}
	if err == nil {
		_, err = unix.FcntlInt(uintptr(m), unix.F_ADD_SEALS, unix.F_SEAL_SEAL|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE)
	}
	if err != nil {
		unix.Close(m)
		return -1, fmt.Errorf("copying this executable into a memfd: %w", err)
	}
	return m, nil
}

// copyFD copies src from its start to dst with plain reads and writes (raw descriptors: an
// *os.File would close them from its finalizer).
func copyFD(dst, src int) error {
	if _, err := unix.Seek(src, 0, io.SeekStart); err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	for {
		n, err := unix.Read(src, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if err := writeAll(dst, buf[:n]); err != nil {
			return err
		}
	}
}

func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// memfdData returns a close-on-exec descriptor from which the reader reads b: a memfd, so no
// size blocks the writer and no file exists anywhere.
func memfdData(name string, b []byte) (int, error) {
	fd, err := unix.MemfdCreate("toolhost-"+name, unix.MFD_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("memfd for %s: %w", name, err)
	}
	if err := writeAll(fd, b); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("writing %s: %w", name, err)
	}
	if _, err := unix.Seek(fd, 0, io.SeekStart); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("rewinding %s: %w", name, err)
	}
	return fd, nil
}

func nulJoin(a []string) []byte {
	var b strings.Builder
	for _, s := range a {
		b.WriteString(s)
		b.WriteByte(0)
	}
	return []byte(b.String())
}

// closeInherited closes every descriptor above 2 that lacks close-on-exec (inherited from a
// parent: everything Go opens has the flag) and is not in keep, so nothing of the host's
// reaches the sandbox by accident.
func closeInherited(keep []int) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd <= 2 || slices.Contains(keep, fd) {
			continue
		}
		if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil && flags&unix.FD_CLOEXEC == 0 {
			unix.Close(fd)
		}
	}
}

// seccompProgram is the seccomp filter bubblewrap installs before it runs the forwarder
// (and with it Chromium): internal/seccomp's, the one every toolhost sandbox gets. A nil
// program means none.
func seccompProgram() ([]byte, error) {
	return seccomp.Program()
}

// sandboxSpec is one browser sandbox.
type sandboxSpec struct {
	chromium  string   // the browser executable
	routerFD  int      // connected to the host's router
	exeFD     int      // this binary, run as the forwarder
	seccompFD int      // the filter, or -1
	args      []string // Chromium's arguments
}

// bwrapArgs builds bubblewrap's options, passed through --args so that the sandbox's pid 1,
// a fork of bubblewrap, shows none of them in /proc/1/cmdline, and the command, which
// bubblewrap 0.8 takes from its real command line only: the forwarder, the browser and its
// arguments (no host path among them but the browser's own).
func bwrapArgs(s sandboxSpec) (options, command []string) {
	id := strconv.Itoa(sandboxID)
	a := []string{
		// Every namespace, the network's included: the sandbox has only loopback.
		"--unshare-all", "--unshare-user", "--uid", id, "--gid", id,
		"--disable-userns", // no nested user namespaces, and with them no new capabilities
		"--die-with-parent", "--new-session", "--clearenv", "--cap-drop", "ALL",
		"--hostname", "browser",
		"--ro-bind", "/usr", "/usr",
	}
	// Merged-/usr systems make these symlinks into /usr; older ones have real directories.
	for _, d := range []string{"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"} {
		fi, err := os.Lstat(d)
		switch {
		case err != nil:
		case fi.Mode()&os.ModeSymlink != 0:
			if t, err := os.Readlink(d); err == nil {
				a = append(a, "--symlink", t, d)
			}
		case fi.IsDir():
			a = append(a, "--ro-bind", d, d)
		}
	}
	for _, f := range sandboxEtc {
		a = append(a, "--ro-bind-try", f, f)
	}
	if dir := filepath.Dir(s.chromium); dir != "/usr" && !strings.HasPrefix(dir, "/usr/") {
		a = append(a, "--ro-bind", dir, dir) // a browser installed elsewhere (/opt/...)
	}
	a = append(a,
		"--proc", "/proc",
		"--dev", "/dev",
		"--size", strconv.Itoa(sandboxShmSize), "--tmpfs", "/dev/shm",
		"--size", strconv.Itoa(sandboxTmpSize), "--tmpfs", "/tmp",
		"--size", strconv.Itoa(sandboxHomeSize), "--tmpfs", sandboxHome,
		// Everything else is read-only; the device nodes in /dev are their own mounts.
		"--remount-ro", "/dev",
		"--remount-ro", "/",
		"--chdir", sandboxHome,
		"--setenv", envForwarder, strconv.Itoa(s.routerFD)+","+strconv.Itoa(s.exeFD),
	)
	if s.seccompFD >= 0 {
		a = append(a, "--seccomp", strconv.Itoa(s.seccompFD))
	}
	command = append([]string{"/proc/self/fd/" + strconv.Itoa(s.exeFD), s.chromium}, s.args...)
	return a, command
}

// sandboxedArgs rewrites Playwright's Chromium arguments for the sandbox: the profile moves
// from the host directory Playwright made (removed here: it is empty, Chromium never sees
// it, and Playwright's own removal ignores a missing directory) to the sandbox's tmpfs, and
// everything goes through the forwarder.
func sandboxedArgs(args []string) []string {
	out := make([]string, 0, len(args)+4)
	for _, a := range args {
		if dir, ok := strings.CutPrefix(a, "--user-data-dir="); ok {
			if filepath.IsAbs(dir) && strings.HasPrefix(filepath.Base(dir), "playwright_chromiumdev_profile-") {
				_ = os.Remove(dir) // only if empty
			}
			continue
		}
		if strings.HasPrefix(a, "--proxy-server=") || strings.HasPrefix(a, "--proxy-bypass-list=") {
			continue // ours below
		}
		out = append(out, a)
	}
	return append(out,
		"--user-data-dir="+sandboxProfile,
		// The default for contexts without a proxy of their own: the forwarder, where an
		// address no context owns is refused. Loopback is proxied too.
		"--proxy-server=http://127.0.0.1:"+strconv.Itoa(forwardPort),
		"--proxy-bypass-list=<-loopback>",
		"--no-sandbox", // our bubblewrap is the sandbox; Chromium's needs user namespaces
	)
}
