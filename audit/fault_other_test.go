//go:build !linux

package audit

func helperFault() int { return 3 }
