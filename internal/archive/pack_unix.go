//go:build !windows

package archive

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/toolhost/toolhost/internal/tree"
)

// openPackRoot opens the directory Pack reads (following a link there: it is the
// caller's).
func openPackRoot(dir string) (*os.File, error) { return openDir(unix.AT_FDCWD, dir, false) }

// openDir opens name (relative to the directory dirfd) as a directory; with noFollow, a
// symbolic link there is refused instead of followed.
func openDir(dirfd int, name string, noFollow bool) (*os.File, error) {
	flags := unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC
	if noFollow {
		flags |= unix.O_NOFOLLOW
	}
	fd, err := openat(dirfd, name, flags)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}

func openat(dirfd int, name string, flags int) (int, error) {
	for {
		fd, err := unix.Openat(dirfd, name, flags, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return -1, &fs.PathError{Op: "openat", Path: name, Err: err}
		}
		return fd, nil
	}
}

// dir writes the directory d (rel to the root, "." for the root) and everything below it,
// depth first, entries sorted by name. d stays open while its entries are written: every
// child is opened relative to it.
func (p *packer) dir(d *os.File, rel string) error {
	if err := p.ctx.Err(); err != nil {
		return err
	}
	fi, err := d.Stat()
	if err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	if err != nil {
		if rel != "." && errors.Is(err, unix.ENOENT) {
			return errVanished // removed while being read
		}
		return fmt.Errorf("read directory %s: %w", rel, err)
	}
	if err := p.writeHeader(rel, fi, ""); err != nil {
		return err
	}
	p.st.Dirs++
	slices.Sort(names)
	dfd := int(d.Fd())
	for _, name := range names {
		if slices.Contains(p.excludes, name) {
			continue
		}
		child := name
		if rel != "." {
			child = rel + "/" + name
		}
		var st unix.Stat_t
		if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // vanished during the walk
			}
			p.skip(child, "cannot be examined: "+err.Error())
			continue
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if !p.admit(child) {
				continue
			}
			sub, err := openDir(dfd, name, true)
			if err != nil {
				p.entries--
				p.vanishedOr(child, err)
				continue
			}
			err = p.dir(sub, child)
			sub.Close()
			if errors.Is(err, errVanished) {
				p.entries--
				continue
			}
			if err != nil {
				return err
			}
		case unix.S_IFREG:
			if !p.admit(child) {
				continue
			}
			if err := p.file(dfd, name, child); err != nil {
				return err
			}
		case unix.S_IFLNK:
			if !p.admit(child) {
				continue
			}
			if err := p.symlink(dfd, name, child); err != nil {
				return err
			}
		default: // sockets, devices, fifos
			p.skip(child, "not a regular file, directory or symbolic link")
		}
	}
	return nil
}

// vanishedOr skips an entry that could not be opened: silently when it is gone, else with
// the reason (replaced by a link: O_NOFOLLOW refused it; unreadable).
func (p *packer) vanishedOr(rel string, err error) {
	switch {
	case errors.Is(err, unix.ENOENT):
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR):
		p.skip(rel, "it changed into a symbolic link or another type while being archived")
	default:
		p.skip(rel, "cannot be read: "+errors.Unwrap(err).Error())
	}
}

func (p *packer) symlink(dfd int, name, rel string) error {
	target, err := readlinkat(dfd, name)
	if err != nil {
		p.entries--
		if errors.Is(err, unix.EINVAL) { // no longer a link
			p.skip(rel, "it changed type while being archived")
		} else if !errors.Is(err, unix.ENOENT) {
			p.skip(rel, "cannot be read: "+err.Error())
		}
		return nil
	}
	clean, ok := tree.CleanTarget(rel, target)
	if !ok {
		p.entries--
		p.skip(rel, "symbolic link to an absolute path or out of the tree")
		return nil
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		p.entries--
		return nil // vanished
	}
	p.st.Symlinks++
	return p.writeHeader(rel, linkInfo{name: name, mtime: time.Unix(st.Mtim.Unix())}, clean)
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
	}
}

func (p *packer) file(dfd int, name, rel string) error {
	// O_NONBLOCK: should the entry have become a fifo, the open returns at once instead of
	// waiting for a writer (and the fstat below skips it).
	fd, err := openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC)
	if err != nil {
		p.entries--
		p.vanishedOr(rel, err)
		return nil
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() { // replaced by something else since the Fstatat
		p.entries--
		p.skip(rel, "it changed type while being archived")
		return nil
	}
	return p.fileBody(f, fi, rel)
}
