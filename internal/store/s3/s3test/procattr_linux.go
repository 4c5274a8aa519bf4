package s3test

import "syscall"

// dieWithParent kills the server when the test process dies, however it ends.
func dieWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
