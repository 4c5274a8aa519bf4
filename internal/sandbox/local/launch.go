//go:build linux

package local

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// launch collects what one bwrap start inherits. bwrap gets every host path it must not
// show the sandbox through a descriptor instead of its command line: the arguments
// themselves (--args: the sandbox's pid 1 is a fork of bwrap, and /proc/1/cmdline is
// readable by everyone), /etc/passwd and /etc/group (--file: copied into the
// sandbox's own /etc, no mount whose source path mountinfo would print), the seccomp program, and
// the agent's executable (run as /proc/self/fd/N, so the host binary's path is mounted
// nowhere). Descriptors are numbered in the order they are added, from 3 up, as
// exec.Cmd.ExtraFiles numbers them.
type launch struct {
	args    []string
	command string // what bwrap runs: /proc/self/fd/N of the agent
	files   []*os.File
}

// add makes f inherited and returns its descriptor number in the child, as an argument.
func (l *launch) add(f *os.File) string {
	l.files = append(l.files, f)
	return strconv.Itoa(2 + len(l.files))
}

// data adds a descriptor from which the child reads b: a memfd, so that no size blocks the
// writer and no file exists anywhere.
func (l *launch) data(name string, b []byte) (string, error) {
	fd, err := unix.MemfdCreate("toolhost-"+name, unix.MFD_CLOEXEC)
	if err != nil {
		return "", fmt.Errorf("memfd for %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	if _, err := f.Write(b); err != nil {
		f.Close()
		return "", fmt.Errorf("write %s: %w", name, err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return "", fmt.Errorf("rewind %s: %w", name, err)
	}
	return l.add(f), nil
}

// arg appends arguments.
func (l *launch) arg(a ...string) { l.args = append(l.args, a...) }

// argsData is the NUL-separated form --args reads.
func (l *launch) argsData() []byte {
	var b strings.Builder
	for _, a := range l.args {
		b.WriteString(a)
		b.WriteByte(0)
	}
	return []byte(b.String())
}

// close closes every descriptor the parent still holds (after the child has its copies).
func (l *launch) close() {
	for _, f := range l.files {
		f.Close()
	}
	l.files = nil
}

// readChildPID reads bwrap's --info-fd report, {"child-pid": N, ...}: the host pid of the
// sandbox's pid 1. bwrap writes it from its own (outer) process before it lets the child
// run, and closes the descriptor.
func readChildPID(r io.Reader) (int, error) {
	b, err := io.ReadAll(io.LimitReader(r, 64<<10))
	if err != nil {
		return 0, fmt.Errorf("read bwrap's info: %w", err)
	}
	var info struct {
		ChildPID int `json:"child-pid"`
	}
	if err := json.Unmarshal(b, &info); err != nil {
		return 0, fmt.Errorf("decode bwrap's info %q: %w", b, err)
	}
	if info.ChildPID <= 0 {
		return 0, errors.New("bwrap's info has no child pid")
	}
	return info.ChildPID, nil
}
