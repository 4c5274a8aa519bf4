//go:build linux

package seccomp

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/toolhost/toolhost/internal/testenv"
)

// The real-kernel tests run a probe inside bubblewrap twice, once with the filter loaded
// through --seccomp and once without, and compare. The probe is this test binary,
// re-executed: TestMain sees probeModeEnv and runs the probe instead of the tests.

const (
	bwrapPath    = "/usr/bin/bwrap"
	probeModeEnv = "TOOLHOST_SECCOMP_PROBE"
	probePath    = "/probe" // where the test binary is bound inside the sandbox
	// probeExpectTermEnv=1 tells the pid-1 probe to wait for the SIGTERM its child sends.
	probeExpectTermEnv = "TOOLHOST_SECCOMP_PROBE_EXPECT_SIGTERM"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(probeModeEnv); mode != "" {
		os.Exit(probe(mode))
	}
	os.Exit(m.Run())
}

// probe runs inside the sandbox and reports on stdout, one "name<TAB>value" line per result.
func probe(mode string) int {
	switch mode {
	case "calls":
		return probeCalls()
	case "threads":
		return probeThreads()
	case "pid1":
		return probePid1()
	case "signal-pid1":
		return probeSignalPid1()
	case "pid1-runtime":
		return probePid1Runtime()
	}
	fmt.Fprintf(os.Stderr, "unknown probe mode %q\n", mode)
	return 2
}

// probeEnv is what the probe's calls work on: files under /tmp, the sandbox's own tmpfs.
type probeEnv struct {
	file  *os.File // /tmp/probe/file, mode 0644
	keep  []*byte  // the paths handed to the kernel, kept reachable
	info  [128]byte
	owner [2]int32 // struct f_owner_ex
	sv    [2]int32
	rlim  unix.Rlimit
}

// path returns a pointer to the C string /tmp/probe/name.
func (e *probeEnv) path(name string) uintptr {
	p, err := syscall.BytePtrFromString("/tmp/probe/" + name)
	if err != nil {
		panic(err)
	}
	e.keep = append(e.keep, p)
	return uintptr(unsafe.Pointer(p))
}

func (e *probeEnv) fd() uintptr { return e.file.Fd() }

// siginfo is a siginfo_t for rt_sigqueueinfo with si_code SI_QUEUE, as sigqueue(3) sends
// it: the kernel refuses any other process a non-negative si_code with EPERM, which would
// hide the filter's answer.
func (e *probeEnv) siginfo(sig syscall.Signal) uintptr {
	clear(e.info[:])
	*(*int32)(unsafe.Pointer(&e.info[0])) = int32(sig)
	*(*int32)(unsafe.Pointer(&e.info[8])) = -1 // SI_QUEUE
	return uintptr(unsafe.Pointer(&e.info[0]))
}

// probeCase is one raw system call made by the probe.
type probeCase struct {
	name string // unique
	call string // system call, numbered by nativeArch
	args func(e *probeEnv) []uintptr
	// want is the errno under the filter; 0 means the filter lets the call through, so it
	// must get exactly what it gets without the filter.
	want syscall.Errno
	// kernelMayAgree: without the filter the kernel may refuse the call with want too:
	// it checks a capability the sandbox lacks before anything else, or it was built
	// without the call (modules, kexec, x32), depending on its configuration. For every
	// other refused case the arguments make the kernel answer differently, which proves
	// the answer came from the filter.
	kernelMayAgree bool
}

const (
	minus1 = ^uintptr(0)
	hiBit  = uintptr(1) << 32
)

func none(*probeEnv) []uintptr { return nil }

func consts(args ...uintptr) func(*probeEnv) []uintptr {
	return func(*probeEnv) []uintptr { return args }
}

// probeCases covers every rule of the table (TestKernel checks that) with arguments that
// are harmless even without the filter.
var probeCases = []probeCase{
	{name: "io_uring_setup", call: "io_uring_setup", args: none, want: syscall.EPERM},
	{name: "io_uring_enter", call: "io_uring_enter", args: consts(minus1, 0, 0, 0, 0, 0), want: syscall.EPERM},
	{name: "io_uring_register", call: "io_uring_register", args: consts(minus1, 0, 0, 0), want: syscall.EPERM},
	{name: "bpf", call: "bpf", args: consts(minus1, 0, 0), want: syscall.EPERM, kernelMayAgree: true},
	{name: "perf_event_open", call: "perf_event_open", args: consts(0, 0, minus1, minus1, 0), want: syscall.EPERM},
	{name: "userfaultfd", call: "userfaultfd", args: consts(1 | 1<<30), want: syscall.EPERM}, // UFFD_USER_MODE_ONLY and a bad flag
	{name: "kexec_load", call: "kexec_load", args: consts(0, 0, 0, minus1), want: syscall.EPERM, kernelMayAgree: true},
	{name: "kexec_file_load", call: "kexec_file_load", args: consts(minus1, minus1, 0, 0, minus1), want: syscall.EPERM, kernelMayAgree: true},
	{name: "reboot", call: "reboot", args: consts(0, 0, 0, 0), want: syscall.EPERM}, // bad magic
	{name: "init_module", call: "init_module", args: none, want: syscall.EPERM, kernelMayAgree: true},
	{name: "finit_module", call: "finit_module", args: consts(minus1, 0, 0), want: syscall.EPERM, kernelMayAgree: true},
	{name: "delete_module", call: "delete_module", args: none, want: syscall.EPERM, kernelMayAgree: true},
	{name: "iopl", call: "iopl", args: consts(99), want: syscall.EPERM},
	{name: "ioperm", call: "ioperm", args: consts(0, 0, 1), want: syscall.EPERM},
	{name: "swapon", call: "swapon", args: none, want: syscall.EPERM, kernelMayAgree: true},
	{name: "swapoff", call: "swapoff", args: none, want: syscall.EPERM, kernelMayAgree: true},
	{name: "syslog", call: "syslog", args: consts(99, 0, 0), want: syscall.EPERM, kernelMayAgree: true},
	{name: "acct", call: "acct", args: none, want: syscall.EPERM, kernelMayAgree: true},
	{name: "settimeofday", call: "settimeofday", args: consts(1, 0), want: syscall.EPERM},
	{name: "clock_settime", call: "clock_settime", args: consts(0xfff, 0), want: syscall.EPERM},
	{name: "clock_adjtime", call: "clock_adjtime", args: consts(0xfff, 0), want: syscall.EPERM},
	{name: "adjtimex", call: "adjtimex", args: none, want: syscall.EPERM},
	{name: "quotactl", call: "quotactl", args: none, want: syscall.EPERM},
	{name: "quotactl_fd", call: "quotactl_fd", args: consts(minus1, 0, 0, 0), want: syscall.EPERM},
	{name: "lookup_dcookie", call: "lookup_dcookie", args: none, want: syscall.EPERM},
	{name: "uselib", call: "uselib", args: none, want: syscall.EPERM},
	{name: "vhangup", call: "vhangup", args: none, want: syscall.EPERM, kernelMayAgree: true},
	{name: "name_to_handle_at", call: "name_to_handle_at", args: consts(minus1, 0, 0, 0, 0xffff), want: syscall.EPERM},
	{name: "open_by_handle_at", call: "open_by_handle_at", args: consts(minus1, 0, 0), want: syscall.EPERM, kernelMayAgree: true},
	{name: "keyctl", call: "keyctl", args: consts(9999), want: syscall.EPERM},
	{name: "add_key", call: "add_key", args: none, want: syscall.EPERM},
	{name: "request_key", call: "request_key", args: none, want: syscall.EPERM},
	{name: "mount", call: "mount", args: consts(1, 1, 1, 0, 0), want: syscall.EPERM},
	{name: "umount2", call: "umount2", args: consts(0, 0x1000), want: syscall.EPERM},
	{name: "pivot_root", call: "pivot_root", args: none, want: syscall.EPERM},
	{name: "chroot", call: "chroot", args: none, want: syscall.EPERM},
	{name: "move_mount", call: "move_mount", args: consts(minus1, 0, minus1, 0, minus1), want: syscall.EPERM},
	{name: "open_tree", call: "open_tree", args: consts(minus1, 0, minus1), want: syscall.EPERM},
	{name: "open_tree_attr", call: "open_tree_attr", args: consts(minus1, 0, minus1, 0, 0), want: syscall.EPERM},
	{name: "fsopen", call: "fsopen", args: consts(0, minus1), want: syscall.EPERM},
	{name: "fsconfig", call: "fsconfig", args: consts(minus1, 99, 0, 0, 0), want: syscall.EPERM},
	{name: "fsmount", call: "fsmount", args: consts(minus1, minus1, 0), want: syscall.EPERM},
	{name: "fspick", call: "fspick", args: consts(minus1, 0, minus1), want: syscall.EPERM},
	{name: "mount_setattr", call: "mount_setattr", args: consts(minus1, 0, minus1, 0, 0), want: syscall.EPERM},
	{name: "unshare(CLONE_NEWUSER)", call: "unshare", args: consts(unix.CLONE_NEWUSER), want: syscall.EPERM}, // the probe has threads: EINVAL
	{name: "unshare(CLONE_NEWNS)", call: "unshare", args: consts(unix.CLONE_NEWNS), want: syscall.EPERM},
	{name: "setns", call: "setns", args: consts(minus1, 0), want: syscall.EPERM},
	{name: "ptrace", call: "ptrace", args: consts(0xdead, 0, 0, 0), want: syscall.EPERM},
	{name: "process_vm_readv", call: "process_vm_readv", args: consts(0, 0, 0, 0, 0, 1), want: syscall.EPERM},
	{name: "process_vm_writev", call: "process_vm_writev", args: consts(0, 0, 0, 0, 0, 1), want: syscall.EPERM},
	{name: "tkill", call: "tkill", args: consts(0, 0), want: syscall.EPERM},
	{name: "prlimit64(1, NOFILE, new)", call: "prlimit64", args: func(e *probeEnv) []uintptr {
		return []uintptr{1, unix.RLIMIT_NOFILE, uintptr(unsafe.Pointer(&e.rlim)), 0}
	}, want: syscall.EPERM},
	{name: "prlimit64(1, NPROC, read)", call: "prlimit64", args: func(e *probeEnv) []uintptr {
		return []uintptr{1, unix.RLIMIT_NPROC, 0, uintptr(unsafe.Pointer(&e.rlim))}
	}, want: syscall.EPERM},
	{name: "prlimit64(0, NOFILE, read) allowed", call: "prlimit64", args: func(e *probeEnv) []uintptr {
		return []uintptr{0, unix.RLIMIT_NOFILE, 0, uintptr(unsafe.Pointer(&e.rlim))}
	}},

	{name: "clone3", call: "clone3", args: none, want: syscall.ENOSYS},
	{name: "openat2", call: "openat2", args: consts(minus1, 0, 0, 0), want: syscall.ENOSYS},
	{name: "pidfd_open", call: "pidfd_open", args: none, want: syscall.ENOSYS},
	{name: "pidfd_send_signal", call: "pidfd_send_signal", args: consts(minus1, 0, 0, 0), want: syscall.ENOSYS},
	{name: "pidfd_getfd", call: "pidfd_getfd", args: consts(minus1, minus1, 0), want: syscall.ENOSYS},

	// clone: CLONE_THREAD without CLONE_SIGHAND makes the kernel refuse with EINVAL
	// whatever else the flags say, so no process is ever made.
	{name: "clone(CLONE_NEWNS)", call: "clone", args: consts(unix.CLONE_THREAD | unix.CLONE_NEWNS), want: syscall.EPERM},
	{name: "clone(CLONE_NEWCGROUP)", call: "clone", args: consts(unix.CLONE_THREAD | unix.CLONE_NEWCGROUP), want: syscall.EPERM},
	{name: "clone(CLONE_NEWUTS)", call: "clone", args: consts(unix.CLONE_THREAD | unix.CLONE_NEWUTS), want: syscall.EPERM},
	{name: "clone(CLONE_NEWIPC)", call: "clone", args: consts(unix.CLONE_THREAD | unix.CLONE_NEWIPC), want: syscall.EPERM},
	{name: "clone(CLONE_NEWUSER)", call: "clone", args: consts(unix.CLONE_THREAD | unix.CLONE_NEWUSER), want: syscall.EPERM},
	{name: "clone(CLONE_NEWPID)", call: "clone", args: consts(unix.CLONE_THREAD | unix.CLONE_NEWPID), want: syscall.EPERM},
	{name: "clone(CLONE_NEWNET)", call: "clone", args: consts(unix.CLONE_THREAD | unix.CLONE_NEWNET), want: syscall.EPERM},
	{name: "clone(CLONE_THREAD) allowed", call: "clone", args: consts(unix.CLONE_THREAD)},
	{name: "clone(CSIGNAL 0x80) allowed", call: "clone", args: consts(unix.CLONE_THREAD | 0x80)},

	// Setuid and setgid bits.
	{name: "chmod 04755", call: "chmod", args: func(e *probeEnv) []uintptr { return []uintptr{e.path("file"), 0o4755} }, want: syscall.EPERM},
	{name: "chmod hi|02755", call: "chmod", args: func(e *probeEnv) []uintptr { return []uintptr{e.path("file"), hiBit | 0o2755} }, want: syscall.EPERM},
	{name: "chmod 0755 allowed", call: "chmod", args: func(e *probeEnv) []uintptr { return []uintptr{e.path("file"), 0o755} }},
	{name: "fchmod 02755", call: "fchmod", args: func(e *probeEnv) []uintptr { return []uintptr{e.fd(), 0o2755} }, want: syscall.EPERM},
	{name: "fchmod 0644 allowed", call: "fchmod", args: func(e *probeEnv) []uintptr { return []uintptr{e.fd(), 0o644} }},
	{name: "fchmodat 04755", call: "fchmodat", args: func(e *probeEnv) []uintptr { return []uintptr{atFdcwd, e.path("file"), 0o4755} }, want: syscall.EPERM},
	{name: "fchmodat 01777 allowed", call: "fchmodat", args: func(e *probeEnv) []uintptr { return []uintptr{atFdcwd, e.path("file"), 0o1777} }},
	{name: "fchmodat2 06755", call: "fchmodat2", args: func(e *probeEnv) []uintptr { return []uintptr{atFdcwd, e.path("file"), 0o6755, 0} }, want: syscall.EPERM},
	{name: "fchmodat2 0600 allowed", call: "fchmodat2", args: func(e *probeEnv) []uintptr { return []uintptr{atFdcwd, e.path("file"), 0o600, 0} }},
	{name: "mkdir 02755", call: "mkdir", args: func(e *probeEnv) []uintptr { return []uintptr{e.path("d1"), 0o2755} }, want: syscall.EPERM},
	{name: "mkdir 0755 allowed", call: "mkdir", args: func(e *probeEnv) []uintptr { return []uintptr{e.path("d2"), 0o755} }},
	{name: "mkdirat 04755", call: "mkdirat", args: func(e *probeEnv) []uintptr { return []uintptr{atFdcwd, e.path("d3"), 0o4755} }, want: syscall.EPERM},
	{name: "mkdirat 0700 allowed", call: "mkdirat", args: func(e *probeEnv) []uintptr { return []uintptr{atFdcwd, e.path("d4"), 0o700} }},
	{name: "mknod fifo 04644", call: "mknod", args: func(e *probeEnv) []uintptr { return []uintptr{e.path("p1"), unix.S_IFIFO | 0o4644, 0} }, want: syscall.EPERM},
	{name: "mknod fifo 0644 allowed", call: "mknod", args: func(e *probeEnv) []uintptr { return []uintptr{e.path("p2"), unix.S_IFIFO | 0o644, 0} }},
	{name: "mknodat fifo 02644", call: "mknodat", args: func(e *probeEnv) []uintptr { return []uintptr{atFdcwd, e.path("p3"), unix.S_IFIFO | 0o2644, 0} }, want: syscall.EPERM},
	{name: "mknodat fifo 0600 allowed", call: "mknodat", args: func(e *probeEnv) []uintptr { return []uintptr{atFdcwd, e.path("p4"), unix.S_IFIFO | 0o600, 0} }},
	{name: "creat 04755", call: "creat", args: func(e *probeEnv) []uintptr { return []uintptr{e.path("c1"), 0o4755} }, want: syscall.EPERM},
	{name: "creat 0644 allowed", call: "creat", args: func(e *probeEnv) []uintptr { return []uintptr{e.path("c2"), 0o644} }},
	{name: "open O_CREAT 04755", call: "open", args: func(e *probeEnv) []uintptr { return []uintptr{e.path("o1"), unix.O_CREAT | unix.O_WRONLY, 0o4755} }, want: syscall.EPERM},
	{name: "open O_TMPFILE 02700", call: "open", args: func(e *probeEnv) []uintptr { return []uintptr{e.path(""), unix.O_TMPFILE | unix.O_RDWR, 0o2700} }, want: syscall.EPERM},
	{name: "open O_CREAT 0644 allowed", call: "open", args: func(e *probeEnv) []uintptr { return []uintptr{e.path("o2"), unix.O_CREAT | unix.O_WRONLY, 0o644} }},
	{name: "open O_RDONLY mode 06777 allowed", call: "open", args: func(e *probeEnv) []uintptr { return []uintptr{e.path("file"), unix.O_RDONLY, 0o6777} }},
	{name: "openat O_CREAT 04755", call: "openat", args: func(e *probeEnv) []uintptr {
		return []uintptr{atFdcwd, e.path("o3"), unix.O_CREAT | unix.O_WRONLY, 0o4755}
	}, want: syscall.EPERM},
	{name: "openat O_TMPFILE 06700", call: "openat", args: func(e *probeEnv) []uintptr {
		return []uintptr{atFdcwd, e.path(""), unix.O_TMPFILE | unix.O_RDWR, 0o6700}
	}, want: syscall.EPERM},
	{name: "openat O_CREAT 0600 allowed", call: "openat", args: func(e *probeEnv) []uintptr {
		return []uintptr{atFdcwd, e.path("o4"), unix.O_CREAT | unix.O_RDWR, 0o600}
	}},
	{name: "openat O_RDONLY mode 06777 allowed", call: "openat", args: func(e *probeEnv) []uintptr { return []uintptr{atFdcwd, e.path("file"), unix.O_RDONLY, 0o6777} }},

	{name: "personality ADDR_NO_RANDOMIZE", call: "personality", args: consts(0x0040000), want: syscall.EPERM},
	{name: "personality PER_LINUX allowed", call: "personality", args: consts(0)}, // also undoes the line above without the filter
	{name: "personality query allowed", call: "personality", args: consts(0xffffffff)},

	{name: "socket AF_PACKET", call: "socket", args: consts(unix.AF_PACKET, unix.SOCK_RAW, 0), want: syscall.EAFNOSUPPORT},
	{name: "socket hi|AF_PACKET", call: "socket", args: consts(hiBit|unix.AF_PACKET, unix.SOCK_RAW, 0), want: syscall.EAFNOSUPPORT},
	{name: "socket AF_UNSPEC", call: "socket", args: consts(unix.AF_UNSPEC, unix.SOCK_STREAM, 0), want: syscall.EAFNOSUPPORT, kernelMayAgree: true},
	{name: "socket hi|AF_UNIX allowed", call: "socket", args: consts(hiBit|unix.AF_UNIX, unix.SOCK_STREAM, 0)},
	{name: "socket AF_UNIX allowed", call: "socket", args: consts(unix.AF_UNIX, unix.SOCK_STREAM, 0)},
	{name: "socket AF_INET allowed", call: "socket", args: consts(unix.AF_INET, unix.SOCK_DGRAM, 0)},
	{name: "socket AF_INET6 allowed", call: "socket", args: consts(unix.AF_INET6, unix.SOCK_DGRAM, 0)},
	{name: "socket AF_NETLINK allowed", call: "socket", args: consts(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE)},
	{name: "socketpair AF_PACKET", call: "socketpair", args: func(e *probeEnv) []uintptr {
		return []uintptr{unix.AF_PACKET, unix.SOCK_DGRAM, 0, uintptr(unsafe.Pointer(&e.sv))}
	}, want: syscall.EAFNOSUPPORT},
	{name: "socketpair AF_UNIX allowed", call: "socketpair", args: func(e *probeEnv) []uintptr {
		return []uintptr{unix.AF_UNIX, unix.SOCK_STREAM, 0, uintptr(unsafe.Pointer(&e.sv))}
	}},

	// ioctl on a regular file: without the filter, ENOTTY.
	{name: "ioctl TIOCSTI", call: "ioctl", args: func(e *probeEnv) []uintptr { return []uintptr{e.fd(), unix.TIOCSTI, uintptr(unsafe.Pointer(&e.info))} }, want: syscall.EPERM},
	{name: "ioctl hi|TIOCSTI", call: "ioctl", args: func(e *probeEnv) []uintptr {
		return []uintptr{e.fd(), hiBit | unix.TIOCSTI, uintptr(unsafe.Pointer(&e.info))}
	}, want: syscall.EPERM},
	{name: "ioctl TIOCLINUX", call: "ioctl", args: func(e *probeEnv) []uintptr {
		return []uintptr{e.fd(), unix.TIOCLINUX, uintptr(unsafe.Pointer(&e.info))}
	}, want: syscall.EPERM},
	{name: "ioctl FIOSETOWN", call: "ioctl", args: func(e *probeEnv) []uintptr { return []uintptr{e.fd(), fioSetOwn, uintptr(unsafe.Pointer(&e.info))} }, want: syscall.EPERM},
	{name: "ioctl SIOCSPGRP", call: "ioctl", args: func(e *probeEnv) []uintptr {
		return []uintptr{e.fd(), unix.SIOCSPGRP, uintptr(unsafe.Pointer(&e.info))}
	}, want: syscall.EPERM},
	{name: "ioctl FIONREAD allowed", call: "ioctl", args: func(e *probeEnv) []uintptr { return []uintptr{e.fd(), unix.SIOCINQ, uintptr(unsafe.Pointer(&e.info))} }},
	{name: "ioctl TCGETS allowed", call: "ioctl", args: func(e *probeEnv) []uintptr { return []uintptr{e.fd(), unix.TCGETS, uintptr(unsafe.Pointer(&e.info))} }},

	// Signal 0 to pid 1 (bubblewrap's init here): delivered nowhere, but checked.
	{name: "kill(1, 0)", call: "kill", args: consts(1, 0), want: syscall.EPERM},
	{name: "kill(hi|1, 0)", call: "kill", args: consts(hiBit|1, 0), want: syscall.EPERM},
	{name: "tgkill(1, 1, 0)", call: "tgkill", args: consts(1, 1, 0), want: syscall.EPERM},
	{name: "rt_sigqueueinfo(1, 0)", call: "rt_sigqueueinfo", args: func(e *probeEnv) []uintptr { return []uintptr{1, 0, e.siginfo(0)} }, want: syscall.EPERM},
	{name: "rt_tgsigqueueinfo(1, 1, 0)", call: "rt_tgsigqueueinfo", args: func(e *probeEnv) []uintptr { return []uintptr{1, 1, 0, e.siginfo(0)} }, want: syscall.EPERM},
	{name: "tgkill(1, 1, SIGURG) allowed", call: "tgkill", args: consts(1, 1, uintptr(syscall.SIGURG))},
	{name: "kill(self, 0) allowed", call: "kill", args: func(*probeEnv) []uintptr { return []uintptr{uintptr(os.Getpid()), 0} }},
	{name: "tgkill(self, self, 0) allowed", call: "tgkill", args: func(*probeEnv) []uintptr {
		return []uintptr{uintptr(os.Getpid()), uintptr(os.Getpid()), 0}
	}},
	{name: "fcntl F_SETOWN 1", call: "fcntl", args: func(e *probeEnv) []uintptr { return []uintptr{e.fd(), unix.F_SETOWN, 1} }, want: syscall.EPERM},
	{name: "fcntl F_SETOWN -1", call: "fcntl", args: func(e *probeEnv) []uintptr { return []uintptr{e.fd(), unix.F_SETOWN, minus1} }, want: syscall.EPERM},
	{name: "fcntl F_SETOWN_EX", call: "fcntl", args: func(e *probeEnv) []uintptr {
		e.owner = [2]int32{1 /* F_OWNER_PID */, int32(os.Getpid())}
		return []uintptr{e.fd(), unix.F_SETOWN_EX, uintptr(unsafe.Pointer(&e.owner))}
	}, want: syscall.EPERM},
	{name: "fcntl F_SETOWN self allowed", call: "fcntl", args: func(e *probeEnv) []uintptr { return []uintptr{e.fd(), unix.F_SETOWN, uintptr(os.Getpid())} }},
	{name: "fcntl F_GETFL allowed", call: "fcntl", args: func(e *probeEnv) []uintptr { return []uintptr{e.fd(), unix.F_GETFL, 0} }},

	// x32 (amd64 only: on arm64 the number is unknown, and ENOSYS without the filter too).
	{name: "x32 getpid", call: "x32:getpid", args: none, want: syscall.ENOSYS, kernelMayAgree: true},
}

const atFdcwd = ^uintptr(99) // AT_FDCWD, -100

// probeNr numbers a probe case's call on this architecture; ok is false for a call this
// architecture does not have.
func probeNr(call string) (nr uintptr, ok bool) {
	if call == "x32:getpid" {
		return x32Bit | unix.SYS_GETPID, nativeArch.x32
	}
	n, ok := nativeArch.nr[call]
	return uintptr(n), ok
}

func probeCalls() int {
	if err := os.MkdirAll("/tmp/probe", 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	f, err := os.OpenFile("/tmp/probe/file", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	e := &probeEnv{file: f}
	for _, c := range probeCases {
		nr, ok := probeNr(c.call)
		if !ok {
			continue
		}
		var a [6]uintptr
		copy(a[:], c.args(e))
		_, _, errno := syscall.Syscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5])
		fmt.Printf("%s\t%d\n", c.name, errno)
	}
	runtime.KeepAlive(e)
	return 0
}

// probeThreads makes the Go runtime start threads (clone with CLONE_THREAD) and counts
// them by their thread ids.
func probeThreads() int {
	const n = 8
	tids := make(chan int, n)
	var wg sync.WaitGroup
	var release sync.WaitGroup
	release.Add(1)
	for range n {
		wg.Go(func() { // owned by probeThreads, which waits for all of them
			runtime.LockOSThread() // this thread stays busy until release: others need new ones
			tids <- unix.Gettid()
			release.Wait()
		})
	}
	seen := map[int]bool{}
	for range n {
		seen[<-tids] = true
	}
	release.Done()
	wg.Wait()
	fmt.Printf("threads\t%d\n", len(seen))
	return 0
}

// probePid1 runs as pid 1 of the sandbox, as the agent does: it handles SIGTERM, starts a
// child that sends it signals (probeSignalPid1), and reports whether one arrived.
func probePid1() int {
	if os.Getpid() != 1 {
		fmt.Printf("pid\t%d\n", os.Getpid())
		return 1
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGCHLD)
	cmd := exec.Command(probePath)
	cmd.Env = append(os.Environ(), probeModeEnv+"=signal-pid1")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	// The child's SIGCHLD comes after every signal it sent, and the runtime hands pending
	// signals over lowest number first (SIGTERM 15, SIGCHLD 17): once SIGCHLD is read,
	// any SIGTERM the child managed to send has been read too. Without the filter the
	// probe waits for the SIGTERM itself.
	waitTerm := os.Getenv(probeExpectTermEnv) == "1"
	term, chld := false, false
	deadline := time.After(30 * time.Second) // bounds a broken run; never a pass condition
	for !chld || (waitTerm && !term) {
		select {
		case s := <-sigs:
			term = term || s == syscall.SIGTERM
			chld = chld || s == syscall.SIGCHLD
		case <-deadline:
			fmt.Fprintln(os.Stderr, "no SIGCHLD (or expected SIGTERM) within 30s")
			return 1
		}
	}
	fmt.Printf("pid\t1\nsigterm received\t%v\n", term)
	return 0
}

// probeSignalPid1 runs as a child of pid 1 and sends it SIGTERM every way the filter
// watches.
func probeSignalPid1() int {
	e := &probeEnv{}
	for _, c := range []struct {
		name string
		nr   string
		args []uintptr
	}{
		{"kill(1, SIGTERM)", "kill", []uintptr{1, uintptr(syscall.SIGTERM)}},
		{"tgkill(1, 1, SIGTERM)", "tgkill", []uintptr{1, 1, uintptr(syscall.SIGTERM)}},
		{"rt_sigqueueinfo(1, SIGTERM)", "rt_sigqueueinfo", []uintptr{1, uintptr(syscall.SIGTERM), e.siginfo(syscall.SIGTERM)}},
		{"rt_tgsigqueueinfo(1, 1, SIGTERM)", "rt_tgsigqueueinfo", []uintptr{1, 1, uintptr(syscall.SIGTERM), e.siginfo(syscall.SIGTERM)}},
	} {
		var a [6]uintptr
		copy(a[:], c.args)
		_, _, errno := syscall.Syscall6(uintptr(nativeArch.nr[c.nr]), a[0], a[1], a[2], a[3], a[4], a[5])
		fmt.Printf("%s\t%d\n", c.name, errno)
	}
	runtime.KeepAlive(e)
	return 0
}

// probePid1Runtime runs as pid 1 and needs the two signals its Go runtime sends to its own
// threads (tgkill(1, tid, sig)): SIGURG to preempt a goroutine that loops without calls,
// which the garbage collector must stop, and SIGRTMIN+1 to make every thread take a new
// gid. Refused, either hangs the probe for good.
func probePid1Runtime() int {
	runtime.GOMAXPROCS(2)
	var looping atomic.Bool
	go func() { // spins until the probe exits, in a loop without calls: only a signal preempts it
		for i := uint64(0); ; i++ {
			if i == 1<<20 {
				looping.Store(true)
			}
		}
	}()
	for !looping.Load() {
		runtime.Gosched()
	}
	runtime.GC() // stops the world, so it must preempt the loop
	fmt.Printf("gc\tdone\n")
	fmt.Printf("setgid\t%v\n", syscall.Setgid(os.Getgid()))
	return 0
}

// box is one way of running the sandbox.
type box struct {
	filter bool
	// root makes the sandbox user uid 0 of its user namespace, with every capability over
	// the sandbox's namespaces: without the filter, most calls then get past the kernel's
	// permission checks and answer with what their arguments deserve. Otherwise the user
	// is uid 1000 with no capability, as toolhost's sandboxes are.
	root bool
	pid1 bool // the command runs as pid 1 (--as-pid-1)
}

func (b box) String() string {
	s := "no filter"
	if b.filter {
		s = "filter"
	}
	if b.root {
		s += ", userns root"
	}
	return s
}

// skipUnlessCI skips the test, except on CI (CI=true), where what is missing must be there.
func skipUnlessCI(t *testing.T, format string, args ...any) {
	t.Helper()
	testenv.Skipf(t, format, args...)
}

// requireSandbox skips when the real-kernel tests cannot run: no bubblewrap, or no filter
// for this architecture.
func requireSandbox(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(bwrapPath); err != nil {
		skipUnlessCI(t, "bubblewrap is not installed (%s; Debian package bubblewrap): %v", bwrapPath, err)
	}
	if nativeArch == nil {
		skipUnlessCI(t, "no seccomp filter for %s", runtime.GOARCH)
	}
}

// requireProgram skips when a workload's program is not installed.
func requireProgram(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		skipUnlessCI(t, "%s is not installed: %v", path, err)
	}
}

// run runs argv in the sandbox and returns its stdout; env is set inside with --setenv.
func (b box) run(t *testing.T, env []string, argv ...string) (string, error) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--unshare-all", "--die-with-parent", "--new-session", "--unshare-user"}
	if b.root {
		args = append(args, "--uid", "0", "--gid", "0")
	} else {
		args = append(args, "--uid", "1000", "--gid", "1000", "--cap-drop", "ALL")
	}
	args = append(args, "--ro-bind", "/usr", "/usr")
	// Merged-/usr systems make these symbolic links into /usr; older ones real directories.
	for _, d := range []string{"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"} {
		fi, err := os.Lstat(d)
		switch {
		case err != nil:
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(d)
			if err != nil {
				t.Fatal(err)
			}
			args = append(args, "--symlink", target, d)
		case fi.IsDir():
			args = append(args, "--ro-bind", d, d)
		}
	}
	args = append(args, "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
		"--ro-bind", exe, probePath, "--chdir", "/tmp",
		"--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp",
		// A probe built with -race would otherwise sleep a second before it exits.
		"--setenv", "GORACE", "atexit_sleep_ms=0")
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		args = append(args, "--setenv", k, v)
	}
	if b.pid1 {
		args = append(args, "--as-pid-1")
	}

	var extra []*os.File
	if b.filter {
		prog, err := Program()
		if err != nil {
			t.Fatal(err)
		}
		// bwrap reads the program to EOF: write it whole (far below a pipe's capacity)
		// and close our end before bwrap starts.
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if _, err := w.Write(prog); err != nil {
			w.Close()
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		extra = append(extra, r) // fd 3 in bwrap
		args = append(args, "--seccomp", "3")
	}
	args = append(append(args, "--"), argv...)

	// The deadline ends a hung probe (how TestKernelPid1Runtime fails); never a pass condition.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bwrapPath, args...)
	cmd.ExtraFiles = extra
	cmd.Env = []string{}
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	if err != nil {
		err = fmt.Errorf("%s in sandbox (%s): %w; stderr: %s", strings.Join(argv, " "), b, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), err
}

// results parses the probe's "name<TAB>value" lines.
func results(t *testing.T, out string) map[string]string {
	t.Helper()
	m := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "\t")
		if !ok {
			t.Fatalf("probe printed %q", sc.Text())
		}
		m[k] = v
	}
	return m
}

func errnoName(s string) string {
	n, err := strconv.Atoi(s)
	if err != nil {
		return s
	}
	if n == 0 {
		return "success"
	}
	return unix.ErrnoName(syscall.Errno(n))
}

// TestKernelRefusals makes every probe call in the sandbox with and without the filter.
func TestKernelRefusals(t *testing.T) {
	requireSandbox(t)
	env := []string{probeModeEnv + "=calls"}
	filtered, err := box{filter: true, root: true}.run(t, env, probePath)
	if err != nil {
		t.Fatal(err)
	}
	control, err := box{root: true}.run(t, env, probePath)
	if err != nil {
		t.Fatal(err)
	}
	got, without := results(t, filtered), results(t, control)

	names := map[string]bool{}
	refused := map[string]bool{} // calls seen refused by the filter
	for _, c := range probeCases {
		if names[c.name] {
			t.Fatalf("two probe cases named %q", c.name)
		}
		names[c.name] = true
		if _, ok := probeNr(c.call); !ok {
			continue
		}
		g, w := got[c.name], without[c.name]
		t.Logf("%-36s filter: %-14s without: %s", c.name, errnoName(g), errnoName(w))
		switch {
		case g == "" || w == "":
			t.Errorf("%s: no result (filter %q, without %q)", c.name, g, w)
		case c.want == 0 && g != w:
			t.Errorf("%s: the filter let it through, yet it got %s, and %s without the filter", c.name, errnoName(g), errnoName(w))
		case c.want != 0 && g != strconv.Itoa(int(c.want)):
			t.Errorf("%s: got %s, want %s", c.name, errnoName(g), unix.ErrnoName(c.want))
		case c.want != 0 && !c.kernelMayAgree && w == g:
			t.Errorf("%s: without the filter it gets %s too, so this case proves nothing", c.name, errnoName(w))
		}
		if c.want != 0 && g == strconv.Itoa(int(c.want)) {
			refused[c.call] = true
		}
	}
	// Every rule of the table was seen refusing a real call.
	for _, r := range Rules() {
		if r.Syscall != "*" && !refused[r.Syscall] {
			t.Errorf("no probe case shows %s refused (%s)", r.Syscall, r.When)
		}
	}
}

// TestKernelForeignABI: on x86_64, a call through the i386 entry (int 0x80) gets ENOSYS.
// Python's ctypes runs the three instructions: mov eax, 20 (i386 getpid); int 0x80; ret.
func TestKernelForeignABI(t *testing.T) {
	requireSandbox(t)
	if runtime.GOARCH != "amd64" {
		t.Logf("nothing to test: the i386 entry exists on x86_64 only, this is %s", runtime.GOARCH)
		return
	}
	requireProgram(t, "/usr/bin/python3")
	const script = `
import ctypes, mmap, os
code = bytes([0xb8, 20, 0, 0, 0, 0xcd, 0x80, 0xc3])
buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
buf.write(code)
f = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))
print(f(), os.getpid())
`
	// A kernel without IA-32 emulation (CONFIG_IA32_EMULATION off, or ia32_emulation=0)
	// has no i386 entry: int 0x80 faults before any filter sees it, so there is nothing to
	// refuse. Asked outside any sandbox, so a fault here is the kernel's, not the filter's.
	probe := exec.CommandContext(t.Context(), "/usr/bin/python3", "-c", script)
	probe.WaitDelay = 5 * time.Second
	if err := probe.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGSEGV {
				t.Logf("nothing to test: this kernel has no i386 entry (int 0x80 faults without a filter: IA-32 emulation is off)")
				return
			}
		}
		t.Fatalf("i386 getpid outside a sandbox: %v", err)
	}
	for _, b := range []box{{filter: true}, {}} {
		out, err := b.run(t, nil, "/usr/bin/python3", "-c", script)
		if err != nil {
			t.Fatal(err)
		}
		var ret, pid int
		if _, err := fmt.Sscan(out, &ret, &pid); err != nil {
			t.Fatalf("%s: python printed %q", b, out)
		}
		want := pid // the kernel has IA-32 emulation: getpid answers
		if b.filter {
			want = -int(syscall.ENOSYS)
		}
		if ret != want {
			t.Errorf("%s: i386 getpid returned %d, want %d (pid %d)", b, ret, want, pid)
		}
	}
}

// TestKernelSignalsToPid1: pid 1 (the agent's place) handles SIGTERM; its child's kill,
// tgkill, rt_sigqueueinfo and rt_tgsigqueueinfo reach it without the filter and are
// refused with it.
func TestKernelSignalsToPid1(t *testing.T) {
	requireSandbox(t)
	for _, b := range []box{{filter: true, pid1: true}, {pid1: true}} {
		env := []string{probeModeEnv + "=pid1"}
		if !b.filter {
			env = append(env, probeExpectTermEnv+"=1")
		}
		out, err := b.run(t, env, probePath)
		if err != nil {
			t.Fatal(err)
		}
		res := results(t, out)
		if res["pid"] != "1" {
			t.Fatalf("%s: probe ran as pid %s", b, res["pid"])
		}
		want, wantTerm := strconv.Itoa(int(syscall.EPERM)), "false"
		if !b.filter {
			want, wantTerm = "0", "true"
		}
		for _, call := range []string{"kill(1, SIGTERM)", "tgkill(1, 1, SIGTERM)", "rt_sigqueueinfo(1, SIGTERM)", "rt_tgsigqueueinfo(1, 1, SIGTERM)"} {
			if res[call] != want {
				t.Errorf("%s: %s: got %s, want %s", b, call, errnoName(res[call]), errnoName(want))
			}
		}
		if res["sigterm received"] != wantTerm {
			t.Errorf("%s: SIGTERM received by pid 1: %s, want %s", b, res["sigterm received"], wantTerm)
		}
	}
}

// TestKernelPid1Runtime: the Go runtime of pid 1 (the agent) keeps working under the
// filter. A failure shows as a hang, which the sandbox's deadline ends.
func TestKernelPid1Runtime(t *testing.T) {
	requireSandbox(t)
	out, err := box{filter: true, pid1: true}.run(t, []string{probeModeEnv + "=pid1-runtime"}, probePath)
	if err != nil {
		t.Fatal(err)
	}
	res := results(t, out)
	if res["gc"] != "done" || res["setgid"] != "<nil>" {
		t.Errorf("probe as pid 1: %q", out)
	}
}

// TestKernelWorkloads: what a coding workspace does still works under the filter, as the
// unprivileged sandbox user; what makes setuid or setgid files or namespaces fails, and
// succeeds without the filter (so the filter is what refuses it).
func TestKernelWorkloads(t *testing.T) {
	requireSandbox(t)
	type workload struct {
		name    string
		argv    []string
		env     []string
		want    string // stdout under the filter, trimmed
		refused bool   // fails under the filter, succeeds without it
		needs   string // a program this workload needs; a Debian CI machine may lack it
	}
	sh := func(script string) []string { return []string{"/bin/bash", "-c", script} }
	workloads := []workload{
		{name: "bash pipeline", argv: sh(`set -eo pipefail; printf 'b\na\nc\n' | sort | tr a-z A-Z | head -n 2 | paste -sd,`), want: "A,B"},
		{name: "chmod 755, mkdir", argv: sh(`set -e; touch f; chmod 755 f; mkdir -p d/e; chmod 700 d; chmod +t d; stat -c %a f d`), want: "755\n1700"},
		{name: "chmod 4755", argv: sh(`touch f && chmod 4755 f`), refused: true},
		{name: "chmod u+s", argv: sh(`touch f && chmod u+s f`), refused: true},
		{name: "chmod g+s dir", argv: sh(`mkdir d && chmod g+s d`), refused: true},
		{name: "mkdir -m 2755", argv: sh(`mkdir -m 2755 d`), refused: true},
		{name: "install -m 4755", argv: sh(`touch f && install -m 4755 f g`), refused: true},
		{name: "python open O_CREAT 04755", needs: "/usr/bin/python3", argv: []string{"/usr/bin/python3", "-c", `import os; os.open("/tmp/x", os.O_CREAT | os.O_WRONLY, 0o4755)`}, refused: true},
		{name: "unshare -U", argv: []string{"/usr/bin/unshare", "-U", "true"}, refused: true},
		{name: "Go threads", argv: []string{probePath}, env: []string{probeModeEnv + "=threads"}, want: "threads\t8"},
		{name: "python fork, subprocess, threads", needs: "/usr/bin/python3", argv: []string{"/usr/bin/python3", "-c", `
import os, subprocess, threading
out = []
t = threading.Thread(target=lambda: out.append(subprocess.run(["/bin/echo", "child"], capture_output=True, text=True).stdout.strip()))
t.start(); t.join()
pid = os.fork()
if pid == 0:
    os._exit(7)
_, status = os.waitpid(pid, 0)
print(out[0], os.waitstatus_to_exitcode(status))
`}, want: "child 7"},
		{name: "git init and commit", needs: "/usr/bin/git", argv: sh(`set -e; git init -q repo; cd repo; echo hi > a; git add a;
git -c user.name=t -c user.email=t@example.com commit -qm one; git log --format=%s`), want: "one"},
		{name: "gcc", needs: "/usr/bin/gcc", argv: sh(`set -e; printf 'int main(void){return 3;}' > t.c; gcc -o t t.c; ./t || echo $?`), want: "3"},
		{name: "node child_process", needs: "/usr/bin/node", argv: []string{"/usr/bin/node", "-e",
			`const cp = require("child_process"); console.log(cp.execFileSync("/bin/echo", ["node-child"]).toString().trim())`}, want: "node-child"},
	}
	for _, w := range workloads {
		t.Run(w.name, func(t *testing.T) {
			if w.needs != "" {
				requireProgram(t, w.needs)
			}
			out, err := box{filter: true}.run(t, w.env, w.argv...)
			if w.refused {
				if err == nil {
					t.Fatalf("succeeded under the filter; stdout %q", out)
				}
				t.Logf("under the filter: %v", err)
				if _, err := (box{}).run(t, w.env, w.argv...); err != nil {
					t.Fatalf("without the filter it fails too, so this proves nothing: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.TrimSpace(out); got != w.want {
				t.Errorf("stdout %q, want %q", got, w.want)
			}
		})
	}
}

// TestProbeCasesCoverRules is the cheap half of TestKernelRefusals' coverage check: it
// needs no sandbox, so it holds even where bubblewrap is missing.
func TestProbeCasesCoverRules(t *testing.T) {
	calls := map[string]bool{}
	for _, c := range probeCases {
		if c.want != 0 {
			calls[c.call] = true
		}
	}
	for _, r := range Rules() {
		if r.Syscall != "*" && !calls[r.Syscall] {
			t.Errorf("no probe case refuses %s", r.Syscall)
		}
	}
	if slices.ContainsFunc(probeCases, func(c probeCase) bool { return c.args == nil }) {
		t.Error("a probe case has no args function")
	}
}
