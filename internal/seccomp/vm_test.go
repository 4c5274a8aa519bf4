//go:build linux

package seccomp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The tests build the filter of both architectures on any machine, so they carry both
// syscall tables: the numbers of the kernel's arch/x86/entry/syscalls/syscall_64.tbl and
// include/uapi/asm-generic/unistd.h for every call the table names. TestNativeArch checks
// the one of the machine that runs the tests against golang.org/x/sys/unix.
var goldenArchs = map[string]*arch{
	"amd64": {goarch: "amd64", audit: unix.AUDIT_ARCH_X86_64, x32: true, nr: map[string]uint32{
		"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "bpf": 321,
		"perf_event_open": 298, "userfaultfd": 323, "kexec_load": 246, "kexec_file_load": 320,
		"reboot": 169, "init_module": 175, "finit_module": 313, "delete_module": 176, "iopl": 172,
		"ioperm": 173, "swapon": 167, "swapoff": 168, "syslog": 103, "acct": 163, "settimeofday": 164,
		"clock_settime": 227, "clock_adjtime": 305, "adjtimex": 159, "quotactl": 179, "quotactl_fd": 443,
		"lookup_dcookie": 212, "uselib": 134, "vhangup": 153, "name_to_handle_at": 303,
		"open_by_handle_at": 304, "keyctl": 250, "add_key": 248, "request_key": 249, "mount": 165,
		"umount2": 166, "pivot_root": 155, "chroot": 161, "move_mount": 429, "open_tree": 428,
		"open_tree_attr": 467, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
		"mount_setattr": 442, "unshare": 272, "setns": 308, "clone": 56, "ptrace": 101,
		"process_vm_readv": 310, "process_vm_writev": 311, "clone3": 435, "openat2": 437,
		"pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438, "chmod": 90, "fchmod": 91,
		"mkdir": 83, "mknod": 133, "creat": 85, "fchmodat": 268, "fchmodat2": 452, "mkdirat": 258,
		"mknodat": 259, "open": 2, "openat": 257, "personality": 135, "socket": 41, "socketpair": 53,
		"ioctl": 16, "kill": 62, "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297,
		"tkill": 200, "fcntl": 72, "prlimit64": 302,
	}},
	"arm64": {goarch: "arm64", audit: unix.AUDIT_ARCH_AARCH64, nr: map[string]uint32{
		"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "bpf": 280,
		"perf_event_open": 241, "userfaultfd": 282, "kexec_load": 104, "kexec_file_load": 294,
		"reboot": 142, "init_module": 105, "finit_module": 273, "delete_module": 106, "swapon": 224,
		"swapoff": 225, "syslog": 116, "acct": 89, "settimeofday": 170, "clock_settime": 112,
		"clock_adjtime": 266, "adjtimex": 171, "quotactl": 60, "quotactl_fd": 443, "lookup_dcookie": 18,
		"vhangup": 58, "name_to_handle_at": 264, "open_by_handle_at": 265, "keyctl": 219, "add_key": 217,
		"request_key": 218, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51,
		"move_mount": 429, "open_tree": 428, "open_tree_attr": 467, "fsopen": 430, "fsconfig": 431,
		"fsmount": 432, "fspick": 433, "mount_setattr": 442, "unshare": 97, "setns": 268, "clone": 220,
		"ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "clone3": 435, "openat2": 437,
		"pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438, "fchmod": 52, "fchmodat": 53,
		"fchmodat2": 452, "mkdirat": 34, "mknodat": 33, "openat": 56, "personality": 92, "socket": 198,
		"socketpair": 199, "ioctl": 29, "kill": 129, "tgkill": 131, "rt_sigqueueinfo": 138,
		"rt_tgsigqueueinfo": 240, "tkill": 130, "fcntl": 25, "prlimit64": 261,
	}, absent: []string{"iopl", "ioperm", "uselib", "chmod", "mkdir", "mknod", "creat", "open"}},
}

// What the filter must refuse whatever the arguments, as the design asks; written here
// apart from table.go so that the two check each other.
var (
	alwaysEPERM = []string{
		"io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "perf_event_open",
		"userfaultfd", "kexec_load", "kexec_file_load", "reboot", "init_module", "finit_module",
		"delete_module", "iopl", "ioperm", "swapon", "swapoff", "syslog", "acct", "settimeofday",
		"clock_settime", "clock_adjtime", "adjtimex", "quotactl", "quotactl_fd", "lookup_dcookie",
		"uselib", "vhangup", "name_to_handle_at", "open_by_handle_at", "keyctl", "add_key",
		"request_key", "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree",
		"open_tree_attr", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "unshare",
		"setns", "ptrace", "process_vm_readv", "process_vm_writev", "tkill",
	}
	alwaysENOSYS = []string{"clone3", "openat2", "pidfd_open", "pidfd_send_signal", "pidfd_getfd"}
)

const (
	allOnes = ^uint64(0)
	hi      = uint64(1) << 32 // a bit in the upper half, which the kernel ignores for these arguments

	cloneThread = unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND |
		unix.CLONE_THREAD | unix.CLONE_SYSVSEM | unix.CLONE_SETTLS | unix.CLONE_PARENT_SETTID |
		unix.CLONE_CHILD_CLEARTID
	cloneFork  = unix.CLONE_CHILD_SETTID | unix.CLONE_CHILD_CLEARTID | uint64(syscall.SIGCHLD)
	cloneVfork = unix.CLONE_VM | unix.CLONE_VFORK | uint64(syscall.SIGCHLD)
)

// vmCase is one call and the verdict the filter must give it.
type vmCase struct {
	syscall string
	args    []uint64
	want    uint32
}

func (c vmCase) String() string {
	return fmt.Sprintf("%s(%#x) want %s", c.syscall, c.args, verdict(c.want))
}

func verdict(v uint32) string {
	switch {
	case v == retAllow:
		return "ALLOW"
	case v&^unix.SECCOMP_RET_DATA == unix.SECCOMP_RET_ERRNO:
		return "ERRNO(" + unix.ErrnoName(syscall.Errno(v&unix.SECCOMP_RET_DATA)) + ")"
	}
	return fmt.Sprintf("%#x", v)
}

// vmCases is, for one architecture, every rule's refused side and, for the rules with a
// condition, its allowed side. Argument positions are spelled out, so a rule that reads the
// wrong argument fails.
func vmCases() []vmCase {
	eperm, enosys, eafnosupport := retErrno(syscall.EPERM), retErrno(syscall.ENOSYS), retErrno(syscall.EAFNOSUPPORT)
	var cs []vmCase
	add := func(name string, want uint32, args ...uint64) {
		cs = append(cs, vmCase{name, args, want})
	}
	for _, n := range alwaysEPERM {
		add(n, eperm)
		add(n, eperm, allOnes, allOnes, allOnes, allOnes, allOnes, allOnes)
	}
	for _, n := range alwaysENOSYS {
		add(n, enosys)
		add(n, enosys, allOnes, allOnes, allOnes, allOnes, allOnes, allOnes)
	}

	// clone: flags is arg0 on both architectures.
	for _, ns := range []uint64{unix.CLONE_NEWNS, unix.CLONE_NEWCGROUP, unix.CLONE_NEWUTS, unix.CLONE_NEWIPC,
		unix.CLONE_NEWUSER, unix.CLONE_NEWPID, unix.CLONE_NEWNET} {
		add("clone", eperm, ns)
		add("clone", eperm, ns|cloneFork)
		add("clone", eperm, hi|ns|uint64(syscall.SIGCHLD))
		add("clone", retAllow, ns<<32|uint64(syscall.SIGCHLD)) // the kernel truncates flags to 32 bits
		add("clone", retAllow, cloneFork, ns, ns, ns, ns)      // the bit in other arguments
	}
	add("clone", retAllow, cloneThread)
	add("clone", retAllow, cloneFork)
	add("clone", retAllow, cloneVfork)
	add("clone", retAllow, unix.CLONE_NEWTIME|unix.CLONE_VM) // CSIGNAL's bit in clone()
	add("clone", retAllow)

	// Mode: arg1 of chmod, fchmod, mkdir, mknod, creat; arg2 of the *at forms.
	for name, mode := range map[string]int{"chmod": 1, "fchmod": 1, "mkdir": 1, "mknod": 1, "creat": 1,
		"fchmodat": 2, "fchmodat2": 2, "mkdirat": 2, "mknodat": 2} {
		at := func(v uint64) []uint64 { a := make([]uint64, 6); a[mode] = v; return a }
		for _, bad := range []uint64{0o4755, 0o2755, 0o6000, unix.S_IFIFO | 0o4644, hi | 0o2700, allOnes} {
			add(name, eperm, at(bad)...)
		}
		for _, good := range []uint64{0, 0o755, 0o1777, unix.S_IFIFO | 0o644, 0o4755 << 32} {
			add(name, retAllow, at(good)...)
		}
		// The setid bits in every other argument change nothing.
		others := slices.Repeat([]uint64{0o6777}, 6)
		others[mode] = 0o777
		add(name, retAllow, others...)
	}
	// open(path, flags, mode) and openat(dirfd, path, flags, mode).
	for name, flags := range map[string]int{"open": 1, "openat": 2} {
		args := func(f, m uint64) []uint64 {
			a := slices.Repeat([]uint64{0o6777}, 6) // setid bits everywhere else
			a[flags], a[flags+1] = f, m
			return a
		}
		tmpfile := uint64(unix.O_TMPFILE | unix.O_RDWR)
		add(name, eperm, args(unix.O_CREAT|unix.O_WRONLY, 0o4755)...)
		add(name, eperm, args(unix.O_CREAT|unix.O_EXCL|unix.O_RDWR, 0o2644)...)
		add(name, eperm, args(tmpfile, 0o2700)...)
		add(name, eperm, args(hi|unix.O_CREAT, hi|0o4000)...)
		add(name, retAllow, args(unix.O_CREAT|unix.O_WRONLY, 0o644)...)
		add(name, retAllow, args(tmpfile, 0o1777)...)
		add(name, retAllow, args(unix.O_RDONLY, 0o6777)...) // no O_CREAT: mode is garbage
		add(name, retAllow, args(unix.O_DIRECTORY|unix.O_RDONLY, 0o6777)...)
		add(name, retAllow, args(unix.O_CREAT<<32, 0o6777)...)
	}

	// personality(persona)
	for _, p := range []uint64{0, 0x0008, 0xffffffff, allOnes, hi, hi | 0x0008} {
		add("personality", retAllow, p)
	}
	const addrNoRandomize, readImpliesExec = 0x0040000, 0x0400000 // linux/personality.h
	for _, p := range []uint64{addrNoRandomize, readImpliesExec, 0x0008 | addrNoRandomize, 1, 0xfffffffe} {
		add("personality", eperm, p)
	}

	// socket(domain, ...), socketpair(domain, ...)
	for _, name := range []string{"socket", "socketpair"} {
		for _, d := range []uint64{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK, hi | unix.AF_INET} {
			add(name, retAllow, d, unix.SOCK_STREAM, 0)
		}
		for _, d := range []uint64{unix.AF_PACKET, unix.AF_VSOCK, unix.AF_BLUETOOTH, unix.AF_ALG, unix.AF_XDP,
			unix.AF_UNSPEC, unix.AF_KEY, 0xffff, unix.AF_UNIX << 32} {
			add(name, eafnosupport, d, unix.SOCK_STREAM, 0)
		}
		add(name, eafnosupport, unix.AF_PACKET, unix.AF_UNIX, unix.AF_UNIX) // domain is arg0
	}

	// prlimit64(pid, resource, new, old): a process's own limits (pid 0) only.
	for _, pid := range []uint64{1, 2, 0xffffffff, hi | 1} {
		add("prlimit64", eperm, pid, unix.RLIMIT_NOFILE, 0x1000, 0)
		add("prlimit64", eperm, pid, unix.RLIMIT_NPROC, 0, 0x1000)
	}
	add("prlimit64", retAllow, 0, unix.RLIMIT_NOFILE, 0x1000, 0)
	add("prlimit64", retAllow, hi, unix.RLIMIT_NOFILE, 0, 0x1000) // the kernel reads pid as 32 bits: 0

	// ioctl(fd, request, ...)
	for _, r := range []uint64{unix.TIOCSTI, unix.TIOCLINUX, 0x8901 /* FIOSETOWN */, unix.SIOCSPGRP, hi | unix.TIOCSTI} {
		add("ioctl", eperm, 0, r, 0)
	}
	for _, r := range []uint64{unix.TCGETS, unix.TIOCGWINSZ, 0x541b /* FIONREAD */, unix.TIOCSPGRP, 0x5451 /* FIOCLEX */} {
		add("ioctl", retAllow, 0, r, 0)
	}
	add("ioctl", retAllow, unix.TIOCSTI, 0, unix.TIOCSTI) // request is arg1

	// Signals to pid 1: arg0 of kill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo.
	for _, name := range []string{"kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"} {
		add(name, eperm, 1, uint64(syscall.SIGTERM), 0)
		add(name, eperm, hi|1, 1, 1)
		add(name, retAllow, 2, 1, uint64(syscall.SIGTERM))
		add(name, retAllow, 0, 1, 1)
		add(name, retAllow, allOnes, 1, 1) // kill(-1): the kernel spares init
		add(name, retAllow, 1<<32, 1, 1)
	}
	// tgkill(1, tid, sig): the signals pid 1's own runtime sends its threads pass.
	add("tgkill", eperm, 1, 7, uint64(syscall.SIGTERM))
	add("tgkill", eperm, 1, 7, uint64(syscall.SIGKILL))
	add("tgkill", eperm, 1, 7, uint64(syscall.SIGURG)<<32|1)
	add("tgkill", retAllow, 1, 7, uint64(syscall.SIGURG))
	add("tgkill", retAllow, 1, 1, 33) // SIGRTMIN+1
	add("tgkill", retAllow, hi|1, 7, hi|uint64(syscall.SIGURG))
	add("rt_tgsigqueueinfo", eperm, 1, 7, uint64(syscall.SIGURG))
	add("kill", eperm, 1, uint64(syscall.SIGURG))

	// fcntl(fd, cmd, arg)
	add("fcntl", eperm, 3, unix.F_SETOWN, 1)
	add("fcntl", eperm, 3, unix.F_SETOWN, allOnes) // -1: process group 1
	add("fcntl", eperm, 3, unix.F_SETOWN, 0xffffffff)
	add("fcntl", eperm, 3, hi|unix.F_SETOWN, hi|1)
	add("fcntl", eperm, 3, unix.F_SETOWN_EX, 0)
	add("fcntl", eperm, 3, unix.F_SETOWN_EX, allOnes)
	add("fcntl", retAllow, 3, unix.F_SETOWN, 2)
	add("fcntl", retAllow, 3, unix.F_SETOWN, 0xfffffffe)
	add("fcntl", retAllow, 3, unix.F_SETOWN, 0)
	add("fcntl", retAllow, 1, unix.F_GETFL, 1)
	add("fcntl", retAllow, 1, unix.F_SETFL, 1)
	add("fcntl", retAllow, 1, unix.F_GETOWN_EX, 1)
	add("fcntl", retAllow, unix.F_SETOWN, 1, unix.F_SETOWN_EX)
	return cs
}

// newVM loads an encoded program, as bwrap would hand it to the kernel, into x/net/bpf's
// interpreter.
func newVM(t testing.TB, prog []byte) *bpf.VM {
	t.Helper()
	if len(prog)%sockFilterSize != 0 {
		t.Fatalf("program is %d bytes, not a whole number of sock_filter", len(prog))
	}
	var insns []bpf.Instruction
	for b := prog; len(b) > 0; b = b[sockFilterSize:] {
		ri := bpf.RawInstruction{Op: binary.NativeEndian.Uint16(b), Jt: b[2], Jf: b[3], K: binary.NativeEndian.Uint32(b[4:])}
		insns = append(insns, ri.Disassemble())
	}
	vm, err := bpf.NewVM(insns)
	if err != nil {
		t.Fatalf("load program into the BPF VM: %v", err)
	}
	return vm
}

// seccompData builds struct seccomp_data (nr, arch, instruction_pointer, args[6]; 64 bytes)
// for the VM. The kernel loads each 32-bit word of it in native byte order, x/net/bpf's VM
// in big-endian order; so each word sits where a little-endian kernel finds it (an
// argument's low half first) with its bytes in the order the VM reads.
func seccompData(audit, nr uint32, args ...uint64) []byte {
	b := make([]byte, 64)
	binary.BigEndian.PutUint32(b[offNr:], nr)
	binary.BigEndian.PutUint32(b[offArch:], audit)
	binary.BigEndian.PutUint32(b[8:], 0xdeadbeef) // instruction_pointer: the filter ignores it
	for i, a := range args {
		binary.BigEndian.PutUint32(b[offArgs+8*i:], uint32(a))
		binary.BigEndian.PutUint32(b[offArgs+8*i+4:], uint32(a>>32))
	}
	return b
}

func run(t testing.TB, vm *bpf.VM, in []byte) uint32 {
	t.Helper()
	v, err := vm.Run(in)
	if err != nil {
		t.Fatalf("run filter: %v", err)
	}
	return uint32(v)
}

func TestNativeArch(t *testing.T) {
	golden, ok := goldenArchs[runtime.GOARCH]
	if !ok {
		_, err := Program()
		if !errors.Is(err, errors.ErrUnsupported) {
			t.Fatalf("Program on %s: err = %v, want ErrUnsupported", runtime.GOARCH, err)
		}
		if Rules() != nil {
			t.Fatalf("Rules on %s is not nil", runtime.GOARCH)
		}
		return
	}
	if nativeArch.audit != golden.audit || nativeArch.x32 != golden.x32 {
		t.Errorf("native audit %#x x32 %v, golden %#x %v", nativeArch.audit, nativeArch.x32, golden.audit, golden.x32)
	}
	if !maps.Equal(nativeArch.nr, golden.nr) {
		for n, v := range golden.nr {
			if nativeArch.nr[n] != v {
				t.Errorf("%s: x/sys says %d, the kernel's table %d", n, nativeArch.nr[n], v)
			}
		}
		t.Errorf("syscall numbers differ: %d from x/sys, %d in the golden table", len(nativeArch.nr), len(golden.nr))
	}
	if !slices.Equal(nativeArch.absent, golden.absent) {
		t.Errorf("absent %v, golden %v", nativeArch.absent, golden.absent)
	}
}

// TestProgramVM runs every case through the compiled program of each architecture.
func TestProgramVM(t *testing.T) {
	for _, goarch := range []string{"amd64", "arm64"} {
		t.Run(goarch, func(t *testing.T) {
			a := goldenArchs[goarch]
			f, err := build(a)
			if err != nil {
				t.Fatal(err)
			}
			vm := newVM(t, f.program)
			t.Logf("%s: %d instructions (%d bytes)", goarch, f.insns, len(f.program))

			covered := map[string]bool{}
			for _, c := range vmCases() {
				nr, ok := a.nr[c.syscall]
				if !ok {
					if !slices.Contains(a.absent, c.syscall) {
						t.Fatalf("test names unknown call %s", c.syscall)
					}
					continue
				}
				if c.want != retAllow {
					covered[c.syscall] = true
				}
				if got := run(t, vm, seccompData(a.audit, nr, c.args...)); got != c.want {
					t.Errorf("%v: got %s", c, verdict(got))
				}
			}
			// Every rule the program has was seen refusing, and nothing else is refused.
			for _, r := range f.rules {
				if r.Syscall != "*" && !covered[r.Syscall] {
					t.Errorf("rule %s (%s) has no refused case", r.Syscall, r.When)
				}
			}
			ruled := map[uint32]bool{}
			for _, n := range a.nr {
				ruled[n] = true
			}
			for nr := range uint32(1024) {
				if ruled[nr] {
					continue
				}
				for _, args := range [][]uint64{nil, slices.Repeat([]uint64{allOnes}, 6)} {
					if got := run(t, vm, seccompData(a.audit, nr, args...)); got != retAllow {
						t.Errorf("call %d without a rule (args %#x): got %s, want ALLOW", nr, args, verdict(got))
					}
				}
			}
		})
	}
}

func TestForeignABI(t *testing.T) {
	enosys := retErrno(syscall.ENOSYS)
	for _, tc := range []struct {
		goarch string
		audit  uint32
		nr     uint32
		want   uint32
	}{
		{"amd64", unix.AUDIT_ARCH_I386, 20, enosys}, // getpid through int 0x80
		{"amd64", unix.AUDIT_ARCH_I386, 0, enosys},
		{"amd64", unix.AUDIT_ARCH_I386, 26, enosys}, // i386 ptrace
		{"amd64", 0, 0, enosys},
		{"amd64", unix.AUDIT_ARCH_AARCH64, 0, enosys},
		{"amd64", unix.AUDIT_ARCH_X86_64, x32Bit | 39, enosys}, // x32 getpid
		{"amd64", unix.AUDIT_ARCH_X86_64, x32Bit | 165, enosys},
		{"amd64", unix.AUDIT_ARCH_X86_64, 0xffffffff, enosys},
		{"amd64", unix.AUDIT_ARCH_X86_64, 39, retAllow},
		{"arm64", unix.AUDIT_ARCH_ARM, 20, enosys}, // AArch32 getpid
		{"arm64", unix.AUDIT_ARCH_X86_64, 172, enosys},
		{"arm64", unix.AUDIT_ARCH_AARCH64, x32Bit | 172, retAllow}, // no x32 here: an unknown number
		{"arm64", unix.AUDIT_ARCH_AARCH64, 172, retAllow},
	} {
		f, err := build(goldenArchs[tc.goarch])
		if err != nil {
			t.Fatal(err)
		}
		if got := run(t, newVM(t, f.program), seccompData(tc.audit, tc.nr)); got != tc.want {
			t.Errorf("%s: arch %#x nr %#x: got %s, want %s", tc.goarch, tc.audit, tc.nr, verdict(got), verdict(tc.want))
		}
	}
}

// TestProgramShape checks what the kernel's seccomp_check_filter would: only the opcodes
// the filter means to use, aligned loads inside struct seccomp_data, forward jumps that land
// inside the program, a verdict at the end, and the length limit.
func TestProgramShape(t *testing.T) {
	const (
		ldAbsW = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		ja     = unix.BPF_JMP | unix.BPF_JA
		jeq    = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jge    = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
		jset   = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
		retK   = unix.BPF_RET | unix.BPF_K
	)
	for goarch, a := range goldenArchs {
		f, err := build(a)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := compile(a, mustResolve(t, a))
		if err != nil {
			t.Fatal(err)
		}
		if f.insns != len(raw) || len(f.program) != len(raw)*sockFilterSize || len(raw) > maxInsns {
			t.Fatalf("%s: %d instructions, %d bytes", goarch, len(raw), len(f.program))
		}
		for i, ri := range raw {
			switch ri.Op {
			case ldAbsW:
				if ri.K%4 != 0 || ri.K >= 64 {
					t.Errorf("%s: %d: load at %d", goarch, i, ri.K)
				}
			case ja:
				if i+1+int(ri.K) >= len(raw) {
					t.Errorf("%s: %d: ja past the end", goarch, i)
				}
			case jeq, jge, jset:
				if i+1+int(max(ri.Jt, ri.Jf)) >= len(raw) {
					t.Errorf("%s: %d: jump past the end", goarch, i)
				}
			case retK:
			default:
				t.Errorf("%s: %d: opcode %#x", goarch, i, ri.Op)
			}
		}
		if raw[len(raw)-1].Op != retK {
			t.Errorf("%s: the program does not end in a verdict", goarch)
		}
	}
}

func mustResolve(t testing.TB, a *arch) []rule {
	t.Helper()
	rules, err := a.resolve(table)
	if err != nil {
		t.Fatal(err)
	}
	return rules
}

// TestTableMatchesDesign: the table refuses what the design lists, with the errno it
// lists, and nothing unconditionally that the design does not list.
func TestTableMatchesDesign(t *testing.T) {
	for goarch, a := range goldenArchs {
		rules := mustResolve(t, a)
		always := map[string]syscall.Errno{}
		for _, r := range rules {
			if r.when == nil {
				always[r.name] = r.errno
			}
		}
		want := map[string]syscall.Errno{}
		for _, n := range alwaysEPERM {
			want[n] = syscall.EPERM
		}
		for _, n := range alwaysENOSYS {
			want[n] = syscall.ENOSYS
		}
		for _, n := range a.absent {
			delete(want, n)
		}
		if !maps.Equal(always, want) {
			t.Errorf("%s: unconditional refusals\n got %v\nwant %v", goarch, always, want)
		}
	}
	// Every name in the table has a number or is known to be absent, on each architecture.
	for goarch, a := range goldenArchs {
		for _, e := range table {
			for _, n := range e.syscalls {
				if _, ok := a.nr[n]; !ok && !slices.Contains(a.absent, n) {
					t.Errorf("%s: %s has no number", goarch, n)
				}
			}
		}
	}
	// A misspelt name is an error, not a silently missing rule.
	bad := []entry{{syscalls: []string{"mount", "mnt"}, errno: syscall.EPERM}}
	if _, err := goldenArchs["amd64"].resolve(bad); err == nil || !strings.Contains(err.Error(), `"mnt"`) {
		t.Errorf("resolve of an unknown name: err = %v", err)
	}
}

func TestRules(t *testing.T) {
	rules := Rules()
	if _, ok := goldenArchs[runtime.GOARCH]; !ok {
		t.Logf("nothing to test: no syscall table on %s (TestNativeArch checks the error)", runtime.GOARCH)
		return
	}
	byCall := map[string][]Rule{}
	for _, r := range rules {
		if r.When == "" || r.Why == "" || r.Errno == 0 {
			t.Errorf("incomplete rule %+v", r)
		}
		byCall[r.Syscall] = append(byCall[r.Syscall], r)
	}
	if rs := byCall["*"]; len(rs) == 0 || rs[0].Errno != syscall.ENOSYS || !strings.Contains(rs[0].When, "seccomp_data.arch") {
		t.Errorf("foreign-architecture rules: %+v", rs)
	}
	openat := byCall["openat"]
	if len(openat) != 1 || openat[0].When != "arg2 (flags) has O_CREAT or __O_TMPFILE and arg3 (mode) has S_ISUID or S_ISGID" {
		t.Errorf("openat: %+v", openat)
	}
	if s := byCall["socket"]; len(s) != 1 || s[0].Errno != syscall.EAFNOSUPPORT ||
		s[0].When != "arg0 (domain) is none of AF_UNIX, AF_INET, AF_INET6, AF_NETLINK" {
		t.Errorf("socket: %+v", s)
	}
	if f := byCall["fcntl"]; len(f) != 2 || f[0].When != "arg1 (cmd) is F_SETOWN and arg2 (arg) is 1 or -1" {
		t.Errorf("fcntl: %+v", f)
	}
	if m := byCall["mount"]; len(m) != 1 || m[0].When != "always" || m[0].Errno != syscall.EPERM {
		t.Errorf("mount: %+v", m)
	}
	// Rules hands out copies.
	rules[0].Syscall = "changed"
	if Rules()[0].Syscall == "changed" {
		t.Error("Rules returned the cached slice")
	}
	p1, _ := Program()
	p1[0] ^= 0xff
	if p2, _ := Program(); p2[0] == p1[0] {
		t.Error("Program returned the cached slice")
	}
}

// TestAssembleFarJumps: a conditional jump past 255 instructions goes through a detour,
// and the detours are laid out so that every target is still right. Around the limit, a
// wrong offset would be truncated to 8 bits and land elsewhere.
func TestAssembleFarJumps(t *testing.T) {
	for _, gap := range []int{0, 1, 200, 248, 249, 250, 251, 252, 253, 254, 255, 256, 300, 1000, maxInsns} {
		var p asm
		far, near := p.newLabel(), p.newLabel()
		p.load(0)
		p.jumpIf(bpf.JumpEqual, 1, far, next)          // A == 1 → far
		p.jumpIf(bpf.JumpEqual, 2, near, next)         // A == 2 → near
		p.jumpIf(bpf.JumpGreaterOrEqual, 3, far, near) // A >= 3 → far, else near
		p.place(near)
		p.ret(2)
		for range gap {
			p.ret(0xbad)
		}
		p.place(far)
		p.ret(1)
		raw, err := p.assemble()
		if gap == maxInsns {
			if err == nil {
				t.Errorf("gap %d: %d instructions assembled", gap, len(raw))
			}
			continue
		}
		if err != nil {
			t.Fatalf("gap %d: %v", gap, err)
		}
		vm := newVM(t, encode(raw))
		for a, want := range map[uint32]uint32{0: 2, 1: 1, 2: 2, 3: 1, 7: 1} {
			in := binary.BigEndian.AppendUint32(nil, a)
			if got := run(t, vm, in); got != want {
				t.Errorf("gap %d: A=%d: got %d, want %d", gap, a, got, want)
			}
		}
		detours := len(raw) - (gap + 6)
		switch {
		case gap <= 200 && detours != 0:
			t.Errorf("gap %d: %d detours, want none", gap, detours)
		case gap >= 256 && detours != 2: // both jumps to far; the one to near is short
			t.Errorf("gap %d: %d detours, want 2", gap, detours)
		}
	}
}

func TestAssembleErrors(t *testing.T) {
	var back asm
	l := back.newLabel()
	back.place(l)
	back.ret(0)
	back.jump(l)
	back.ret(0)
	if _, err := back.assemble(); err == nil || !strings.Contains(err.Error(), "backwards") {
		t.Errorf("backward jump: err = %v", err)
	}
	var unplaced asm
	unplaced.jump(unplaced.newLabel())
	unplaced.ret(0)
	if _, err := unplaced.assemble(); err == nil || !strings.Contains(err.Error(), "never placed") {
		t.Errorf("unplaced label: err = %v", err)
	}
	var long asm
	for range maxInsns + 1 {
		long.ret(0)
	}
	if _, err := long.assemble(); err == nil || !strings.Contains(err.Error(), "4096") {
		t.Errorf("too long: err = %v", err)
	}
}

// BenchmarkProgram is what a sandbox start pays: the filter is built once per process.
func BenchmarkProgram(b *testing.B) {
	if _, err := Program(); err != nil {
		b.Skip(err)
	}
	for b.Loop() {
		if _, err := Program(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBuild is the first call: resolving the table, compiling and assembling it.
func BenchmarkBuild(b *testing.B) {
	a := goldenArchs["amd64"]
	for b.Loop() {
		if _, err := build(a); err != nil {
			b.Fatal(err)
		}
	}
}
