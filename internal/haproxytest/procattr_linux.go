package haproxytest

import "syscall"

// dieWithParent kills HAProxy when the test process dies, however it ends.
func dieWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
