package measure

import (
	"net"
	"strings"
	"testing"
)

// A UDP socket whose source port is its target's (loopback, the kernel's
// pick) is connected to itself and reads its own query back: the DNS probe
// took that for an answer, a violation that succeeded. Forced here by a
// dial that returns such a socket first: the probe must dial again and
// see that nothing listens. Control: a real answer at another port is
// still reported as one.
func TestProbeDNSSelfConnectedSocket(t *testing.T) {
	free, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	target := free.LocalAddr().(*net.UDPAddr)
	free.Close() // nothing listens at target now

	self := 0
	orig := dialUDP
	t.Cleanup(func() { dialUDP = orig })
	dialUDP = func(addr string) (net.Conn, error) {
		if self == 0 {
			self++
			return net.DialUDP("udp", target, target) // connected to itself
		}
		return orig(addr)
	}
	out, detail := probeDNS(target.String())
	if self != 1 {
		t.Fatalf("the self-connected dial was not used (%d)", self)
	}
	if out == OutcomeSucceeded {
		t.Fatalf("probe of %s, where nothing listens, through a self-connected socket first: %s (%s), want it failed", target, out, detail)
	}

	// Control: a responder that answers every datagram is an answer.
	resp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Close()
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := resp.ReadFromUDP(buf)
			if err != nil {
				return
			}
			resp.WriteToUDP(buf[:n], from)
		}
	}()
	dialUDP = orig
	out, detail = probeDNS(resp.LocalAddr().String())
	if out != OutcomeSucceeded || !strings.Contains(detail, "answer") {
		t.Fatalf("control: probe of a responder: %s (%s), want an answer", out, detail)
	}
}
