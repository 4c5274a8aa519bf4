//go:build linux || darwin

package daemon

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestListen: one daemon per directory; the socket is 0600; a dead daemon's socket is
// replaced; a directory open to others, or a link, is refused.
func TestListen(t *testing.T) {
	rt, err := os.MkdirTemp("", "th-daemon-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(rt)
	t.Setenv("XDG_RUNTIME_DIR", rt)
	dir, err := Dir()
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("Dir made %v (%v), want 0700", st.Mode().Perm(), err)
	}
	// A socket file left by a dead daemon.
	dead, err := net.Listen("unix", SocketPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	dead.(*net.UnixListener).SetUnlinkOnClose(false)
	dead.Close()

	ln, err := Listen(dir, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(SocketPath(dir)); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("the socket is %v (%v), want 0600", st.Mode().Perm(), err)
	}
	go func() { // owned by the test: ends when ln closes
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hi"))
			c.Close()
		}
	}()
	c, err := net.Dial("unix", SocketPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2)
	if _, err := c.Read(buf); err != nil || string(buf) != "hi" {
		t.Errorf("this user's connection: %q %v", buf, err)
	}
	c.Close()
	if _, err := Listen(dir, time.Second, nil); !errors.Is(err, ErrRunning) {
		t.Errorf("a second daemon: %v, want ErrRunning", err)
	}
	ln.Close()
	if _, err := os.Stat(SocketPath(dir)); !os.IsNotExist(err) {
		t.Errorf("the socket outlived Close: %v", err)
	}
	ln2, err := Listen(dir, time.Second, nil) // the lock was given up
	if err != nil {
		t.Fatal(err)
	}
	ln2.Close()

	os.Chmod(dir, 0o755)
	if _, err := Dir(); err == nil || !strings.Contains(err.Error(), "open to other users") {
		t.Errorf("a directory open to others: %v", err)
	}
	os.RemoveAll(dir)
	other := t.TempDir()
	if err := os.Symlink(other, dir); err != nil {
		t.Fatal(err)
	}
	if _, err := Dir(); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("a link: %v", err)
	}
}

// TestDialRefusesWhatIsNotTheDaemon: before connecting, the client checks the socket and
// its directory: a socket of another user, one open to others, a link or another kind of
// file in its place, or a directory open to others is refused (ErrUntrusted) and nothing
// connects to what listens there. This user's socket as the daemon makes it is dialled.
func TestDialRefusesWhatIsNotTheDaemon(t *testing.T) {
	rt, err := os.MkdirTemp("", "th-daemon-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(rt)
	t.Setenv("XDG_RUNTIME_DIR", rt)
	dir, err := Dir()
	if err != nil {
		t.Fatal(err)
	}
	sock := SocketPath(dir)
	ln, err := Listen(dir, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx := context.Background()
	dialled := func(what string) {
		t.Helper()
		c, err := DialContext(ctx, sock)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		c.Close()
		a, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		a.Close()
	}
	// nothingPending: no connection reached the listener (one accept(2) on its
	// non-blocking descriptor, which looks at the backlog only).
	nothingPending := func(what string) {
		t.Helper()
		raw, err := ln.Listener.(*net.UnixListener).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var aerr error
		raw.Control(func(fd uintptr) {
			var nfd int
			if nfd, _, aerr = unix.Accept(int(fd)); aerr == nil {
				unix.Close(nfd)
			}
		})
		if aerr == nil {
			t.Errorf("%s: the client connected", what)
		} else if !errors.Is(aerr, unix.EAGAIN) {
			t.Fatalf("accept: %v", aerr)
		}
	}
	refused := func(what, want string) {
		t.Helper()
		c, err := DialContext(ctx, sock)
		if err == nil {
			c.Close()
		}
		if !errors.Is(err, ErrUntrusted) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want ErrUntrusted saying %q", what, err, want)
		}
		nothingPending(what)
	}
	dialled("the daemon's own socket")

	os.Chmod(sock, 0o666)
	refused("a socket open to others", "open to other users")
	os.Chmod(sock, 0o600)
	os.Chmod(dir, 0o755)
	refused("a directory open to others", "open to other users")
	os.Chmod(dir, 0o700)
	dialled("the modes put back")

	// The listener's socket moved aside, a link to it in its place.
	aside := filepath.Join(dir, "aside.sock")
	if err := os.Rename(sock, aside); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(aside, sock); err != nil {
		t.Fatal(err)
	}
	refused("a link to a socket", "not a socket")
	os.Remove(sock)
	if err := os.WriteFile(sock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	refused("a regular file", "not a socket")
	os.Remove(sock)
	if err := os.Rename(aside, sock); err != nil {
		t.Fatal(err)
	}
	dialled("the socket back")

	if os.Geteuid() == 0 {
		os.Chown(sock, 65534, 65534)
		refused("a socket of another user", "uid 65534")
		os.Chown(sock, 0, 0)
		os.Chown(dir, 65534, 65534)
		refused("a directory of another user", "another user")
		os.Chown(dir, 0, 0)
		dialled("the owners put back")
	}
}
