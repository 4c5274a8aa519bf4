//go:build linux

package seccomp

import (
	"fmt"

	"golang.org/x/net/bpf"
)

// rawInsn is one assembled instruction (struct sock_filter).
type rawInsn = bpf.RawInstruction

// maxInsns is the kernel's limit on a filter's length (BPF_MAXINSNS).
const maxInsns = 4096

// maxCondSkip is the farthest a conditional jump reaches: its offsets are 8 bits.
const maxCondSkip = 255

// label names a place in a program under construction. Jumps name labels, never offsets;
// asm.assemble turns them into offsets once the layout is known.
type label int

// next is the label of the instruction right after a jump (offset 0).
const next label = -1

// asm collects a classic BPF program with symbolic jumps. Classic BPF jumps only forward,
// so every label a jump names must be placed after the jump.
type asm struct {
	items  []item
	labels []int // label → index in items of the instruction it stands before; -1 until placed
}

// item is one instruction of the program being built: a plain one, or a jump to labels.
type item struct {
	insn bpf.Instruction // set for everything but jumps

	isJump  bool
	always  bool // ja; otherwise a conditional jump (test, val) to yes or no
	test    bpf.JumpTest
	val     uint32
	yes, no label // for ja, yes is the target
}

// newLabel returns a label that is not placed yet.
func (a *asm) newLabel() label {
	a.labels = append(a.labels, -1)
	return label(len(a.labels) - 1)
}

// place puts l before the next instruction emitted.
func (a *asm) place(l label) {
	a.labels[l] = len(a.items)
}

func (a *asm) emit(in bpf.Instruction) { a.items = append(a.items, item{insn: in}) }

// load loads the 32-bit word at off in struct seccomp_data into A.
func (a *asm) load(off uint32) { a.emit(bpf.LoadAbsolute{Off: off, Size: 4}) }

// ret ends the program with the verdict v.
func (a *asm) ret(v uint32) { a.emit(bpf.RetConstant{Val: v}) }

// jumpIf jumps to yes when A passes test against val, to no otherwise. Only the tests
// classic BPF has as opcodes are used (JumpEqual, JumpGreaterOrEqual, JumpBitsSet, ...);
// the negated ones would be rewritten by the library with the targets swapped.
func (a *asm) jumpIf(test bpf.JumpTest, val uint32, yes, no label) {
	a.items = append(a.items, item{isJump: true, test: test, val: val, yes: yes, no: no})
}

// jump jumps to l unconditionally.
func (a *asm) jump(l label) {
	a.items = append(a.items, item{isJump: true, always: true, yes: l})
}

// target is the index in items that l names for the jump at index i.
func (a *asm) target(i int, l label) (int, error) {
	if l == next {
		return i + 1, nil
	}
	t := a.labels[l]
	switch {
	case t < 0:
		return 0, fmt.Errorf("instruction %d jumps to label %d, never placed", i, l)
	case t <= i:
		return 0, fmt.Errorf("instruction %d jumps backwards to %d", i, t)
	case t >= len(a.items):
		return 0, fmt.Errorf("instruction %d jumps past the end of the program", i)
	}
	return t, nil
}

// assemble lays the program out and resolves every jump. A conditional jump whose target
// lies beyond its 8-bit reach jumps instead to an unconditional jump (32-bit offset)
// inserted right after it. Inserting one moves later code and can push other jumps out of
// reach, so the layout is repeated until nothing changes; as detours are only ever added,
// that ends.
func (a *asm) assemble() ([]rawInsn, error) {
	type detours struct{ yes, no bool }
	far := make([]detours, len(a.items))
	targets := make([][2]int, len(a.items))
	for i, it := range a.items {
		if !it.isJump {
			continue
		}
		var err error
		if targets[i][0], err = a.target(i, it.yes); err != nil {
			return nil, err
		}
		if it.always {
			continue
		}
		if targets[i][1], err = a.target(i, it.no); err != nil {
			return nil, err
		}
	}

	// pos[i] is where items[i] starts in the output; pos[len(items)] is the length.
	pos := make([]int, len(a.items)+1)
	layout := func() {
		n := 0
		for i := range a.items {
			pos[i] = n
			n++
			if far[i].yes {
				n++
			}
			if far[i].no {
				n++
			}
		}
		pos[len(a.items)] = n
	}
	for {
		layout()
		changed := false
		for i, it := range a.items {
			if !it.isJump || it.always {
				continue
			}
			from := pos[i] + 1
			if !far[i].yes && pos[targets[i][0]]-from > maxCondSkip {
				far[i].yes, changed = true, true
			}
			if !far[i].no && pos[targets[i][1]]-from > maxCondSkip {
				far[i].no, changed = true, true
			}
		}
		if !changed {
			break
		}
	}
	if n := pos[len(a.items)]; n > maxInsns {
		return nil, fmt.Errorf("program has %d instructions, more than the kernel's %d", n, maxInsns)
	}

	out := make([]bpf.Instruction, 0, pos[len(a.items)])
	for i, it := range a.items {
		if !it.isJump {
			out = append(out, it.insn)
			continue
		}
		from := pos[i] + 1
		if it.always {
			out = append(out, bpf.Jump{Skip: uint32(pos[targets[i][0]] - from)})
			continue
		}
		yes, no := pos[targets[i][0]], pos[targets[i][1]]
		// Detours sit right after the jump, the one for yes first.
		var detour []int
		if far[i].yes {
			detour = append(detour, yes)
			yes = from
		}
		if far[i].no {
			detour = append(detour, no)
			no = from + len(detour) - 1
		}
		out = append(out, bpf.JumpIf{Cond: it.test, Val: it.val, SkipTrue: uint8(yes - from), SkipFalse: uint8(no - from)})
		for k, t := range detour {
			out = append(out, bpf.Jump{Skip: uint32(t - (from + k + 1))})
		}
	}
	raw, err := bpf.Assemble(out)
	if err != nil {
		return nil, fmt.Errorf("assemble: %w", err)
	}
	return raw, nil
}
