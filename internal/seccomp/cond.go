//go:build linux

package seccomp

import (
	"fmt"
	"strings"

	"golang.org/x/net/bpf"
)

// cond is a test on the arguments of a call. Tests compare the low 32 bits of an argument
// (see the package comment).
type cond interface {
	// emit emits code that jumps to yes when the test holds and to no otherwise.
	emit(p *asm, yes, no label)
	// String says the test in words, for Rule.When.
	String() string
}

// val is a constant under the name the kernel's headers give it.
type val struct {
	name string
	v    uint32
}

// arg is argument i of a call, with the name the call's manual page gives it.
type arg struct {
	i    int
	name string
}

func (a arg) String() string { return fmt.Sprintf("arg%d (%s)", a.i, a.name) }

// hasAny holds when the argument has any of the bits.
type hasAny struct {
	arg  arg
	bits []val
}

func (c hasAny) emit(p *asm, yes, no label) {
	var mask uint32
	for _, b := range c.bits {
		mask |= b.v
	}
	p.load(argLow(c.arg.i))
	p.jumpIf(bpf.JumpBitsSet, mask, yes, no)
}

func (c hasAny) String() string { return fmt.Sprintf("%s has %s", c.arg, list(c.bits)) }

// isOneOf holds when the argument is one of vals.
type isOneOf struct {
	arg  arg
	vals []val
}

func (c isOneOf) emit(p *asm, yes, no label) { emitIn(p, c.arg, c.vals, yes, no) }

func (c isOneOf) String() string { return fmt.Sprintf("%s is %s", c.arg, list(c.vals)) }

// isNoneOf holds when the argument is none of vals.
type isNoneOf struct {
	arg  arg
	vals []val
}

func (c isNoneOf) emit(p *asm, yes, no label) { emitIn(p, c.arg, c.vals, no, yes) }

func (c isNoneOf) String() string {
	names := make([]string, len(c.vals))
	for i, v := range c.vals {
		names[i] = v.name
	}
	return fmt.Sprintf("%s is none of %s", c.arg, strings.Join(names, ", "))
}

// emitIn jumps to in when the argument is one of vals and to out otherwise.
func emitIn(p *asm, a arg, vals []val, in, out label) {
	if len(vals) == 0 {
		p.jump(out)
		return
	}
	p.load(argLow(a.i))
	for i, v := range vals {
		miss := next
		if i == len(vals)-1 {
			miss = out
		}
		p.jumpIf(bpf.JumpEqual, v.v, in, miss)
	}
}

// allOf holds when every one of its conditions does; they are tested in order.
type allOf []cond

func (c allOf) emit(p *asm, yes, no label) {
	if len(c) == 0 {
		p.jump(yes)
		return
	}
	for _, sub := range c[:len(c)-1] {
		holds := p.newLabel()
		sub.emit(p, holds, no)
		p.place(holds)
	}
	c[len(c)-1].emit(p, yes, no)
}

func (c allOf) String() string {
	s := make([]string, len(c))
	for i, sub := range c {
		s[i] = sub.String()
	}
	return strings.Join(s, " and ")
}

// list names vals as "A", "A or B", "A, B or C".
func list(vals []val) string {
	var b strings.Builder
	for i, v := range vals {
		switch {
		case i == 0:
		case i == len(vals)-1:
			b.WriteString(" or ")
		default:
			b.WriteString(", ")
		}
		b.WriteString(v.name)
	}
	return b.String()
}
