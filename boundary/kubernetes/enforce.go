package kubernetes

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"k8s.io/client-go/tools/remotecommand"

	"github.com/moat-sandbox/moat/internal/reexec"
)

// DialHelper is the hidden helper that Prepare runs in the Pod to learn
// when the NetworkPolicy has taken effect: `moat __moat-k8s-dial
// HOST:PORT` exits 0 when it connects, 1 when it cannot.
const DialHelper = reexec.Prefix + "k8s-dial"

// enforceWait bounds how long Prepare waits for the network plugin to
// confine a new Pod (kube-router programs a Pod's rules when it sees the
// Pod's IP, about a second after the Pod starts).
const enforceWait = 20 * time.Second

// DialMain connects to its one argument, a host:port, within a second.
func DialMain(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "moat: kubernetes dial: usage: HOST:PORT")
		return 125
	}
	c, err := net.DialTimeout("tcp", args[0], time.Second)
	if err != nil {
		return 1
	}
	c.Close()
	return 0
}

// waitConfined waits, at most enforceWait, until the Pod can no longer
// connect to a receiver on the broker's host address, i.e. until the
// network plugin applies the NetworkPolicy to it. It decides nothing: a
// Pod that is still unconfined afterwards is left to the measurement,
// which fails egress_interception and says why.
func (s *sandbox) waitConfined(ctx context.Context) {
	ln, err := net.Listen("tcp", net.JoinHostPort(s.host.String(), "0"))
	if err != nil {
		return
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	deadline := time.Now().Add(enforceWait)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		// The exec API wants at least one stream: stderr, discarded.
		exe, err := s.executor([]string{MoatInImage, DialHelper, ln.Addr().String()}, false, false, true, false)
		if err != nil {
			return
		}
		ectx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = exe.StreamWithContext(ectx, remotecommand.StreamOptions{Stderr: io.Discard})
		cancel()
		if exitCode(err) == 1 {
			return // refused or dropped: the policy is in force
		}
		time.Sleep(250 * time.Millisecond)
	}
}
