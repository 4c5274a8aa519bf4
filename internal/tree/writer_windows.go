//go:build windows

package tree

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/windows"
)

// The Writer's calls on Windows: every directory is an os.Root opened from its parent's
// by one name (openSubRoot), every name is checked by winname before it is created (no
// backslash, colon, device name or trailing dot reaches the disk), a file is created with
// O_EXCL (CREATE_NEW, which never opens through a link).

// dirFD is an open directory of the Writer.
type dirFD = *os.Root

// noDir marks a closed dirHandle.
var noDir dirFD

func openRootDir(dir string) (dirFD, error) { return os.OpenRoot(dir) }

func openSubDir(parent dirFD, name string) (dirFD, error) { return openSubRoot(parent, name) }

func closeDir(d dirFD) { d.Close() }

func dirNames(d dirFD) ([]string, error) { return rootNames(d) }

// freeBytes is what the volume of d has free for this user.
func freeBytes(d dirFD) (int64, bool) {
	p, err := windows.UTF16PtrFromString(d.Name())
	if err != nil {
		return 0, false
	}
	var avail, total, free uint64
	if err := windows.GetDiskFreeSpaceEx(p, &avail, &total, &free); err != nil {
		return 0, false
	}
	return int64(min(avail, 1<<62)), true
}

func mkdirAt(parent dirFD, name string) error {
	if err := windowsName(name); err != nil {
		return err
	}
	return parent.Mkdir(name, 0o700)
}

// symlinkAt makes the link name -> target in parent. Windows needs the "Create symbolic
// links" privilege (or Developer Mode) for it; without it the entry fails, saying so,
// rather than being left out silently. A link's own time is not set.
func symlinkAt(target string, parent dirFD, name string, _ int64) error {
	if err := CheckPlatform(name, target); err != nil {
		return err
	}
	if err := parent.Symlink(filepath.FromSlash(target), name); err != nil {
		if errorIsPrivilege(err) {
			return fmt.Errorf("creating a symbolic link on Windows needs Developer Mode or the 'Create symbolic links' privilege: %w", err)
		}
		return err
	}
	return nil
}

func errorIsPrivilege(err error) bool { return errors.Is(err, windows.ERROR_PRIVILEGE_NOT_HELD) }

func createAt(parent dirFD, name, _ string) (*os.File, error) {
	if err := windowsName(name); err != nil {
		return nil, err
	}
	return parent.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
}

// setFileMeta sets an open file's time (ns, unless 0) through its handle, then its mode:
// on Windows only the read-only attribute (a mode without 0200).
func setFileMeta(f *os.File, mode uint32, mtime int64) error {
	if mtime != 0 {
		ft := windows.NsecToFiletime(mtime)
		if err := windows.SetFileTime(windows.Handle(f.Fd()), nil, &ft, &ft); err != nil {
			return err
		}
	}
	return f.Chmod(fs.FileMode(mode))
}

// setDirMeta sets a directory's time. Its mode is left alone: the read-only attribute
// of a Windows directory does not stop writes and Explorer reads it as "customized".
func setDirMeta(d dirFD, _ uint32, mtime int64) error {
	if mtime == 0 {
		return nil
	}
	return d.Chtimes(".", ntime(mtime), ntime(mtime))
}

// removeAt removes the file or link name in parent.
func removeAt(parent dirFD, name string) error {
	fi, err := parent.Lstat(name)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return fmt.Errorf("%s is a directory: %w", name, ErrUnsafe)
	}
	return parent.Remove(name)
}

// link makes p a hard link to the file target through the Root of the destination (one
// directory's Root cannot name a file of another): os.Root never resolves a name outside
// it, and the Writer made every directory on the way.
func (w *Writer) link(target, p string) error {
	if err := windowsName(p); err != nil {
		return err
	}
	root := w.dirs[""]
	if err := w.acquire(root); err != nil {
		return err
	}
	defer w.release(root)
	return root.fd.Link(filepath.FromSlash(target), filepath.FromSlash(p))
}
