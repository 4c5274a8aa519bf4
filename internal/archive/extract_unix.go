//go:build !windows

package archive

import (
	"fmt"
	"os"
	"syscall"
	"time"
)

// freeBytes is what the file system of dir has free for this user.
func freeBytes(dir string) (int64, bool) {
	var fs syscall.Statfs_t
	if err := syscall.Statfs(dir, &fs); err != nil {
		return 0, false
	}
	return int64(fs.Bavail) * int64(fs.Bsize), true
}

// linkTarget is a checked target as the platform's symlink call takes it.
func linkTarget(t string) string { return t }

// futimes sets a file's access and modification times through its descriptor, so a
// swapped link cannot redirect it.
func futimes(f *os.File, mtime time.Time) error {
	tv := syscall.NsecToTimeval(mtime.UnixNano())
	sc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := sc.Control(func(fd uintptr) {
		serr = syscall.Futimes(int(fd), []syscall.Timeval{tv, tv})
	}); err != nil {
		return err
	}
	return serr
}

// finishDir applies a directory's mode and time through its descriptor.
func (x *extractor) finishDir(d dirMeta) error {
	f, err := x.root.Open(d.name)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err == nil && !fi.IsDir() {
		err = fmt.Errorf("no longer a directory: %w", ErrUnsafe)
	}
	if err == nil {
		err = f.Chmod(d.mode)
	}
	if err == nil && !d.mtime.IsZero() {
		err = futimes(f, d.mtime)
	}
	return err
}
