//go:build !windows

package audit

import (
	"fmt"
	"os"
	"syscall"
)

func openAudit(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the audit file: %w", err)
	}
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("the audit file %s is not a regular file", path)
	}
	return f, nil
}

// isPath reports whether f is still the file at path.
func isPath(f *os.File, path string) bool {
	var a, b syscall.Stat_t
	return syscall.Fstat(int(f.Fd()), &a) == nil && syscall.Lstat(path, &b) == nil && a.Ino == b.Ino && a.Dev == b.Dev
}

// lockFile holds an exclusive flock of f until unlock.
func lockFile(f *os.File) (unlock func(), err error) {
	fd := int(f.Fd())
	if err := syscall.Flock(fd, syscall.LOCK_EX); err != nil {
		return nil, err
	}
	return func() { syscall.Flock(fd, syscall.LOCK_UN) }, nil
}
