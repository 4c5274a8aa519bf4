//go:build !linux && !windows

package tree

import "golang.org/x/sys/unix"

// openat2Beneath: no openat2 on this platform; the caller walks part by part.
func openat2Beneath(int, string) (int, error) { return -1, unix.ENOSYS }
