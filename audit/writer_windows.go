//go:build windows

package audit

import (
	"fmt"
	"os"

	"golang.org/x/sys/windows"
)

// openAudit opens (or creates) the audit file for appending. FILE_FLAG_OPEN_REPARSE_POINT
// opens a link or other reparse point at path as itself, which is then refused (not a
// regular file), so the file is never written through a link. FILE_SHARE_DELETE lets a
// writer rename the file (rotation) while others hold it open, as on unix; each of them
// then follows the path to the new file (isPath).
func openAudit(path string) (*os.File, error) {
	p, err := windows.UTF16PtrFromString(path)
	if err != nil {
		return nil, fmt.Errorf("opening the audit file: %w", err)
	}
	// GENERIC_READ: LockFileEx wants read or write access; FILE_APPEND_DATA without
	// FILE_WRITE_DATA makes every write an append, like O_APPEND.
	h, err := windows.CreateFile(p, windows.GENERIC_READ|windows.FILE_APPEND_DATA|windows.FILE_WRITE_ATTRIBUTES|windows.SYNCHRONIZE,
		windows.FILE_SHARE_READ|windows.FILE_SHARE_WRITE|windows.FILE_SHARE_DELETE, nil,
		windows.OPEN_ALWAYS, windows.FILE_ATTRIBUTE_NORMAL|windows.FILE_FLAG_OPEN_REPARSE_POINT, 0)
	if err != nil {
		return nil, fmt.Errorf("opening the audit file: %w", err)
	}
	f := os.NewFile(uintptr(h), path)
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("the audit file %s is not a regular file", path)
	}
	return f, nil
}

// isPath reports whether f is still the file at path (same volume and file index).
func isPath(f *os.File, path string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Lstat(path)
	return err == nil && os.SameFile(a, b)
}

// lockOffsetHigh places the lock's byte far past any audit file's end: byte-range locks
// are mandatory on Windows, and one over the data would stop other writers' appends.
const lockOffsetHigh = 0x7fffffff

// lockFile holds an exclusive lock of f (one byte far past its end) until unlock.
func lockFile(f *os.File) (unlock func(), err error) {
	h := windows.Handle(f.Fd())
	ol := &windows.Overlapped{OffsetHigh: lockOffsetHigh}
	if err := windows.LockFileEx(h, windows.LOCKFILE_EXCLUSIVE_LOCK, 0, 1, 0, ol); err != nil {
		return nil, err
	}
	return func() { windows.UnlockFileEx(h, 0, 1, 0, &windows.Overlapped{OffsetHigh: lockOffsetHigh}) }, nil
}
