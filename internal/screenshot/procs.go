//go:build linux

package screenshot

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// playwright-go starts the driver with exec.Cmd and keeps no handle we can reach, and the
// driver starts Chromium in its own process group. To bound shutdown (and kill what hangs)
// the capturer finds both in /proc: the driver is this process's child running
// "cli.js run-driver" from the driver directory; the browser is the driver's child.

type proc struct {
	pid, ppid, pgid int
	cmdline         string // NUL-separated arguments joined with spaces
}

// procs lists the processes visible in /proc.
func procs() []proc {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		p, ok := readProc(pid)
		if ok {
			out = append(out, p)
		}
	}
	return out
}

func readProc(pid int) (proc, bool) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return proc{}, false
	}
	// pid (comm) state ppid pgrp ...; comm may contain spaces and parentheses.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return proc{}, false
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 3 || f[0] == "Z" {
		return proc{}, false // zombies are as good as gone
	}
	ppid, _ := strconv.Atoi(f[1])
	pgid, _ := strconv.Atoi(f[2])
	cmd, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return proc{pid: pid, ppid: ppid, pgid: pgid, cmdline: string(bytes.ReplaceAll(bytes.TrimRight(cmd, "\x00"), []byte{0}, []byte{' '}))}, true
}

// descendants returns the live descendants of pid (not pid itself).
func descendants(pid int) []proc {
	all := procs()
	kids := map[int][]proc{}
	for _, p := range all {
		kids[p.ppid] = append(kids[p.ppid], p)
	}
	var out []proc
	queue := []int{pid}
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		for _, k := range kids[n] {
			out = append(out, k)
			queue = append(queue, k.pid)
		}
	}
	return out
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	_, ok := readProc(pid)
	return ok
}

// killTree SIGKILLs pid's descendants' process groups (Chromium runs in its own group),
// the descendants and pid itself.
func killTree(pid int) {
	if pid <= 0 {
		return
	}
	ds := descendants(pid)
	for _, d := range ds {
		if d.pgid == d.pid && d.pgid != syscall.Getpgrp() {
			_ = syscall.Kill(-d.pgid, syscall.SIGKILL)
		}
		_ = syscall.Kill(d.pid, syscall.SIGKILL)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
}
