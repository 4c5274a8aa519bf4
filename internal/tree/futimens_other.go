//go:build !linux && !windows

package tree

import "golang.org/x/sys/unix"

// futimens sets a file's access and modification times to mtime (ns) through its
// descriptor; elsewhere than Linux, futimes (microseconds) is what every unix has.
func futimens(fd int, mtime int64) error {
	tv := []unix.Timeval{unix.NsecToTimeval(mtime), unix.NsecToTimeval(mtime)}
	return unix.Futimes(fd, tv)
}
