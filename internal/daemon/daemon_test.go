//go:build linux || darwin

package daemon

import (
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"
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
