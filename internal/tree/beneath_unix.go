//go:build !windows

package tree

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// Opening and replacing one path below a directory handle, never through a symbolic
// link at any part: what the in-sandbox agent's guarded reads and writes
// (sandbox.FileGuard.NoLinks) and the tree's Reader do. A swap by a process of the
// sandbox either happens before the open of its part (refused) or after (the handle
// already held is the real directory).

// ErrLink: a symbolic link where the path may have none (or a part swapped for one).
var ErrLink = errors.New("a symbolic link where the path may have none")

// LinkError names the part of a path that is a symbolic link.
type LinkError struct {
	// Path is the prefix of the path asked for that ends at the link.
	Path string
}

func (e *LinkError) Error() string { return e.Path + " is a symbolic link" }
func (e *LinkError) Unwrap() error { return ErrLink }

// OpenDirAt opens the directory name (one part) in d, never through a link: a link there,
// or a directory swapped for one meanwhile, fails with ErrLink; with create a missing one
// is made (0755).
func OpenDirAt(d *os.File, name string, create bool) (*os.File, error) {
	if err := checkPart(name, name); err != nil {
		return nil, err
	}
	fd, err := openDirAt(int(d.Fd()), name, create)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}

func openDirAt(dfd int, name string, create bool) (int, error) {
	for range 2 {
		fd, err := openDir(dfd, name, true)
		if err == nil {
			return fd, nil
		}
		if errors.Is(err, unix.ENOENT) && create {
			if err := unix.Mkdirat(dfd, name, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
				return -1, err
			}
			continue
		}
		return -1, classifyAt(dfd, name, err)
	}
	return -1, &fs.PathError{Op: "open", Path: name, Err: unix.ENOENT}
}

// classifyAt turns an open failure of name in dfd into ErrLink when name was a link:
// O_NOFOLLOW gives ELOOP for a last part that is one, and with O_DIRECTORY the kernel
// gives ENOTDIR. A look after the fact that finds a directory there means it was swapped
// meanwhile: a link too. Only what is still not a directory keeps ENOTDIR.
func classifyAt(dfd int, name string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("%s: %w", name, ErrLink)
	case errors.Is(err, unix.ENOTDIR):
		var st unix.Stat_t
		if unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
			if t := st.Mode & unix.S_IFMT; t == unix.S_IFLNK || t == unix.S_IFDIR {
				return fmt.Errorf("%s: %w", name, ErrLink)
			}
		}
	}
	return err
}

// OpenBeneath opens the directory rel (slash-separated, relative; "" is d itself) below
// d, never through a symbolic link at any part: in one openat2 with RESOLVE_BENEATH and
// RESOLVE_NO_SYMLINKS where the kernel has it, else, and to name the part that failed or
// to make missing ones (create), one part at a time with O_NOFOLLOW from d. A part that
// is a link fails with a *LinkError naming it.
func OpenBeneath(d *os.File, rel string, create bool) (*os.File, error) {
	fd, err := openBeneath(int(d.Fd()), rel, create)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), rel), nil
}

// useOpenat2 is false in tests of the walk part by part (a kernel before 5.6).
var useOpenat2 = true

func openBeneath(dfd int, rel string, create bool) (int, error) {
	if rel == "" {
		rel = "."
	}
	if rel != "." {
		// Every part a name below: a ".." would climb out in the walk part by part (where
		// openat2 is missing, or refused the path), an empty or "." part is not a clean path.
		for part := range strings.SplitSeq(rel, "/") {
			if err := checkPart(part, rel); err != nil {
				return -1, err
			}
		}
	}
	if useOpenat2 {
		if fd, err := openat2Beneath(dfd, rel); err == nil {
			return fd, nil
		}
	}
	if rel == "." {
		return openDir(dfd, ".", false)
	}
	fd, done := dfd, ""
	for part := range strings.SplitSeq(rel, "/") {
		next, err := openDirAt(fd, part, create)
		if fd != dfd {
			unix.Close(fd)
		}
		done += part
		if errors.Is(err, ErrLink) {
			return -1, &LinkError{Path: done}
		}
		if err != nil {
			return -1, err
		}
		fd, done = next, done+"/"
	}
	return fd, nil
}

// checkPart refuses a part of rel that names no entry below its directory: "", "." or
// "..", or one with a slash.
func checkPart(part, rel string) error {
	if part == "" || part == "." || part == ".." || strings.ContainsRune(part, '/') {
		return fmt.Errorf("%q: not a clean path below the directory (no .., no //, no leading /): %w", rel, ErrUnsafe)
	}
	return nil
}

// OpenAt opens name in d for reading, never through a link (one there fails with
// ErrLink) and never blocking on a fifo, and returns it with its Stat: what it opened may
// be of any type, the caller decides.
func OpenAt(d *os.File, name string) (*os.File, fs.FileInfo, error) {
	if err := checkPart(name, name); err != nil {
		return nil, nil, err
	}
	fd, err := openNoFollow(int(d.Fd()), name)
	if err != nil {
		return nil, nil, classifyAt(int(d.Fd()), name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, fi, nil
}

// openNoFollow opens name in dfd for reading with O_NOFOLLOW and, should it be a fifo,
// O_NONBLOCK (the open returns at once instead of waiting for a writer).
func openNoFollow(dfd int, name string) (int, error) {
	for {
		fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// ReplaceAt writes body to a new file in d and renames it over name, both relative to d:
// a reader never sees half a file, a link at name is replaced, never followed, and a
// failure leaves what was there. The new file gets mode.
func ReplaceAt(d *os.File, name string, mode fs.FileMode, body io.Reader) error {
	if err := checkPart(name, name); err != nil {
		return err
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	tmp := "." + name + ".toolhost-" + hex.EncodeToString(rnd[:])
	dfd := int(d.Fd())
	f, err := createAt(dfd, tmp, tmp)
	if err != nil {
		return fmt.Errorf("create a temporary file: %w", err)
	}
	_, err = io.Copy(f, body)
	if err == nil {
		err = f.Chmod(mode)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(dfd, tmp, dfd, name)
	}
	if err != nil {
		_ = unix.Unlinkat(dfd, tmp, 0)
		return err
	}
	return nil
}
