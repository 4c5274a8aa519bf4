//go:build linux

package local

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/toolhost/toolhost/core/sandbox"
)

// escape is one attempt to get out of the sandbox: a script the sandbox runs, and what
// proves it was refused. Most checks look at the script's own output (the sandbox
// reporting on itself is fine here: a refusal that the script misreports would still be a
// refusal), and the ones that matter on the host look at the host.
type escape struct {
	class  string
	name   string
	script string
	// want is a substring the script's stdout must contain (its report of the refusal).
	want string
	// host, when set, checks the host afterwards.
	host func(t *testing.T, ws string)
}

// pySyscall is a tiny program run inside the sandbox: it makes a raw system call with
// ctypes and prints the errno it got (0 when the call succeeded).
func pySyscall(nr uintptr, args ...uintptr) string {
	a := make([]string, len(args))
	for i, v := range args {
		a[i] = fmt.Sprint(v)
	}
	return fmt.Sprintf(`python3 -c 'import ctypes; libc = ctypes.CDLL(None, use_errno=True); libc.syscall.restype = ctypes.c_long; r = libc.syscall(%d%s); print("errno=%%d" %% (ctypes.get_errno() if r < 0 else 0))'`,
		nr, prefixAll(", ", a))
}

func prefixAll(p string, xs []string) string {
	var b strings.Builder
	for _, x := range xs {
		b.WriteString(p + x)
	}
	return b.String()
}

func errnoIs(e syscall.Errno) string { return fmt.Sprintf("errno=%d", int(e)) }

func escapeCorpus(hostListener string, hostAbstract string) []escape {
	return []escape{
		// Host path discovery.
		{"host paths", "pid 1's command line names no host path", `tr '\0' ' ' < /proc/1/cmdline; echo`, "/proc/self/fd/", nil},
		{"host paths", "mountinfo names no host directory", `grep -c -E '/tmp/|/var/tmp|/root|toolhost-' /proc/self/mountinfo`, "0", nil},
		{"host paths", "pid 1's environment is closed", `cat /proc/1/environ >/dev/null 2>&1 && echo open || echo closed`, "closed", nil},
		{"host paths", "pid 1's memory is closed", `head -c 16 /proc/1/mem >/dev/null 2>&1 && echo open || echo closed`, "closed", nil},
		{"host paths", "pid 1's memory map is closed", `cat /proc/1/maps 2>/dev/null | grep -c . || true`, "0", nil},
		{"host paths", "pid 1's executable link is closed", `readlink /proc/1/exe >/dev/null 2>&1 && echo open || echo closed`, "closed", nil},
		{"host paths", "pid 1's working directory link is closed", `readlink /proc/1/cwd >/dev/null 2>&1 && echo open || echo closed`, "closed", nil},
		{"host paths", "the cgroup path is the namespace's root", `cat /proc/self/cgroup | grep -c toolhost || true`, "0", nil},
		{"host paths", "no host user in /etc/passwd", `cut -d: -f1 /etc/passwd | tr '\n' ' '`, "root user nobody", nil},
		{"host paths", "no host environment", `env | grep -c -E 'TOOLHOST_|GOPATH|SSH_|AWS_' || true`, "0", nil},

		// Log injection: pid 1's descriptors are the host's pipe; they are closed to the
		// sandbox.
		{"log injection", "pid 1's stderr is closed", `echo INJECTED > /proc/1/fd/2 2>/dev/null && echo open || echo closed`, "closed", nil},
		{"log injection", "pid 1's stdout is closed", `echo INJECTED > /proc/1/fd/1 2>/dev/null && echo open || echo closed`, "closed", nil},
		{"log injection", "no console", `echo x > /dev/console 2>/dev/null && echo open || echo closed`, "closed", nil},
		{"log injection", "no kernel log", `echo x > /dev/kmsg 2>/dev/null && echo open || echo closed`, "closed", nil},

		// Links: nothing the sandbox links reaches the host.
		{"links", "a link to /etc/shadow reads the sandbox's view", `ln -s /etc/shadow shadow; cat shadow 2>&1 | head -c 200; echo`, "No such file", nil},
		{"links", "a hard link to a system binary is refused", `ln /usr/bin/passwd pw 2>&1; echo rc=$?`, "rc=1", nil},
		{"links", "a link to the host's root home shows nothing", `ln -s /root r; ls r/ 2>&1 | head -3; echo`, "No such file", nil},

		// setuid: never, on the host or inside.
		{"setuid", "chmod u+s", `touch s; chmod u+s s 2>&1; stat -c %a s`, "644", func(t *testing.T, ws string) { noSpecialBits(t, ws) }},
		{"setuid", "chmod g+s", `touch g; chmod g+s g 2>&1; stat -c %a g`, "644", nil},
		{"setuid", "chmod 4755 by number", `touch n; chmod 4755 n 2>&1; stat -c %a n`, "644", nil},
		{"setuid", "install -m 4755", `install -m 4755 /usr/bin/true inst 2>&1; echo rc=$?`, "rc=1", func(t *testing.T, ws string) { noSpecialBits(t, ws) }},
		{"setuid", "open(O_CREAT, 04755)", `python3 -c 'import os; os.open("oc", os.O_CREAT|os.O_WRONLY, 0o4755)' 2>&1 | tail -1`, "Operation not permitted", nil},
		{"setuid", "mkdir with setgid", `mkdir -m 2755 sg 2>&1; echo rc=$?`, "rc=1", nil},
		{"setuid", "cp --preserve of a setuid binary drops the bit", `cp --preserve=mode /usr/bin/passwd p2 2>/dev/null; stat -c %a p2`, "755", nil},
		{"setuid", "the workspace root's mode cannot change", `chmod 777 /home/user 2>&1; chmod 700 /home/user 2>&1; echo rc=$?`, "rc=1", nil},
		{"setuid", "chown to another user", `touch c; chown 0 c 2>&1; echo rc=$?`, "rc=1", nil},
		{"setuid", "files the sandbox makes are the sandbox user's on the host", `echo hi > owned; echo done`, "done", func(t *testing.T, ws string) {
			var st syscall.Stat_t
			if err := syscall.Stat(filepath.Join(ws, "owned"), &st); err != nil {
				t.Fatal(err)
			}
			if os.Geteuid() == 0 && (st.Uid == 0 || st.Gid == 0) {
				t.Errorf("a file the sandbox made belongs to %d:%d, root on the host", st.Uid, st.Gid)
			}
		}},

		// Devices.
		{"devices", "mknod of a character device", `mknod dev c 1 3 2>&1; echo rc=$?`, "rc=1", nil},
		{"devices", "mknod of a block device", `mknod blk b 8 0 2>&1; echo rc=$?`, "rc=1", nil},
		{"devices", "/dev holds only the harmless nodes", `ls /dev | grep -c -E '^(sd|vd|nvme|mem|kmem|port|loop|mapper|dm-|kmsg|console)' || true`, "0", nil},
		{"devices", "no raw disk", `ls /dev/vda /dev/sda /dev/nvme0n1 2>&1 | grep -c 'No such' `, "3", nil},

		// /proc of other processes.
		{"proc", "only the sandbox's processes are visible", `n=$(ls -d /proc/[0-9]* | wc -l); [ "$n" -lt 10 ] && echo few || echo many:$n`, "few", nil},
		{"proc", "/proc/sys is read-only", `echo 1 > /proc/sys/kernel/printk 2>/dev/null && echo writable || echo refused`, "refused", nil},
		{"proc", "no sysrq", `echo h > /proc/sysrq-trigger 2>/dev/null && echo writable || echo refused`, "refused", nil},
		{"proc", "no host pid 1", `cat /proc/1/comm`, "toolhost-agent", nil},

		// The network, with none.
		{"network", "only loopback", `grep -c : /proc/net/dev`, "1", nil},
		{"network", "the host's loopback is unreachable", fmt.Sprintf(`python3 -c 'import socket; s = socket.socket(); s.settimeout(2)
try:
    s.connect(("127.0.0.1", %s)); print("reached")
except Exception as e:
    print("refused", e)'`, hostListener), "refused", nil},
		{"network", "the host's abstract unix sockets are unreachable", fmt.Sprintf(`python3 -c 'import socket; s = socket.socket(socket.AF_UNIX)
try:
    s.connect("\0%s"); print("reached")
except Exception as e:
    print("refused", e)'`, hostAbstract), "refused", nil},
		{"network", "no packet sockets", `python3 -c 'import socket
try:
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW); print("made")
except Exception as e:
    print("refused", e)'`, "refused", nil},
		{"network", "no external route", `python3 -c 'import socket; s = socket.socket(); s.settimeout(2)
try:
    s.connect(("1.1.1.1", 53)); print("reached")
except Exception as e:
    print("refused", e)'`, "refused", nil},

		// System calls the filter refuses (a small program: python's ctypes).
		{"syscalls", "io_uring_setup", pySyscall(unix.SYS_IO_URING_SETUP, 1, 0), errnoIs(unix.EPERM), nil},
		{"syscalls", "bpf", pySyscall(unix.SYS_BPF, 0, 0, 0), errnoIs(unix.EPERM), nil},
		{"syscalls", "perf_event_open", pySyscall(unix.SYS_PERF_EVENT_OPEN, 0, 0, ^uintptr(0), ^uintptr(0), 0), errnoIs(unix.EPERM), nil},
		{"syscalls", "userfaultfd", pySyscall(unix.SYS_USERFAULTFD, 0), errnoIs(unix.EPERM), nil},
		{"syscalls", "keyctl", pySyscall(unix.SYS_KEYCTL, 0, 0), errnoIs(unix.EPERM), nil},
		{"syscalls", "add_key", pySyscall(unix.SYS_ADD_KEY, 0, 0, 0, 0, 0), errnoIs(unix.EPERM), nil},
		{"syscalls", "mount", pySyscall(unix.SYS_MOUNT, 0, 0, 0, 0, 0), errnoIs(unix.EPERM), nil},
		{"syscalls", "umount2", pySyscall(unix.SYS_UMOUNT2, 0, 0), errnoIs(unix.EPERM), nil},
		{"syscalls", "unshare(CLONE_NEWUSER)", pySyscall(unix.SYS_UNSHARE, unix.CLONE_NEWUSER), errnoIs(unix.EPERM), nil},
		{"syscalls", "setns", pySyscall(unix.SYS_SETNS, 0, 0), errnoIs(unix.EPERM), nil},
		{"syscalls", "ptrace attach to the agent", pySyscall(unix.SYS_PTRACE, unix.PTRACE_ATTACH, 1, 0, 0), errnoIs(unix.EPERM), nil},
		{"syscalls", "process_vm_readv of the agent", pySyscall(unix.SYS_PROCESS_VM_READV, 1, 0, 0, 0, 0, 0), errnoIs(unix.EPERM), nil},
		{"syscalls", "personality change", pySyscall(unix.SYS_PERSONALITY, 0x0400000), errnoIs(unix.EPERM), nil},
		{"syscalls", "kexec_load", pySyscall(unix.SYS_KEXEC_LOAD, 0, 0, 0, 0), errnoIs(unix.EPERM), nil},
		{"syscalls", "init_module", pySyscall(unix.SYS_INIT_MODULE, 0, 0, 0), errnoIs(unix.EPERM), nil},
		{"syscalls", "clone3 (ENOSYS: libc falls back to clone)", pySyscall(unix.SYS_CLONE3, 0, 0), errnoIs(unix.ENOSYS), nil},
		{"syscalls", "kill(1, SIGTERM): the agent is protected", pySyscall(unix.SYS_KILL, 1, uintptr(unix.SIGTERM)), errnoIs(unix.EPERM), nil},
		{"syscalls", "pidfd_open of the agent (ENOSYS)", pySyscall(unix.SYS_PIDFD_OPEN, 1, 0), errnoIs(unix.ENOSYS), nil},
		{"syscalls", "chroot", pySyscall(unix.SYS_CHROOT, 0), errnoIs(unix.EPERM), nil},
		{"syscalls", "open_by_handle_at", pySyscall(unix.SYS_OPEN_BY_HANDLE_AT, 0, 0, 0), errnoIs(unix.EPERM), nil},

		// The agent is the sandbox's pid 1: stopping or killing it from inside does nothing.
		{"agent", "kill -STOP 1 is refused", `kill -STOP 1 2>&1; echo rc=$?`, "rc=1", nil},
		{"agent", "kill -9 1 is refused", `kill -9 1 2>&1; echo rc=$?`, "rc=1", nil},
		{"agent", "kill -9 -1 spares the agent", `sh -c 'kill -9 -1; echo after'`, "after", nil},
	}
}

func noSpecialBits(t *testing.T, ws string) {
	t.Helper()
	_ = filepath.Walk(ws, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
			t.Errorf("%s has mode %v on the host", p, fi.Mode())
		}
		return nil
	})
}

// TestEscapeCorpus runs every escape in one sandbox (network none) over a private
// workspace, and checks each was refused.
func TestEscapeCorpus(t *testing.T) {
	p := newProvider(t, Config{})
	ctx := context.Background()
	sbi, err := p.Create(ctx, sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sb := sbi.(*Sandbox)
	defer sb.Close(ctx)
	ws := sb.ws.path
	before, err := os.Stat(ws)
	if err != nil {
		t.Fatal(err)
	}

	// A host service on loopback and one on an abstract unix socket, which a network-less
	// sandbox must not reach.
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	abstract := fmt.Sprintf("toolhost-test-%d", os.Getpid())
	ul, err := net.Listen("unix", "@"+abstract)
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	_, port, _ := net.SplitHostPort(tl.Addr().String())

	corpus := escapeCorpus(port, abstract)
	if len(corpus) < 50 {
		t.Fatalf("the corpus has %d cases, fewer than 50", len(corpus))
	}
	classes := map[string]int{}
	for _, e := range corpus {
		classes[e.class]++
		t.Run(e.class+"/"+e.name, func(t *testing.T) {
			res := sh(t, sb, e.script)
			out := string(res.Stdout)
			if !strings.Contains(out, e.want) {
				t.Errorf("%s: want %q in the output, got stdout %q stderr %q (exit %d)", e.name, e.want, out, res.Stderr, res.ExitCode)
			}
			if e.host != nil {
				e.host(t, ws)
			}
		})
	}
	t.Logf("%d escapes in %d classes: %v", len(corpus), len(classes), classes)
	if after, err := os.Stat(ws); err != nil || after.Mode() != before.Mode() {
		t.Errorf("the workspace root's mode changed on the host: %v, then %v (%v)", before.Mode(), after.Mode(), err)
	}
	// The sandbox still works after all of that (kill -9 -1 included).
	if res := sh(t, sb, "echo alive"); string(res.Stdout) != "alive\n" {
		t.Fatalf("the sandbox did not survive the corpus: %+v", res)
	}
}
