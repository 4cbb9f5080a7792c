//go:build !linux

package audit

func helperFault([]string) int { return 3 }
