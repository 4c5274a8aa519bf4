//go:build !linux

package s3test

import "syscall"

// dieWithParent: only Linux can tie a child's life to its parent's; elsewhere the test's
// cleanup stops the server.
func dieWithParent() *syscall.SysProcAttr { return nil }
