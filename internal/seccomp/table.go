//go:build linux

package seccomp

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// entry is one line of the table: the calls it names are refused with errno when (nil:
// always) holds.
type entry struct {
	syscalls []string
	errno    syscall.Errno
	when     cond
	why      string
}

// Constants the rules test that golang.org/x/sys/unix does not export. The flag values
// the table uses are the same on amd64 and arm64 (the generic ones); an architecture
// whose values differ (mips, powerpc, sparc, alpha) gets its own from x/sys when built
// for it.
const (
	fioSetOwn   = 0x8901                             // FIOSETOWN (asm-generic/sockios.h)
	oTmpfileBit = unix.O_TMPFILE &^ unix.O_DIRECTORY // __O_TMPFILE: O_TMPFILE is it plus O_DIRECTORY
	perLinux    = 0x0000                             // PER_LINUX (linux/personality.h)
	perLinux32  = 0x0008                             // PER_LINUX32
	perQuery    = 0xffffffff                         // personality(0xffffffff) only reads it
	sigRTMin    = 32                                 // the kernel's SIGRTMIN (glibc reserves 32 and 33)
)

// Values the rules share.
var (
	setidBits   = []val{{"S_ISUID", unix.S_ISUID}, {"S_ISGID", unix.S_ISGID}}
	createsFile = []val{{"O_CREAT", unix.O_CREAT}, {"__O_TMPFILE", oTmpfileBit}}
	// The namespaces a clone may not create. CLONE_NEWTIME is missing on purpose: in
	// clone() its bit is part of CSIGNAL (the exit signal), and with clone3 refused and
	// unshare refused there is no other way to a time namespace.
	newNamespaces = []val{
		{"CLONE_NEWNS", unix.CLONE_NEWNS}, {"CLONE_NEWCGROUP", unix.CLONE_NEWCGROUP},
		{"CLONE_NEWUTS", unix.CLONE_NEWUTS}, {"CLONE_NEWIPC", unix.CLONE_NEWIPC},
		{"CLONE_NEWUSER", unix.CLONE_NEWUSER}, {"CLONE_NEWPID", unix.CLONE_NEWPID},
		{"CLONE_NEWNET", unix.CLONE_NEWNET},
	}
	pid1 = []val{{"1", 1}}
	// The signals a Go or glibc program sends its own threads with tgkill(getpid(), ...).
	runtimeSignals = []val{{"SIGURG", uint32(unix.SIGURG)}, {"SIGRTMIN+1", sigRTMin + 1}}
	pid1Pgrp       = []val{{"1", 1}, {"-1", 0xffffffff}} // F_SETOWN: -1 is process group 1
)

const whySetid = "a setuid or setgid file made in the sandbox keeps its bits on the host, " +
	"owned by the host user the sandbox user maps to: no file may leave a sandbox, live " +
	"or through a snapshot, with those bits"

const whyPid1 = "pid 1 is the sandbox's agent, which serves every call: the kernel drops " +
	"only the SIGKILL and SIGSTOP a namespace's init gets from inside, and a signal it " +
	"handles (SIGTERM, SIGINT, SIGQUIT) would end it. (Not a wall: kill() given the id of " +
	"any other thread of pid 1 reaches it too, and no filter knows those ids; the agent " +
	"must ignore the signals it does not need)"

const whyNamespaces = "a new namespace hands its creator every capability over it and with " +
	"them the kernel code that only privileged users reach (user namespaces are the way in " +
	"of most unprivileged kernel exploits); bubblewrap has already made the ones the " +
	"sandbox needs"

// table is the filter: what it refuses, on which arguments, and why. Program compiles it,
// Rules describes it. A call this architecture lacks is skipped (arch.absent); order
// matters only between entries for the same call.
var table = []entry{
	// Interfaces a coding workspace never needs, each a large and often-exploited
	// stretch of kernel code.
	{syscalls: []string{"io_uring_setup", "io_uring_enter", "io_uring_register"}, errno: syscall.EPERM,
		why: "io_uring is a second system-call interface whose operations seccomp never sees, " +
			"and a steady source of kernel privilege escalations; its users fall back to plain I/O"},
	{syscalls: []string{"bpf"}, errno: syscall.EPERM,
		why: "eBPF programs and maps reach deep into the kernel (verifier bugs are escalations)"},
	{syscalls: []string{"perf_event_open"}, errno: syscall.EPERM,
		why: "performance counters: a large kernel surface and a side channel into other processes"},
	{syscalls: []string{"userfaultfd"}, errno: syscall.EPERM,
		why: "lets a process hold the kernel inside a page fault for as long as it likes, " +
			"the usual tool to win a kernel race"},
	{syscalls: []string{"kexec_load", "kexec_file_load", "reboot"}, errno: syscall.EPERM,
		why: "replaces or restarts the kernel: the host's business"},
	{syscalls: []string{"init_module", "finit_module", "delete_module"}, errno: syscall.EPERM,
		why: "loads or unloads kernel code"},
	{syscalls: []string{"iopl", "ioperm"}, errno: syscall.EPERM,
		why: "raw access to the machine's I/O ports"},
	{syscalls: []string{"swapon", "swapoff"}, errno: syscall.EPERM,
		why: "swap is the host's"},
	{syscalls: []string{"syslog"}, errno: syscall.EPERM,
		why: "the kernel log shows the host's activity and kernel addresses"},
	{syscalls: []string{"acct"}, errno: syscall.EPERM,
		why: "process accounting writes every exit on the machine to a file"},
	{syscalls: []string{"settimeofday", "clock_settime", "clock_adjtime", "adjtimex"}, errno: syscall.EPERM,
		why: "the clock is not namespaced: setting it sets the host's"},
	{syscalls: []string{"quotactl", "quotactl_fd"}, errno: syscall.EPERM,
		why: "disk quotas are the host's"},
	{syscalls: []string{"lookup_dcookie", "uselib"}, errno: syscall.EPERM,
		why: "obsolete interfaces (oprofile's dentry cookies, a.out shared libraries) nothing current uses and few still test"},
	{syscalls: []string{"vhangup"}, errno: syscall.EPERM,
		why: "hangs up the terminal the process controls"},
	{syscalls: []string{"name_to_handle_at", "open_by_handle_at"}, errno: syscall.EPERM,
		why: "open_by_handle_at opens any file of a filesystem by its handle, past the mount " +
			"namespace (the \"shocker\" container escape); name_to_handle_at makes the handles"},
	{syscalls: []string{"keyctl", "add_key", "request_key"}, errno: syscall.EPERM,
		why: "the kernel's keyrings are not namespaced (keys could pass between sandboxes and " +
			"the host) and a frequent source of kernel bugs"},
	{syscalls: []string{"mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree",
		"open_tree_attr", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr"}, errno: syscall.EPERM,
		why: "the sandbox's view of the filesystem is bubblewrap's to make: remounting could undo " +
			"its read-only binds, and mounting reaches filesystem parsers"},
	{syscalls: []string{"unshare", "setns"}, errno: syscall.EPERM, why: whyNamespaces},
	{syscalls: []string{"clone"}, errno: syscall.EPERM,
		when: hasAny{arg{0, "flags"}, newNamespaces}, why: whyNamespaces},
	{syscalls: []string{"ptrace", "process_vm_readv", "process_vm_writev"}, errno: syscall.EPERM,
		why: "reads or writes another process's memory, the agent's (pid 1) among them"},

	// Calls whose arguments live in a struct seccomp cannot read, or that reach processes
	// past the pid checks below. ENOSYS, not EPERM: glibc, Go and Python take ENOSYS as
	// "this kernel is older" and fall back to the calls the rules do check.
	{syscalls: []string{"clone3"}, errno: syscall.ENOSYS,
		why: "its flags sit in a struct, so new namespaces could not be refused; callers fall back to clone"},
	{syscalls: []string{"openat2"}, errno: syscall.ENOSYS,
		why: "its flags and mode sit in a struct, so setuid bits could not be refused; callers fall back to openat"},
	{syscalls: []string{"pidfd_open", "pidfd_send_signal", "pidfd_getfd"}, errno: syscall.ENOSYS,
		why: "a pidfd (pidfd_open, or a /proc/PID directory given to pidfd_send_signal) reaches " +
			"a process past the pid-1 rules, and pidfd_getfd takes its descriptors; callers fall back to pids"},

	// No setuid or setgid bits, ever. Mode is arg1 of the calls on a path or descriptor
	// and arg2 of their *at forms; open's mode means something only with O_CREAT or
	// O_TMPFILE (otherwise the register holds whatever was there), so it is read only then.
	{syscalls: []string{"chmod", "fchmod", "mkdir", "mknod", "creat"}, errno: syscall.EPERM,
		when: hasAny{arg{1, "mode"}, setidBits}, why: whySetid},
	{syscalls: []string{"fchmodat", "fchmodat2", "mkdirat", "mknodat"}, errno: syscall.EPERM,
		when: hasAny{arg{2, "mode"}, setidBits}, why: whySetid},
	{syscalls: []string{"open"}, errno: syscall.EPERM,
		when: allOf{hasAny{arg{1, "flags"}, createsFile}, hasAny{arg{2, "mode"}, setidBits}}, why: whySetid},
	{syscalls: []string{"openat"}, errno: syscall.EPERM,
		when: allOf{hasAny{arg{2, "flags"}, createsFile}, hasAny{arg{3, "mode"}, setidBits}}, why: whySetid},

	{syscalls: []string{"personality"}, errno: syscall.EPERM,
		when: isNoneOf{arg{0, "persona"}, []val{{"PER_LINUX", perLinux}, {"PER_LINUX32", perLinux32}, {"0xffffffff (query)", perQuery}}},
		why: "other personalities change how the kernel treats the process (READ_IMPLIES_EXEC, " +
			"ADDR_NO_RANDOMIZE, legacy layouts) and have made exploits easier"},

	{syscalls: []string{"socket", "socketpair"}, errno: syscall.EAFNOSUPPORT,
		when: isNoneOf{arg{0, "domain"}, []val{{"AF_UNIX", unix.AF_UNIX}, {"AF_INET", unix.AF_INET}, {"AF_INET6", unix.AF_INET6}, {"AF_NETLINK", unix.AF_NETLINK}}},
		why: "every other address family (packet, vsock, bluetooth, tipc, can, xdp, ...) is " +
			"kernel code a workspace never needs; EAFNOSUPPORT is what a kernel without the family answers"},

	{syscalls: []string{"ioctl"}, errno: syscall.EPERM,
		when: isOneOf{arg{1, "request"}, []val{{"TIOCSTI", unix.TIOCSTI}, {"TIOCLINUX", unix.TIOCLINUX}, {"FIOSETOWN", fioSetOwn}, {"SIOCSPGRP", unix.SIOCSPGRP}}},
		why: "TIOCSTI and TIOCLINUX push input into a terminal that another process reads; " +
			"FIOSETOWN and SIOCSPGRP aim SIGIO like F_SETOWN"},

	// Keep signals off the agent. kill(-1, ...) needs no rule: the kernel never delivers
	// a broadcast to the namespace's init.
	{syscalls: []string{"kill", "rt_sigqueueinfo"}, errno: syscall.EPERM,
		when: isOneOf{arg{0, "pid"}, pid1}, why: whyPid1},
	{syscalls: []string{"rt_tgsigqueueinfo"}, errno: syscall.EPERM,
		when: isOneOf{arg{0, "tgid"}, pid1}, why: whyPid1},
	{syscalls: []string{"tgkill"}, errno: syscall.EPERM,
		when: allOf{isOneOf{arg{0, "tgid"}, pid1}, isNoneOf{arg{2, "sig"}, runtimeSignals}},
		why: whyPid1 + ". Two signals stay allowed: pid 1's own runtime sends them to its own " +
			"threads (SIGURG preempts a goroutine; SIGRTMIN+1 makes every thread of a Go or " +
			"glibc program take a new uid or gid). Refused, a goroutine looping without calls " +
			"stops the agent's garbage collector for good. Both are harmless to a program that " +
			"did not ask for them"},
	// Keep the sandbox's limits on the agent. A process may change its own limits
	// (setrlimit, prlimit64 with pid 0: what libc and Go use), never another's: a command
	// that lowered pid 1's (NOFILE 16, NPROC 0) would leave the sandbox unable to start
	// anything. pid 1 alone would not do: prlimit64 takes the id of any thread of a
	// process, and pid 1's threads have ids no filter knows.
	{syscalls: []string{"prlimit64"}, errno: syscall.EPERM,
		when: isNoneOf{arg{0, "pid"}, []val{{"0", 0}}},
		why: "the limits of another process, the agent's included, are not the sandbox's to change; " +
			"a process sets its own (pid 0), and reads another's in /proc/PID/limits"},
	{syscalls: []string{"tkill"}, errno: syscall.EPERM,
		why: "obsolete (tgkill replaced it), and it takes a thread id alone, which says nothing of whose thread it is"},
	{syscalls: []string{"fcntl"}, errno: syscall.EPERM,
		when: allOf{isOneOf{arg{1, "cmd"}, []val{{"F_SETOWN", unix.F_SETOWN}}}, isOneOf{arg{2, "arg"}, pid1Pgrp}},
		why:  "SIGIO and SIGURG aimed at pid 1 or its process group would signal the agent"},
	{syscalls: []string{"fcntl"}, errno: syscall.EPERM,
		when: isOneOf{arg{1, "cmd"}, []val{{"F_SETOWN_EX", unix.F_SETOWN_EX}}},
		why:  "aims SIGIO and SIGURG through a struct seccomp cannot read, so it could aim them at the agent"},
}
