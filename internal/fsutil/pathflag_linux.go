package fsutil

import "golang.org/x/sys/unix"

// pathOnlyFlag opens a directory only to stat it and open ".." from it:
// O_PATH needs no read permission on it.
const pathOnlyFlag = unix.O_PATH
