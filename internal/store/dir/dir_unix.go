//go:build !windows

package dir

import (
	"errors"
	"io/fs"
	"syscall"
)

// notDir: a name on the way is a file, not a folder (a key below an object's key).
func notDir(err error) bool { return errors.Is(err, syscall.ENOTDIR) }

// isDirInTheWay: a rename onto the key failed because the key is a folder of others.
func isDirInTheWay(err error) bool {
	return errors.Is(err, syscall.EISDIR) || errors.Is(err, fs.ErrExist) || errors.Is(err, syscall.ENOTEMPTY)
}

// platformKey refuses keys this platform's file names cannot hold as they are; on unix
// ValidKey's rules are all there is.
func platformKey(string) error { return nil }
