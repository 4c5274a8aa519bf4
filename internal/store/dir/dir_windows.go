//go:build windows

package dir

import (
	"errors"
	"io/fs"
	"syscall"

	"golang.org/x/sys/windows"

	"github.com/toolhost/toolhost/internal/winname"
)

// notDir: a name on the way is a file, not a folder (a key below an object's key).
// Windows says so as "path not found" or "the directory name is invalid".
func notDir(err error) bool {
	return errors.Is(err, syscall.ENOTDIR) || errors.Is(err, windows.ERROR_PATH_NOT_FOUND) ||
		errors.Is(err, windows.ERROR_DIRECTORY)
}

// isDirInTheWay: a rename onto the key failed because the key is a folder of others
// (MoveFileEx answers "access denied" when the target is a directory).
func isDirInTheWay(err error) bool {
	return errors.Is(err, fs.ErrExist) || errors.Is(err, windows.ERROR_ACCESS_DENIED) ||
		errors.Is(err, windows.ERROR_DIR_NOT_EMPTY) || errors.Is(err, syscall.EISDIR)
}

// platformKey refuses a key Windows would store under another name or not at all: a
// segment with a backslash or a colon (a drive or an alternate data stream), a device
// name (CON, NUL...), a trailing dot or space (see internal/winname).
func platformKey(key string) error { return winname.Path(key) }
