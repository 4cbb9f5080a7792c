//go:build amd64 || arm64

package seccomp

import (
	"fmt"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// asm adds forward labels to golang.org/x/net/bpf's instructions, whose
// jumps otherwise take raw skip counts.
type asm struct {
	prog   []bpf.Instruction
	refs   []jumpRef
	labels []int // label → instruction index, -1 until placed
}

type label int

// next means "fall through to the following instruction".
const next label = -1

type jumpRef struct {
	at     int
	jt, jf label
}

func (a *asm) newLabel() label {
	a.labels = append(a.labels, -1)
	return label(len(a.labels) - 1)
}

func (a *asm) place(l label) { a.labels[l] = len(a.prog) }

func (a *asm) emit(ins bpf.Instruction) { a.prog = append(a.prog, ins) }

// load puts the 32-bit word at off of struct seccomp_data into A.
func (a *asm) load(off uint32) { a.emit(bpf.LoadAbsolute{Off: off, Size: 4}) }

func (a *asm) ret(v uint32) { a.emit(bpf.RetConstant{Val: v}) }

// jumpIf jumps to jt when A cond val holds, else to jf.
func (a *asm) jumpIf(cond bpf.JumpTest, val uint32, jt, jf label) {
	a.refs = append(a.refs, jumpRef{at: len(a.prog), jt: jt, jf: jf})
	a.emit(bpf.JumpIf{Cond: cond, Val: val})
}

func (a *asm) skip(from int, l label) (uint32, error) {
	if l == next {
		return 0, nil
	}
	to := a.labels[l]
	if to < 0 {
		return 0, fmt.Errorf("BUG: seccomp: label %d never placed", l)
	}
	if to <= from {
		return 0, fmt.Errorf("BUG: seccomp: backward jump from %d to %d", from, to)
	}
	if to >= len(a.prog) {
		return 0, fmt.Errorf("BUG: seccomp: jump from %d past the end", from)
	}
	return uint32(to - from - 1), nil
}

// assemble resolves labels and encodes the program.
func (a *asm) assemble() ([]unix.SockFilter, error) {
	for _, r := range a.refs {
		switch ins := a.prog[r.at].(type) {
		case bpf.JumpIf:
			t, err := a.skip(r.at, r.jt)
			if err != nil {
				return nil, err
			}
			f, err := a.skip(r.at, r.jf)
			if err != nil {
				return nil, err
			}
			if t > 255 || f > 255 {
				return nil, fmt.Errorf("BUG: seccomp: conditional jump at %d too long (%d, %d)", r.at, t, f)
			}
			ins.SkipTrue, ins.SkipFalse = uint8(t), uint8(f)
			a.prog[r.at] = ins
		default:
			return nil, fmt.Errorf("BUG: seccomp: jump reference at %d is a %T", r.at, ins)
		}
	}
	raw, err := bpf.Assemble(a.prog)
	if err != nil {
		return nil, fmt.Errorf("BUG: seccomp: assemble: %w", err)
	}
	out := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		out[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return out, nil
}
