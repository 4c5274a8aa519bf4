//go:build !linux

package haproxytest

import "syscall"

// dieWithParent: only Linux can tie a child's life to its parent's; elsewhere the test's
// cleanup stops HAProxy.
func dieWithParent() *syscall.SysProcAttr { return nil }
