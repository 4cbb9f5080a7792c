package seccomp

var archDeniedEPERM = map[string]uint32{}
