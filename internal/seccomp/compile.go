//go:build linux

package seccomp

import (
	"cmp"
	"fmt"
	"slices"
	"syscall"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Layout of struct seccomp_data (linux/seccomp.h): the call's number, its AUDIT_ARCH, the
// instruction pointer, then six 64-bit arguments.
const (
	offNr   = 0
	offArch = 4
	offArgs = 16
)

// argLow is the offset of the low 32 bits of argument i. Both supported architectures are
// little-endian, so the low half comes first.
func argLow(i int) uint32 { return offArgs + 8*uint32(i) }

// x32Bit marks a call of the x32 ABI on x86_64 (__X32_SYSCALL_BIT). x32 calls carry
// AUDIT_ARCH_X86_64 too, so only this bit tells them apart.
const x32Bit = 0x40000000

// Verdicts (SECCOMP_RET_*).
const retAllow = unix.SECCOMP_RET_ALLOW

func retErrno(e syscall.Errno) uint32 {
	return unix.SECCOMP_RET_ERRNO | uint32(e)&unix.SECCOMP_RET_DATA
}

// arch is what the filter needs to know of one architecture's system-call ABI.
type arch struct {
	goarch string
	audit  uint32 // AUDIT_ARCH_* of native calls, as the kernel puts it in seccomp_data.arch
	x32    bool   // the x32 ABI shares audit: refuse numbers carrying x32Bit
	// nr maps each system call of the table that this architecture has to its number.
	nr map[string]uint32
	// absent lists the calls of the table this architecture never had (open, chmod, ... on
	// arm64). A name in neither nr nor absent is a mistake in the table.
	absent []string
}

// rule is one table entry resolved for an architecture: one call, one condition.
type rule struct {
	name  string
	nr    uint32
	errno syscall.Errno
	when  cond // nil: always
	why   string
}

// describe is r for people.
func (r rule) describe() Rule {
	when := "always"
	if r.when != nil {
		when = r.when.String()
	}
	return Rule{Syscall: r.name, Errno: r.errno, When: when, Why: r.why}
}

// resolve expands the table into one rule per call this architecture has, in table order.
func (a *arch) resolve(t []entry) ([]rule, error) {
	var rules []rule
	for _, e := range t {
		for _, name := range e.syscalls {
			nr, ok := a.nr[name]
			switch {
			case ok:
				rules = append(rules, rule{name: name, nr: nr, errno: e.errno, when: e.when, why: e.why})
			case slices.Contains(a.absent, name):
			default:
				return nil, fmt.Errorf("no number for system call %q on %s", name, a.goarch)
			}
		}
	}
	return rules, nil
}

// Why a foreign architecture's call is refused; Rules reports it with the wholeRules.
const whyForeign = "a call through another architecture's entry point has other numbers, " +
	"which the per-call rules do not see; ENOSYS is what a kernel without that ABI answers"

// wholeRules describes the checks made before the per-call rules.
func (a *arch) wholeRules() []Rule {
	rs := []Rule{{
		Syscall: "*", Errno: syscall.ENOSYS,
		When: fmt.Sprintf("seccomp_data.arch is not 0x%x (the native ABI of %s)", a.audit, a.goarch),
		Why:  whyForeign,
	}}
	if a.x32 {
		rs = append(rs, Rule{
			Syscall: "*", Errno: syscall.ENOSYS,
			When: fmt.Sprintf("the call number has bit 0x%x (the x32 ABI)", x32Bit),
			Why:  whyForeign,
		})
	}
	return rs
}

// call is one system call that has rules, with its rules in table order.
type call struct {
	nr    uint32
	rules []rule
}

// compile generates the filter for rules:
//
//	A = arch; if A != native ABI: return ENOSYS
//	A = nr;   if A has x32Bit:    return ENOSYS      (x86_64 only)
//	binary search for nr among the calls that have rules; at a call, its rules in
//	order, each "if condition: return errno", then return ALLOW
//	any other nr: return ALLOW
func compile(a *arch, rules []rule) ([]rawInsn, error) {
	var calls []call
	byNr := map[uint32]int{}
	for _, r := range rules {
		i, ok := byNr[r.nr]
		if !ok {
			i = len(calls)
			byNr[r.nr] = i
			calls = append(calls, call{nr: r.nr})
		}
		c := &calls[i]
		if n := len(c.rules); n > 0 {
			if c.rules[0].name != r.name {
				return nil, fmt.Errorf("%s and %s share number %d", c.rules[0].name, r.name, r.nr)
			}
			if c.rules[n-1].when == nil {
				return nil, fmt.Errorf("%s: a rule after one that always applies is never reached", r.name)
			}
		}
		c.rules = append(c.rules, r)
	}
	slices.SortFunc(calls, func(x, y call) int { return cmp.Compare(x.nr, y.nr) })

	var p asm
	enosys := retErrno(syscall.ENOSYS)
	p.load(offArch)
	native := p.newLabel()
	p.jumpIf(bpf.JumpEqual, a.audit, native, next)
	p.ret(enosys)
	p.place(native)
	p.load(offNr)
	if a.x32 {
		ok := p.newLabel()
		p.jumpIf(bpf.JumpBitsSet, x32Bit, next, ok)
		p.ret(enosys)
		p.place(ok)
	}
	search(&p, calls)
	return p.assemble()
}

// leafCalls is how many calls a leaf of the binary search compares one by one; for fewer,
// another split saves no comparison.
const leafCalls = 4

// search emits a binary search for the call number in A among calls, sorted by number.
// Every path ends in a verdict.
func search(p *asm, calls []call) {
	if len(calls) > leafCalls {
		mid := len(calls) / 2
		upper := p.newLabel()
		p.jumpIf(bpf.JumpGreaterOrEqual, calls[mid].nr, upper, next)
		search(p, calls[:mid])
		p.place(upper)
		search(p, calls[mid:])
		return
	}
	for _, c := range calls {
		other := p.newLabel()
		p.jumpIf(bpf.JumpEqual, c.nr, next, other)
		emitRules(p, c.rules)
		p.place(other)
	}
	p.ret(retAllow)
}

// emitRules emits the rules of one call: each refuses when its condition holds, and a call
// that passes them all is allowed. The conditions load arguments into A, which is why
// every path ends here in a verdict.
func emitRules(p *asm, rules []rule) {
	for _, r := range rules {
		if r.when == nil {
			p.ret(retErrno(r.errno))
			return
		}
		refuse, pass := p.newLabel(), p.newLabel()
		r.when.emit(p, refuse, pass)
		p.place(refuse)
		p.ret(retErrno(r.errno))
		p.place(pass)
	}
	p.ret(retAllow)
}
