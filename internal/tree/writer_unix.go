//go:build !windows

package tree

import (
	"os"

	"golang.org/x/sys/unix"
)

// The Writer's calls on this platform: every directory is a descriptor, every call is
// made relative to one with O_NOFOLLOW (see Writer).

// dirFD is an open directory of the Writer.
type dirFD = int

// noDir marks a closed dirHandle.
const noDir dirFD = -1

func openRootDir(dir string) (dirFD, error) { return openDir(unix.AT_FDCWD, dir, false) }

// openSubDir opens the directory name in parent, refusing a link.
func openSubDir(parent dirFD, name string) (dirFD, error) { return openDir(parent, name, true) }

func closeDir(fd dirFD) { unix.Close(fd) }

func dirNames(fd dirFD) ([]string, error) { return readNames(fd) }

// freeBytes is what the file system of fd has free for this user.
func freeBytes(fd dirFD) (int64, bool) {
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return 0, false
	}
	return int64(fs.Bavail) * int64(fs.Bsize), true
}

// mkdirAt makes the directory name in parent (0700 until Close sets its mode); an
// existing name fails with an error matching fs.ErrExist.
func mkdirAt(parent dirFD, name string) error { return unix.Mkdirat(parent, name, 0o700) }

// symlinkAt makes the link name -> target in parent and sets its time (best effort).
func symlinkAt(target string, parent dirFD, name string, mtime int64) error {
	if err := unix.Symlinkat(target, parent, name); err != nil {
		return err
	}
	if mtime != 0 {
		ts := []unix.Timespec{unix.NsecToTimespec(mtime), unix.NsecToTimespec(mtime)}
		_ = unix.UtimesNanoAt(parent, name, ts, unix.AT_SYMLINK_NOFOLLOW)
	}
	return nil
}

// createAt creates the regular file name in parent, never through a link, failing if
// the name exists.
func createAt(parent dirFD, name, rel string) (*os.File, error) {
	fd, err := unix.Openat(parent, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), rel), nil
}

// setFileMeta sets an open file's mode and, unless 0, its time (ns).
func setFileMeta(f *os.File, mode uint32, mtime int64) error {
	fd := int(f.Fd())
	if err := unix.Fchmod(fd, mode); err != nil {
		return err
	}
	if mtime != 0 {
		return futimens(fd, mtime)
	}
	return nil
}

// setDirMeta sets an open directory's mode and, unless 0, its time (ns).
func setDirMeta(fd dirFD, mode uint32, mtime int64) error {
	if err := unix.Fchmod(fd, mode); err != nil {
		return err
	}
	if mtime != 0 {
		return futimens(fd, mtime)
	}
	return nil
}

// removeAt removes the file or link name in parent (never a directory: no AT_REMOVEDIR).
func removeAt(parent dirFD, name string) error { return unix.Unlinkat(parent, name, 0) }

// link makes p a hard link to the file target, both relative to the descriptors of
// their parents; a link at target is linked as itself, never followed (no
// AT_SYMLINK_FOLLOW).
func (w *Writer) link(target, p string) error {
	th, tname, err := w.parent(target)
	if err != nil {
		return err
	}
	defer w.release(th)
	ph, name, err := w.parent(p)
	if err != nil {
		return err
	}
	defer w.release(ph)
	return unix.Linkat(th.fd, tname, ph.fd, name, 0)
}
