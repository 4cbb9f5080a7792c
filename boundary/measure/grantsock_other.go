//go:build !linux

package measure

import (
	"errors"
	"net"
)

type grantSock struct {
	ln net.Listener
	pc net.PacketConn
}

func bindInGrant(g, name, network string) (*grantSock, error) {
	return nil, errors.New("receivers in grants need Linux")
}

func (gs *grantSock) close() {}
