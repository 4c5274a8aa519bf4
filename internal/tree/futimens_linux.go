package tree

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// futimens sets a file's access and modification times to mtime (ns) through its
// descriptor: utimensat(fd, NULL, ...), what glibc's futimens does.
func futimens(fd int, mtime int64) error {
	ts := [2]unix.Timespec{unix.NsecToTimespec(mtime), unix.NsecToTimespec(mtime)}
	_, _, errno := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}
