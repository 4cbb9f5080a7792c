package seccomp

var archDeniedEPERM = map[string]uint32{}

var (
	archModeArg  = map[uint32]int{}
	archMknodArg = map[uint32]int{}
)

// archTableCases: arm64 has only the *at forms, which tableCases covers.
func archTableCases() []vmCase { return nil }
