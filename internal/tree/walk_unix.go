//go:build !windows

package tree

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Walk calls fn for every entry below dir, depth first, each directory's names in
// sorted order (so a parent always comes before its children). For a regular file, open
// reads it; fn need not call it. Below dir no path is ever resolved: each directory is
// opened relative to its parent's descriptor with O_NOFOLLOW, each entry's type is taken
// with fstatat(AT_SYMLINK_NOFOLLOW), so the tree may change under the walk, even
// maliciously, without the walk ever leaving it. Entries that vanish are left out
// silently; what a snapshot cannot hold is skipped and reported in the stats.
//
// An error from fn stops the walk and is returned.
func Walk(ctx context.Context, dir string, opts WalkOptions, fn func(e Entry, open Opener) error) (WalkStats, error) {
	opts.defaults()
	var st WalkStats
	root, err := openDir(unix.AT_FDCWD, dir, false)
	if err != nil {
		return st, fmt.Errorf("walk %s: %w", dir, err)
	}
	defer unix.Close(root)
	w := &walker{ctx: ctx, opts: opts, st: &st, fn: fn, entries: opts.Counted}
	if err := w.dir(root, ""); err != nil {
		return st, err
	}
	return st, nil
}

func openDir(dirfd int, name string, noFollow bool) (int, error) {
	flags := unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC
	if noFollow {
		flags |= unix.O_NOFOLLOW
	}
	for {
		fd, err := unix.Openat(dirfd, name, flags, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return -1, &fs.PathError{Op: "open", Path: name, Err: err}
		}
		return fd, nil
	}
}

// readNames reads a directory's names through its descriptor (which stays open: Readdirnames
// on a dup).
func readNames(fd int) ([]string, error) {
	dup, err := unix.Dup(fd)
	if err != nil {
		return nil, err
	}
	unix.CloseOnExec(dup)
	f := os.NewFile(uintptr(dup), "dir")
	defer f.Close()
	return f.Readdirnames(-1)
}

// dir walks the directory open as fd, whose path is rel ("" for the root).
func (w *walker) dir(fd int, rel string) error {
	if err := w.ctx.Err(); err != nil {
		return err
	}
	names, err := readNames(fd)
	if err != nil {
		if rel != "" && errors.Is(err, unix.ENOENT) {
			return nil // removed while being read
		}
		return fmt.Errorf("read directory %q: %w", rel, err)
	}
	slices.Sort(names)
	for _, name := range names {
		if slices.Contains(w.opts.Excludes, name) {
			continue
		}
		child := name
		if rel != "" {
			child = rel + "/" + name
		}
		var s unix.Stat_t
		if err := unix.Fstatat(fd, name, &s, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if !errors.Is(err, unix.ENOENT) {
				w.st.skip(child, "cannot be examined: "+err.Error())
			}
			continue
		}
		e := statEntry(child, &s)
		switch s.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if !w.admit(child) {
				continue
			}
			sub, err := openDir(fd, name, true)
			if err != nil {
				w.entries--
				w.vanishedOr(child, err)
				continue
			}
			w.st.Dirs++
			err = w.fn(e, nil)
			if err == nil {
				err = w.dir(sub, child)
			}
			unix.Close(sub)
			if err != nil {
				return err
			}
		case unix.S_IFREG:
			if !w.admit(child) {
				continue
			}
			if e.Size > w.opts.MaxBytes-w.st.Bytes {
				w.entries--
				w.st.skip(child, fmt.Sprintf("its %d bytes would take the snapshot past %d bytes, the most a restore accepts", e.Size, w.opts.MaxBytes))
				continue
			}
			w.st.Files++
			w.st.Bytes += e.Size
			if err := w.fn(e, openerAt(fd, name, child)); err != nil {
				return err
			}
		case unix.S_IFLNK:
			if !w.admit(child) {
				continue
			}
			target, err := readlinkat(fd, name)
			if err != nil {
				w.entries--
				if errors.Is(err, unix.EINVAL) {
					w.st.skip(child, "it changed type while being read")
				} else if !errors.Is(err, unix.ENOENT) {
					w.st.skip(child, "cannot be read: "+err.Error())
				}
				continue
			}
			clean, ok := CleanTarget(child, target)
			if !ok {
				w.entries--
				w.st.skip(child, "symbolic link to an absolute path or out of the tree")
				continue
			}
			e.Target = clean
			w.st.Symlinks++
			if err := w.fn(e, nil); err != nil {
				return err
			}
		default:
			w.st.skip(child, "not a regular file, directory or symbolic link")
		}
	}
	return nil
}

func (w *walker) vanishedOr(rel string, err error) {
	switch {
	case errors.Is(err, unix.ENOENT):
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR):
		w.st.skip(rel, "it changed into a symbolic link or another type while being read")
	default:
		w.st.skip(rel, "cannot be read: "+err.Error())
	}
}

func statEntry(p string, s *unix.Stat_t) Entry {
	e := Entry{Path: p, Mode: fs.FileMode(s.Mode) & fs.ModePerm, MTime: s.Mtim.Nano(), CTime: s.Ctim.Nano(), Ino: s.Ino}
	switch s.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		e.Type = Dir
	case unix.S_IFREG:
		e.Type, e.Size = File, s.Size
	case unix.S_IFLNK:
		e.Type, e.Mode = Symlink, 0o777
	}
	return e
}

func readlinkat(dfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
		if size > 1<<16 {
			return "", unix.ENAMETOOLONG
		}
	}
}

// openerAt opens name in the directory dfd; valid while the walk is in that directory.
func openerAt(dfd int, name, rel string) Opener {
	return func() (*os.File, Entry, error) { return openFile(dfd, name, rel) }
}

func openFile(dfd int, name, rel string) (*os.File, Entry, error) {
	// Should the entry have become a fifo, the open returns at once instead of waiting
	// for a writer (openNoFollow), and the fstat below refuses it.
	fd, err := openNoFollow(dfd, name)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENXIO) {
			return nil, Entry{}, fmt.Errorf("open %q: %w (%w)", rel, ErrChanged, err)
		}
		return nil, Entry{}, fmt.Errorf("open %q: %w", rel, err)
	}
	var s unix.Stat_t
	if err := unix.Fstat(fd, &s); err != nil {
		unix.Close(fd)
		return nil, Entry{}, fmt.Errorf("stat %q: %w", rel, err)
	}
	if s.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, Entry{}, fmt.Errorf("open %q: %w (no longer a regular file)", rel, ErrChanged)
	}
	return os.NewFile(uintptr(fd), rel), statEntry(rel, &s), nil
}

// Reader opens files of a tree by path after a walk: each parent directory is opened
// below the root's descriptor, never through a link (OpenBeneath). It keeps the last parent open, since files are asked for in path order. Not
// safe for concurrent use.
type Reader struct {
	root    int
	lastDir string
	lastFD  int
}

// NewReader opens dir as the root of the files to read.
func NewReader(dir string) (*Reader, error) {
	fd, err := openDir(unix.AT_FDCWD, dir, false)
	if err != nil {
		return nil, err
	}
	return &Reader{root: fd, lastFD: -1}, nil
}

// Open opens the regular file p (a path as Check accepts); see Opener.
func (r *Reader) Open(p string) (*os.File, Entry, error) {
	if err := CheckPath(p, 0); err != nil {
		return nil, Entry{}, err
	}
	dir, name := path.Split(p)
	dir = strings.TrimSuffix(dir, "/")
	dfd, err := r.dirFD(dir)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, ErrLink) || errors.Is(err, unix.ENOTDIR) {
			return nil, Entry{}, fmt.Errorf("open %q: %w (%w)", p, ErrChanged, err)
		}
		return nil, Entry{}, fmt.Errorf("open %q: %w", p, err)
	}
	return openFile(dfd, name, p)
}

func (r *Reader) dirFD(dir string) (int, error) {
	if dir == "" {
		return r.root, nil
	}
	if r.lastFD >= 0 && r.lastDir == dir {
		return r.lastFD, nil
	}
	if r.lastFD >= 0 {
		unix.Close(r.lastFD)
		r.lastFD = -1
	}
	fd, err := openBeneath(r.root, dir, false)
	if err != nil {
		return -1, err
	}
	r.lastDir, r.lastFD = dir, fd
	return fd, nil
}

// Close releases the descriptors.
func (r *Reader) Close() error {
	if r.lastFD >= 0 {
		unix.Close(r.lastFD)
		r.lastFD = -1
	}
	return unix.Close(r.root)
}
