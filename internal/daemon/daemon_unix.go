//go:build unix

package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// checkPrivate refuses a path that is a link, not a directory, another user's, or open
// to group or others.
func checkPrivate(d string) error {
	st, err := os.Lstat(d)
	if err != nil {
		return fmt.Errorf("the session daemon's directory: %w", err)
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	switch {
	case !st.IsDir():
		return fmt.Errorf("the session daemon's directory %s is not a directory (a link?): remove it", d)
	case !ok || int(sys.Uid) != os.Geteuid():
		return fmt.Errorf("the session daemon's directory %s belongs to another user: remove it, or set XDG_RUNTIME_DIR", d)
	case st.Mode().Perm()&0o077 != 0:
		return fmt.Errorf("the session daemon's directory %s is open to other users (mode %v): chmod 700 it", d, st.Mode().Perm())
	}
	return nil
}

// Listener accepts connections on the daemon's socket from processes of this user only.
type Listener struct {
	net.Listener
	lock *os.File
	path string
	log  *slog.Logger
}

// Listen takes the daemon's lock in dir and listens on its socket (0600). It returns
// ErrRunning when another daemon holds the lock and answers on the socket; a daemon that
// holds the lock but no longer answers (it is exiting) is waited for, up to wait.
func Listen(dir string, wait time.Duration, log *slog.Logger) (*Listener, error) {
	if err := checkPrivate(dir); err != nil {
		return nil, err
	}
	lock, err := os.OpenFile(filepath.Join(dir, LockName), os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("the session daemon's lock: %w", err)
	}
	sock := SocketPath(dir)
	deadline := time.Now().Add(wait)
	for {
		err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			lock.Close()
			return nil, fmt.Errorf("the session daemon's lock: %w", err)
		}
		if c, err := net.DialTimeout("unix", sock, time.Second); err == nil {
			c.Close()
			lock.Close()
			return nil, ErrRunning
		}
		if time.Now().After(deadline) {
			lock.Close()
			return nil, fmt.Errorf("%w, but does not answer on %s", ErrRunning, sock)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The lock is ours: a socket file left there is a dead daemon's.
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		lock.Close()
		return nil, fmt.Errorf("removing a dead daemon's socket: %w", err)
	}
	old := syscall.Umask(0o177) // the socket is born 0600: no moment where another user could connect
	ln, err := net.Listen("unix", sock)
	syscall.Umask(old)
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("listening on %s: %w", sock, err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(true)
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Listener{Listener: ln, lock: lock, path: sock, log: log}, nil
}

// Accept returns the next connection whose peer runs as this process's user. Others are
// closed unanswered (and logged): the socket's mode keeps them out already, and this
// holds even if the mode was changed.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		uid, err := peerUID(c)
		if err == nil && uid == os.Geteuid() {
			return c, nil
		}
		l.log.Warn("session daemon: refused a connection from another user", "peer_uid", uid, "err", err)
		c.Close()
	}
}

// Close stops listening, removes the socket and gives the lock up.
func (l *Listener) Close() error {
	err := l.Listener.Close()
	l.lock.Close()
	return err
}

// Path is the socket's path.
func (l *Listener) Path() string { return l.path }

// Start starts exe with args as a daemon: in a session of its own (a terminal's hangup
// or Ctrl-C does not reach it), in dir, stdin from /dev/null and its output appended to
// logPath. It returns the process, which the caller may wait on to learn of an early
// exit; it lives on after the caller exits.
func Start(exe string, args, env []string, dir, logPath string) (*exec.Cmd, error) {
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("the session daemon's log: %w", err)
	}
	defer logf.Close()
	if st, err := logf.Stat(); err == nil && st.Size() > 8<<20 {
		logf.Truncate(0) // a log of past daemons, grown large: start it again
	}
	cmd := exec.Command(exe, args...)
	cmd.Env, cmd.Dir = env, dir
	cmd.Stdin = nil // /dev/null
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.WaitDelay = time.Second // its output is a file; a waiter is never held by a pipe
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the session daemon: %w", err)
	}
	return cmd, nil
}

// LogTail is the end of the daemon's log, for an error message when it did not start.
func LogTail(dir string, n int) string {
	b, err := os.ReadFile(LogPath(dir))
	if err != nil {
		return ""
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// DialContext connects to the daemon's socket sock, making sure that it is this user's
// daemon before the caller sends anything: the socket's directory must be private
// (checkPrivate), the socket a socket of this user's open to no one else, and the process
// listening on it (its peer credentials, as the kernel recorded them when it listened)
// this user or root. Otherwise it returns ErrUntrusted, having sent nothing. A sandbox
// that could write the directory (a workspace holding it, which the trust check refuses)
// might put its own socket there, as root even one whose file looks like root's; the
// credentials of the process behind it are its own. No socket there is no refusal: the
// dial's error says nothing listens.
func DialContext(ctx context.Context, sock string) (net.Conn, error) {
	if err := checkSocket(sock); err != nil {
		return nil, err
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, err
	}
	uid, err := peerUID(c)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("%w: reading the credentials of the process behind %s: %w", ErrUntrusted, sock, err)
	}
	if uid != os.Geteuid() && uid != 0 {
		c.Close()
		return nil, fmt.Errorf("%w: %s is served by a process of uid %d, not of this user (uid %d); nothing was sent to it. Stop that process, remove the socket, and make sure no sandbox's workspace holds %s",
			ErrUntrusted, sock, uid, os.Geteuid(), filepath.Dir(sock))
	}
	return c, nil
}

// checkSocket refuses sock when its directory is not private or it is not a socket of
// this user's that only this user may use. A socket (or directory) not there passes: the
// dial finds nothing to connect to.
func checkSocket(sock string) error {
	dir := filepath.Dir(sock)
	if err := checkPrivate(dir); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("%w: %w", ErrUntrusted, err)
	}
	st, err := os.Lstat(sock)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("the session daemon's socket: %w", err)
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	switch {
	case st.Mode().Type() != fs.ModeSocket:
		return fmt.Errorf("%w: %s is not a socket (%v): remove it", ErrUntrusted, sock, st.Mode().Type())
	case !ok || int(sys.Uid) != os.Geteuid():
		owner := -1
		if ok {
			owner = int(sys.Uid)
		}
		return fmt.Errorf("%w: %s belongs to uid %d, not to this user (uid %d): remove it, and make sure no sandbox's workspace holds %s",
			ErrUntrusted, sock, owner, os.Geteuid(), dir)
	case st.Mode().Perm()&0o077 != 0:
		return fmt.Errorf("%w: %s is open to other users (mode %v; the daemon makes it 0600): remove it", ErrUntrusted, sock, st.Mode().Perm())
	}
	return nil
}
