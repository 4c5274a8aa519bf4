//go:build !linux

package screenshot

import "os"

// Without /proc the driver's and the browser's processes are not tracked by pid: the
// driver's own shutdown stops the browser, and a driver that hangs is killed by the
// process it belongs to.

type proc struct {
	pid, ppid, pgid int
	cmdline         string
}

func procs() []proc { return nil }

func descendants(int) []proc { return nil }

func alive(int) bool { return false }

func killTree(pid int) {
	if pid <= 0 {
		return
	}
	if p, err := os.FindProcess(pid); err == nil {
		_ = p.Kill()
	}
}
