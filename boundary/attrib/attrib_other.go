//go:build !linux

package attrib

import (
	"net"

	"github.com/moat-sandbox/moat/boundary"
)

// New returns an Attributor that always reports attribution unavailable:
// socket-to-process lookup needs Linux procfs.
func New(netnsPID int) boundary.Attributor { return other{} }

type other struct{}

func (other) Attribute(net.Conn) boundary.Attribution {
	return unavailable("attribution needs Linux /proc (socket inode lookup); not available on this platform")
}
