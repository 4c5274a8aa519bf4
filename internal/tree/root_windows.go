//go:build windows

package tree

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"golang.org/x/sys/windows"

	"github.com/toolhost/toolhost/internal/winname"
)

// On Windows there is no openat(2) with O_NOFOLLOW in the standard library, but there
// is os.Root: every open is made relative to a directory handle (NtCreateFile with a
// root directory), and a name never resolves outside the root, through links, junctions
// or other reparse points alike. The walk, the reader and the writer hold one Root per
// directory, each opened from its parent's by one name, and check with os.SameFile that
// the directory opened is the one Lstat saw (a real directory, not a link), so a
// directory swapped for a link between the two is refused rather than followed. A file
// is opened with FILE_FLAG_OPEN_REPARSE_POINT: a link is opened as itself, seen by Stat
// and refused, never followed.

// errLinked: a directory or file was a link or reparse point, or changed into one.
var errLinked = errors.New("a symbolic link or reparse point, or changed into one")

// openSubRoot opens the directory name of parent as a Root of its own, refusing a link.
func openSubRoot(parent *os.Root, name string) (*os.Root, error) {
	fi, err := parent.Lstat(name)
	if err != nil {
		return nil, err
	}
	if fi.Mode().Type() != fs.ModeDir {
		return nil, &fs.PathError{Op: "open", Path: name, Err: errLinked}
	}
	sub, err := parent.OpenRoot(name)
	if err != nil {
		return nil, err
	}
	got, err := sub.Stat(".")
	if err != nil || !os.SameFile(fi, got) {
		sub.Close()
		return nil, &fs.PathError{Op: "open", Path: name, Err: errLinked}
	}
	return sub, nil
}

// openRegular opens the regular file name of d for reading, never through a link: the
// open does not follow a reparse point, and what it opened must be a regular file.
func openRegular(d *os.Root, name string) (*os.File, fs.FileInfo, error) {
	f, err := d.OpenFile(name, os.O_RDONLY|windows.O_FILE_FLAG_OPEN_REPARSE_POINT, 0)
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, nil, &fs.PathError{Op: "open", Path: name, Err: errLinked}
	}
	return f, fi, nil
}

// rootNames reads the names of the directory of d.
func rootNames(d *os.Root) ([]string, error) {
	f, err := d.Open(".")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(-1)
}

// infoEntry is the Entry of what fi describes. Windows has no permission bits beyond
// read-only (Go reports 0444/0666, 0555/0777 for directories) and no inode numbers a
// later walk could compare: CTime is the modification time and Ino is 0.
func infoEntry(p string, fi fs.FileInfo) Entry {
	e := Entry{Path: p, Mode: fi.Mode().Perm(), MTime: fi.ModTime().UnixNano()}
	e.CTime = e.MTime
	switch fi.Mode().Type() {
	case fs.ModeDir:
		e.Type = Dir
	case 0:
		e.Type, e.Size = File, fi.Size()
	case fs.ModeSymlink:
		e.Type, e.Mode = Symlink, 0o777
	}
	return e
}

// windowsName refuses what Windows would not create as the name given (see winname).
func windowsName(p string) error {
	if err := winname.Path(p); err != nil {
		return fmt.Errorf("entry %q: %w: %w", p, err, ErrUnsafe)
	}
	return nil
}

// CheckPlatform reports why Windows would create the entry p (with the link target
// target, unless "") as another file, or nil: a backslash, a drive letter or alternate
// data stream (a colon), a device name (CON, NUL, COM1...), a trailing dot or space (see
// internal/winname).
func CheckPlatform(p, target string) error {
	if err := windowsName(p); err != nil {
		return err
	}
	if target == "" {
		return nil
	}
	if err := winname.Target(target); err != nil {
		return fmt.Errorf("entry %q: %w: %w", p, err, ErrUnsafe)
	}
	return nil
}

func ntime(ns int64) time.Time { return time.Unix(0, ns) }
