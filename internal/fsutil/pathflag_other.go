//go:build !linux

package fsutil

import "golang.org/x/sys/unix"

// pathOnlyFlag: without O_PATH, directories are opened for reading.
const pathOnlyFlag = unix.O_RDONLY
