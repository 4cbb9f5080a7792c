package seccomp

import "golang.org/x/sys/unix"

var archDeniedEPERM = map[string]uint32{
	"iopl": unix.SYS_IOPL, "ioperm": unix.SYS_IOPERM, "modify_ldt": unix.SYS_MODIFY_LDT, "uselib": unix.SYS_USELIB,
}
