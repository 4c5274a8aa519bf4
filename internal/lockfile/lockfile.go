//go:build linux

// Package lockfile proves ownership of shared host state between processes. Several
// toolhost processes (a serve, a few calls, one MCP server per editor) share the run and
// workspace directories, and each must be able to tell what a crashed process left behind
// from what a live one is using, without ever guessing.
//
// A lock file is a file locked with flock(2) by its owner for as long as the state it
// guards exists; the kernel drops the lock when the owner dies, however it dies. Two
// rules make that a proof rather than a guess:
//
//   - A lock file is locked from birth: it is created unnamed (O_TMPFILE), locked, filled
//     and only then linked at its path (linkat, which refuses an existing name), so no
//     other process can ever find it at its path unlocked while its owner lives. (On a
//     filesystem without O_TMPFILE the same is done under a private temporary name.)
//   - A lock file is removed only by the process that holds its lock, and a process that
//     takes a lock checks afterwards that the file it locked is still the one at the path
//     (the holder may have removed it meanwhile, and a new one may have taken its place).
//
// So a lock file found at its path whose lock can be taken belongs to a dead process, and
// whoever takes it may clean up what it guards, then remove it.
package lockfile

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// ErrHeld: a live process holds the lock.
var ErrHeld = errors.New("held by a live process")

// maxContent bounds what a lock file records (and what Stale reads back).
const maxContent = 256

// Lock is a held lock file.
type Lock struct {
	f    *os.File
	path string
}

// Create makes a lock file at path, locked from birth, recording content (at most 256
// bytes). It fails with an error wrapping fs.ErrExist when something is at path already,
// alive or dead: the caller decides (see Stale).
func Create(path string, content []byte) (*Lock, error) {
	if len(content) > maxContent {
		return nil, fmt.Errorf("lock file %s: content of %d bytes exceeds %d", path, len(content), maxContent)
	}
	dir := filepath.Dir(path)
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EISDIR) || errors.Is(err, unix.EINVAL) {
			return createNamed(path, content)
		}
		return nil, fmt.Errorf("lock file %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	if err := fill(f, content); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock file %s: %w", path, err)
	}
	// linkat of /proc/self/fd/N with AT_SYMLINK_FOLLOW names the unnamed file without the
	// capability AT_EMPTY_PATH needs; it refuses an existing path (EEXIST).
	if err := unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), unix.AT_FDCWD, path, unix.AT_SYMLINK_FOLLOW); err != nil {
		f.Close()
		if errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("lock file %s: %w", path, fs.ErrExist)
		}
		if errors.Is(err, unix.ENOENT) { // no /proc: name it the other way
			return createNamed(path, content)
		}
		return nil, fmt.Errorf("lock file %s: %w", path, err)
	}
	return &Lock{f: f, path: path}, nil
}

// createNamed is Create where O_TMPFILE is missing: the file is made under a temporary
// name nothing else looks at, locked, filled, hard-linked at path and its temporary name
// removed.
func createNamed(path string, content []byte) (*Lock, error) {
	var b [8]byte
	_, _ = rand.Read(b[:])
	tmp := filepath.Join(filepath.Dir(path), TempPrefix+hex.EncodeToString(b[:]))
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock file %s: %w", path, err)
	}
	defer os.Remove(tmp)
	if err := fill(f, content); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock file %s: %w", path, err)
	}
	if err := os.Link(tmp, path); err != nil {
		f.Close()
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("lock file %s: %w", path, fs.ErrExist)
		}
		return nil, fmt.Errorf("lock file %s: %w", path, err)
	}
	return &Lock{f: f, path: path}, nil
}

// TempPrefix starts the temporary names of createNamed; directory scans skip them.
const TempPrefix = ".lock-tmp-"

func fill(f *os.File, content []byte) error {
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return err
	}
	_, err := f.Write(content)
	return err
}

// Stale takes the lock file at path if its owner is dead: it returns the lock, now held
// by the caller, and what the file records. A live owner gives ErrHeld; no file at path
// gives an error wrapping fs.ErrNotExist. The caller cleans up what the lock guarded and
// then calls Remove.
func Stale(path string) (*Lock, []byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, nil, fmt.Errorf("lock file %s: %w", path, ErrHeld)
		}
		return nil, nil, fmt.Errorf("lock file %s: %w", path, err)
	}
	l := &Lock{f: f, path: path}
	// The holder may have removed the file between our open and our lock (and another may
	// have made a new one): then we hold a lock on nothing.
	if !l.current() {
		f.Close()
		return nil, nil, fmt.Errorf("lock file %s: %w", path, fs.ErrNotExist)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxContent))
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("lock file %s: %w", path, err)
	}
	return l, b, nil
}

// current reports whether the locked file is still the one at the path.
func (l *Lock) current() bool {
	var a, b unix.Stat_t
	return unix.Fstat(int(l.f.Fd()), &a) == nil && unix.Lstat(l.path, &b) == nil && a.Ino == b.Ino && a.Dev == b.Dev
}

// Path is where the lock file lives.
func (l *Lock) Path() string { return l.path }

// Remove unlinks the lock file, which the caller holds, and releases it: what it guarded
// is gone. Removing a file that is no longer at the path is not an error.
func (l *Lock) Remove() error {
	var err error
	if l.current() {
		if rerr := os.Remove(l.path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			err = fmt.Errorf("remove lock file: %w", rerr)
		}
	}
	return errors.Join(err, l.f.Close())
}

// Release lets the lock go and leaves the file: what it guards outlives this owner, and
// the next process to take the lock may clean it up.
func (l *Lock) Release() error { return l.f.Close() }
