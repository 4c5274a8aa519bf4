// Package daemon is the per-user process that holds sessions between CLI calls: where
// its socket lives, how it listens (one process per user, a socket only the user can
// reach, every connection's peer credentials checked), and how a client starts it on
// demand.
//
// The daemon is `toolhost serve --socket PATH`; what it serves is package mcpserve's
// session API. This package knows nothing of sessions: only the socket and the process.
package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
)

// ErrUnsupported: this platform has no unix sockets with peer credentials; sessions held
// between CLI calls are not available here.
var ErrUnsupported = errors.New("sessions held by the session daemon need Linux or macOS (a unix socket with peer credentials)")

// ErrRunning: another daemon holds the lock of the directory.
var ErrRunning = errors.New("another session daemon of this user is running")

// Files of the daemon's directory.
const (
	SocketName = "daemon.sock"
	LockName   = "daemon.lock"
	LogName    = "daemon.log"
)

// Dir is the daemon's private directory: $XDG_RUNTIME_DIR/toolhost, else
// $TMPDIR/toolhost-UID. It is created 0700 when missing, and refused when it is not a
// directory of this user that only this user may enter (a directory another user
// prepared could hand them the socket).
func Dir() (string, error) {
	base, name := os.Getenv("XDG_RUNTIME_DIR"), "toolhost"
	if base == "" {
		base, name = os.TempDir(), "toolhost-"+strconv.Itoa(os.Geteuid())
	}
	d := filepath.Join(base, name)
	if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("the session daemon's directory: %w", err)
	}
	if err := checkPrivate(d); err != nil {
		return "", err
	}
	return d, nil
}

// SocketPath is the daemon's socket in dir.
func SocketPath(dir string) string { return filepath.Join(dir, SocketName) }

// LogPath is where a daemon started on demand writes its log.
func LogPath(dir string) string { return filepath.Join(dir, LogName) }
