package sandbox

import (
	"net"
	"os"
)

// fileListener wraps the backend's listening socket. net.FileListener dups
// the fd, so the original is closed here.
func fileListener(f *os.File) (net.Listener, error) {
	l, err := net.FileListener(f)
	f.Close()
	return l, err
}
