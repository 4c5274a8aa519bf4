// Package daemon is the per-user process that holds sessions between CLI calls: where
// its socket lives, how it listens (one process per user, a socket only the user can
// reach, every connection's peer credentials checked), how a client starts it on demand,
// and how a client dials it (checking, before it sends anything, that what listens is
// this user's daemon).
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
	"runtime"
	"slices"
	"strconv"
)

// ErrUnsupported: this platform has no unix sockets with peer credentials; sessions held
// between CLI calls are not available here.
var ErrUnsupported = errors.New("sessions held by the session daemon need Linux or macOS (a unix socket with peer credentials)")

// ErrRunning: another daemon holds the lock of the directory.
var ErrRunning = errors.New("another session daemon of this user is running")

// ErrUntrusted: what is at the daemon's socket is not this user's daemon (the socket or
// its directory is another user's, open to others or not a socket; or a process of
// another user listens on it). DialContext sent it nothing.
var ErrUntrusted = errors.New("the session daemon's socket is not this user's daemon")

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
	d := dirPath()
	if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("the session daemon's directory: %w", err)
	}
	if err := checkPrivate(d); err != nil {
		return "", err
	}
	return d, nil
}

// dirPath is where Dir is, by this process's environment.
func dirPath() string {
	if rt := os.Getenv("XDG_RUNTIME_DIR"); rt != "" {
		return filepath.Join(rt, "toolhost")
	}
	return tempDir()
}

// tempDir is the daemon's directory when there is no XDG_RUNTIME_DIR.
func tempDir() string { return filepath.Join(os.TempDir(), "toolhost-"+strconv.Itoa(os.Geteuid())) }

// Dirs are the directories where a session daemon of this user may listen, whichever
// environment started it: Dir's, $TMPDIR/toolhost-UID (where a daemon started without
// XDG_RUNTIME_DIR listens) and, on Linux, /run/user/UID/toolhost (where one started from
// a login session does). None is created. A sandbox that reached one of them would reach
// a daemon that runs anything on any host directory for whoever connects as this user, so
// no workspace may hold one (the root package's CheckWorkspace).
func Dirs() []string {
	ds := []string{dirPath(), tempDir()}
	if runtime.GOOS == "linux" {
		ds = append(ds, filepath.Join("/run/user", strconv.Itoa(os.Geteuid()), "toolhost"))
	}
	return slices.Compact(ds)
}

// SocketPath is the daemon's socket in dir.
func SocketPath(dir string) string { return filepath.Join(dir, SocketName) }

// LogPath is where a daemon started on demand writes its log.
func LogPath(dir string) string { return filepath.Join(dir, LogName) }
