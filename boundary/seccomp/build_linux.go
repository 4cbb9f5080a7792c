//go:build amd64 || arm64

package seccomp

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Offsets into struct seccomp_data (include/uapi/linux/seccomp.h):
// int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6].
const (
	offNr   = 0
	offArch = 4
	offArgs = 16
)

// MaxInstructions is the kernel's BPF_MAXINSNS: the longest program it
// accepts.
const MaxInstructions = 4096

// argLow and argHigh are the offsets of the low and high 32-bit halves of
// argument i, which depend on the byte order.
func argLow(i int) uint32 {
	if bigEndian {
		return uint32(offArgs+8*i) + 4
	}
	return uint32(offArgs + 8*i)
}

func argHigh(i int) uint32 {
	if bigEndian {
		return uint32(offArgs + 8*i)
	}
	return uint32(offArgs+8*i) + 4
}

var bigEndian = func() bool {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], 1)
	return b[0] == 0
}()

func (o outcome) ret() uint32 {
	switch o.action {
	case ActionAllow:
		return unix.SECCOMP_RET_ALLOW
	case ActionErrno:
		return unix.SECCOMP_RET_ERRNO | (uint32(o.errno) & unix.SECCOMP_RET_DATA)
	}
	return unix.SECCOMP_RET_KILL_PROCESS
}

// Build compiles the filter for opts. The program is the same for the same
// opts; it is at most MaxInstructions long.
func Build(opts Options) ([]unix.SockFilter, error) {
	var a asm
	kill := outcome{action: ActionKillProcess}.ret()
	a.load(offArch)
	native := a.newLabel()
	a.jumpIf(bpf.JumpEqual, auditArch, native, next)
	a.ret(kill)
	a.place(native)
	a.load(offNr)
	if killX32 {
		notX32 := a.newLabel()
		a.jumpIf(bpf.JumpBitsSet, x32SyscallBit, next, notX32)
		a.ret(kill)
		a.place(notX32)
	}
	// From here on A holds nr whenever a rule's first test runs: every
	// rule's body ends in a return, and the next rule is reached only by
	// the false branch of the nr test.
	for _, r := range syscallRules(opts) {
		if err := a.rule(r); err != nil {
			return nil, err
		}
	}
	a.ret(unix.SECCOMP_RET_ALLOW)
	prog, err := a.assemble()
	if err != nil {
		return nil, err
	}
	if len(prog) > MaxInstructions {
		return nil, fmt.Errorf("BUG: seccomp: program has %d instructions, the kernel takes at most %d", len(prog), MaxInstructions)
	}
	return prog, nil
}

// rule emits: if nr == r.nr { branches…; return default }.
func (a *asm) rule(r sysRule) error {
	other := a.newLabel()
	a.jumpIf(bpf.JumpEqual, r.nr, next, other)
	for _, b := range r.branches {
		fail := a.newLabel()
		for _, t := range b.tests {
			if err := a.test(t, fail); err != nil {
				return fmt.Errorf("%s: %w", r.name, err)
			}
		}
		a.ret(b.out.ret())
		a.place(fail)
	}
	a.ret(r.def.ret())
	a.place(other)
	return nil
}

// test emits code that falls through when t holds and jumps to fail when
// it does not. It clobbers A.
func (a *asm) test(t argTest, fail label) error {
	if t.arg < 0 || t.arg > 5 {
		return fmt.Errorf("BUG: seccomp: argument index %d", t.arg)
	}
	switch t.kind {
	case testIn64:
		a.load(argHigh(t.arg))
		a.jumpIf(bpf.JumpEqual, 0, next, fail)
		a.load(argLow(t.arg))
		return a.in(t.vals, fail)
	case testLowIn:
		a.load(argLow(t.arg))
		return a.in(t.vals, fail)
	case testLowMaskedIn:
		a.load(argLow(t.arg))
		a.emit(bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: t.mask})
		return a.in(t.vals, fail)
	case testLowAnyBit:
		if t.mask == 0 {
			return fmt.Errorf("BUG: seccomp: empty bit mask")
		}
		a.load(argLow(t.arg))
		a.jumpIf(bpf.JumpBitsSet, t.mask, next, fail)
		return nil
	}
	return fmt.Errorf("BUG: seccomp: argument test kind %d", t.kind)
}

// in falls through when A is one of vals, else jumps to fail.
func (a *asm) in(vals []uint32, fail label) error {
	if len(vals) == 0 {
		return fmt.Errorf("BUG: seccomp: empty value set")
	}
	pass := a.newLabel()
	for i, v := range vals {
		if i == len(vals)-1 {
			a.jumpIf(bpf.JumpEqual, v, pass, fail)
		} else {
			a.jumpIf(bpf.JumpEqual, v, pass, next)
		}
	}
	a.place(pass)
	return nil
}
