//go:build linux

// Package seccomp builds the seccomp-BPF filter that bubblewrap installs (--seccomp FD) in
// every toolhost sandbox and in the sandboxed browser. The sandbox is a coding workspace:
// shells, coreutils, git, Python, Node, Go and C compilers must all keep working, so the
// filter is a deny list. It refuses, with an errno, the system calls such a workspace never
// needs and that widen the shared kernel's surface (io_uring, bpf, keyrings, the mount
// family, new namespaces, ptrace, kernel modules, the clock), the arguments that would make
// files setuid or setgid on the host, and the signals that would reach the sandbox's agent
// (pid 1). Everything else is allowed.
//
// The code has this shape because:
//
//   - One table (table.go) is the single source. Program compiles it for this machine's
//     architecture, Rules describes it in words for the docs and `toolhost doctor`, and the
//     tests check both, in a BPF interpreter and against the real kernel.
//   - A refused call fails with an errno and never kills the caller. Runtimes probe for
//     newer calls and fall back on ENOSYS (glibc and Go for clone3, openat2 and pidfd_*),
//     and a build that reads EPERM is easier to diagnose than one that dies.
//   - It is pure Go (no cgo, no libseccomp): a small assembler (asm.go) with symbolic labels
//     lays the program out and computes every jump, and where a conditional jump (8-bit
//     offset) cannot reach its target it goes through an unconditional one. Calls are
//     dispatched by a binary search on their number, so a call with an argument rule
//     (openat, ioctl, fcntl) costs a handful of comparisons; for a call without a rule the
//     kernel learns that the filter always allows it and stops running it.
//   - The program first refuses, with ENOSYS, every call made through another
//     architecture's entry point (i386 via int 0x80 on x86_64, the x32 ABI, AArch32):
//     those calls have other numbers, and the per-number rules would not see them.
//   - Arguments are compared on their low 32 bits only. Every argument the rules look at is
//     an int, unsigned int or mode_t in the kernel, which ignores the upper half, so setting
//     it changes nothing the kernel does and must not change the verdict either.
//
// Syscall numbers come from golang.org/x/sys/unix, one build-tagged file per architecture
// (amd64 and arm64); elsewhere Program fails with an error wrapping errors.ErrUnsupported.
package seccomp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"syscall"
)

// Rule is one refusal of the filter, described for people.
type Rule struct {
	// Syscall is the system call's name as in the kernel's tables ("openat"), or "*" for a
	// rule that applies to every call.
	Syscall string
	// Errno is what the refused call returns (EPERM, ENOSYS or EAFNOSUPPORT).
	Errno syscall.Errno
	// When says on which arguments the call is refused, naming each argument by its
	// position ("always" when the arguments do not matter).
	When string
	// Why says what the refusal protects.
	Why string
}

// Program returns the compiled filter for the architecture this binary runs on
// (runtime.GOARCH), in the form bubblewrap's --seccomp reads from its descriptor: an array
// of struct sock_filter (u16 code, u8 jt, u8 jf, u32 k; 8 bytes each, native byte order).
// bubblewrap sets no_new_privs and installs it right before it executes the sandbox's first
// process. Each call returns a new slice that the caller may keep or modify. On an
// architecture without a syscall table the error wraps errors.ErrUnsupported.
func Program() ([]byte, error) {
	f, err := nativeFilter()
	if err != nil {
		return nil, err
	}
	return slices.Clone(f.program), nil
}

// Rules lists what Program refuses on this architecture, in the order the table gives
// them: first the rules on every call (foreign architectures), then one Rule per system
// call and condition. A call listed here that this architecture lacks (open, chmod and
// others on arm64) is left out. It returns nil where Program is unsupported.
func Rules() []Rule {
	f, err := nativeFilter()
	if err != nil {
		return nil
	}
	return slices.Clone(f.rules)
}

// filter is a compiled table for one architecture.
type filter struct {
	program []byte
	rules   []Rule
	insns   int // instructions in program
}

// nativeFilter builds the filter for runtime.GOARCH once per process: it is the same every time,
// and every sandbox start asks for it.
var nativeFilter = sync.OnceValues(func() (*filter, error) {
	if nativeArch == nil {
		return nil, fmt.Errorf("seccomp filter for %s: no syscall table for this architecture: %w", runtime.GOARCH, errors.ErrUnsupported)
	}
	return build(nativeArch)
})

// build compiles the table for a.
func build(a *arch) (*filter, error) {
	rules, err := a.resolve(table)
	if err != nil {
		return nil, fmt.Errorf("seccomp filter for %s: %w", a.goarch, err)
	}
	raw, err := compile(a, rules)
	if err != nil {
		return nil, fmt.Errorf("seccomp filter for %s: %w", a.goarch, err)
	}
	f := &filter{program: encode(raw), insns: len(raw)}
	f.rules = append(f.rules, a.wholeRules()...)
	for _, r := range rules {
		f.rules = append(f.rules, r.describe())
	}
	return f, nil
}

// sockFilterSize is sizeof(struct sock_filter).
const sockFilterSize = 8

// encode lays instructions out as struct sock_filter in native byte order, which is how
// bubblewrap hands them to prctl(PR_SET_SECCOMP).
func encode(raw []rawInsn) []byte {
	b := make([]byte, 0, len(raw)*sockFilterSize)
	for _, ri := range raw {
		b = binary.NativeEndian.AppendUint16(b, ri.Op)
		b = append(b, ri.Jt, ri.Jf)
		b = binary.NativeEndian.AppendUint32(b, ri.K)
	}
	return b
}
