//go:build windows

package archive

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/windows"
)

// freeBytes is what the volume of dir has free for this user.
func freeBytes(dir string) (int64, bool) {
	p, err := windows.UTF16PtrFromString(dir)
	if err != nil {
		return 0, false
	}
	var avail, total, free uint64
	if err := windows.GetDiskFreeSpaceEx(p, &avail, &total, &free); err != nil {
		return 0, false
	}
	return int64(min(avail, 1<<62)), true
}

// linkTarget is a checked target as CreateSymbolicLink takes it: backslashes.
func linkTarget(t string) string { return filepath.FromSlash(t) }

// futimes sets a file's access and modification times through its handle, so a swapped
// link cannot redirect it. The handle must have been opened for writing.
func futimes(f *os.File, mtime time.Time) error {
	ft := windows.NsecToFiletime(mtime.UnixNano())
	return windows.SetFileTime(windows.Handle(f.Fd()), nil, &ft, &ft)
}

// finishDir applies a directory's time (Root.Chtimes does not follow a link at the
// name). Its mode is left alone: the read-only attribute of a Windows directory does
// not stop writes and Explorer reads it as "customized".
func (x *extractor) finishDir(d dirMeta) error {
	fi, err := x.root.Lstat(d.name)
	if err == nil && !fi.IsDir() {
		err = fmt.Errorf("no longer a directory: %w", ErrUnsafe)
	}
	if err == nil && !d.mtime.IsZero() {
		err = x.root.Chtimes(d.name, d.mtime, d.mtime)
	}
	return err
}
