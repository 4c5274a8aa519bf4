//go:build linux

package screenshot

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// handOverTimeout bounds one hand-over of a connection to the host's router.
const handOverTimeout = 10 * time.Second

// browserEnv is Chromium's whole environment in the sandbox.
var browserEnv = []string{
	"HOME=" + sandboxHome,
	"TMPDIR=/tmp",
	"PATH=/usr/bin:/bin",
	"LANG=C.UTF-8",
}

// forwarderMain is the forwarder's whole life inside the browser's sandbox (see sandbox.go):
// args are the browser executable and its arguments; the result is the browser's exit
// status. Its log goes to the driver (Chromium's stderr).
func forwarderMain(raw string, args []string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	code, err := runForwarder(raw, args, log)
	if err != nil {
		log.Error("screenshot: the browser sandbox's forwarder failed", "err", err)
		return 1
	}
	return code
}

func runForwarder(raw string, args []string, log *slog.Logger) (int, error) {
	// Chromium runs as the same uid: without this it could ptrace the forwarder, take its
	// descriptors or read its /proc entries (the host path of its executable among them).
	if _, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_DUMPABLE, 0, 0); e != 0 {
		return 0, fmt.Errorf("prctl(PR_SET_DUMPABLE, 0): %w", e)
	}
	os.Unsetenv(envForwarder)
	routerFD, exeFD, err := parseForwarderFDs(raw)
	if err != nil {
		return 0, err
	}
	if len(args) == 0 {
		return 0, errors.New("no browser executable given")
	}
	unix.Close(exeFD)
	// Chromium inherits stdio and the pipe only (ExtraFiles puts 3 and 4 back).
	markCloseOnExec()

	rf := os.NewFile(uintptr(routerFD), "router")
	c, err := net.FileConn(rf)
	rf.Close()
	if err != nil {
		return 0, fmt.Errorf("the router's descriptor %d: %w", routerFD, err)
	}
	router, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return 0, fmt.Errorf("the router's descriptor %d is a %T, not a unix socket", routerFD, c)
	}
	defer router.Close()
	// Every loopback address: each browser context dials its own 127.x.y.z. The namespace
	// has no other interface.
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4zero, Port: forwardPort})
	if err != nil {
		return 0, fmt.Errorf("listening on port %d: %w", forwardPort, err)
	}
	defer ln.Close()

	in, out := os.NewFile(3, "cdp-in"), os.NewFile(4, "cdp-out")
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = browserEnv
	cmd.Dir = sandboxHome
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.ExtraFiles = []*os.File{in, out}
	cmd.WaitDelay = 5 * time.Second // a renderer left holding stdout does not hold the forwarder
	err = cmd.Start()
	in.Close() // the browser holds the pipe now; its end closes when it exits
	out.Close()
	if err != nil {
		return 0, fmt.Errorf("starting %s: %w", args[0], err)
	}

	var wg sync.WaitGroup
	wg.Go(func() { forward(ln, router, log) }) // owned by runForwarder: ends when ln closes below
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	wg.Go(func() { // owned by runForwarder: ends when sigs is closed below
		for s := range sigs {
			_ = cmd.Process.Signal(s)
		}
	})
	werr := cmd.Wait()
	signal.Stop(sigs)
	close(sigs)
	ln.Close()
	wg.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal()), nil
	}
	if code := cmd.ProcessState.ExitCode(); code >= 0 {
		return code, nil
	}
	return 0, fmt.Errorf("waiting for the browser: %w", werr)
}

func parseForwarderFDs(raw string) (router, exe int, err error) {
	a, b, ok := strings.Cut(raw, ",")
	router, err1 := strconv.Atoi(a)
	exe, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || router < 5 || exe < 5 || router == exe {
		return 0, 0, fmt.Errorf("bad %s %q", envForwarder, raw)
	}
	return router, exe, nil
}

// markCloseOnExec sets close-on-exec on every descriptor above 2.
func markCloseOnExec() {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			unix.CloseOnExec(fd)
		}
	}
}

// forward hands every connection accepted on ln to the router until ln is closed.
func forward(ln *net.TCPListener, router *net.UnixConn, log *slog.Logger) {
	warned := false
	for {
		c, err := ln.AcceptTCP()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil { // out of descriptors, say: the browser retries
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if err := handOver(router, c); err != nil && !warned {
			log.Warn("screenshot: handing a browser connection to the host failed", "err", err)
			warned = true
		}
		c.Close() // the host holds its own copy now
	}
}

// handOver sends c's descriptor, with the loopback address the browser dialled, to the
// router: one message of 4 bytes (the IPv4 address) and one descriptor.
func handOver(router *net.UnixConn, c *net.TCPConn) error {
	la, _ := c.LocalAddr().(*net.TCPAddr)
	var ip net.IP
	if la != nil {
		ip = la.IP.To4()
	}
	if ip == nil {
		return fmt.Errorf("connection to %v: not an IPv4 address", c.LocalAddr())
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var werr error
	if err := router.SetWriteDeadline(time.Now().Add(handOverTimeout)); err != nil {
		return err
	}
	err = rc.Control(func(fd uintptr) {
		_, _, werr = router.WriteMsgUnix(ip, syscall.UnixRights(int(fd)), nil)
	})
	return errors.Join(err, werr)
}
