package conformance

import (
	"fmt"
	"os"
	"strings"

	"github.com/moat-sandbox/moat/internal/probekit"
	"github.com/moat-sandbox/moat/internal/receiver"
)

// ProbeMain is the suite's in-sandbox probe: each argument is one action
// of internal/probekit ("kind=arg"), and it prints one line each, "kind=arg
// ok [detail]" or "kind=arg err <reason>". It claims nothing else; the
// scenarios judge its lines with what the host observed.
func ProbeMain(actions []string) int { return probekit.Main(os.Stdout, nil, actions) }

// ReceiverMain: `__moat-conf-receiver LOG tcp:ADDR… udp:ADDR…` runs
// internal/receiver's listeners, answering each UDP datagram (so that a
// reachable resolver would be seen to answer), in the test host's network
// namespace, a process of its own because it must live in that namespace;
// it appends one line per arrival to LOG and prints "ready" once every
// listener is up. A udp:ADDR pairs with the tcp:ADDR before it; a tcp:ADDR
// with none listens on TCP alone.
func ReceiverMain(args []string) int {
	if len(args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: "+ReceiverHelper+" LOG tcp:ADDR… udp:ADDR…")
		return 125
	}
	var opts []receiver.Options
	for _, a := range args[1:] {
		proto, addr, _ := strings.Cut(a, ":")
		switch {
		case proto == "tcp":
			opts = append(opts, receiver.Options{TCPAddr: addr, TCPOnly: true, EchoUDP: true})
		case proto == "udp" && len(opts) > 0 && opts[len(opts)-1].TCPOnly:
			opts[len(opts)-1].TCPOnly, opts[len(opts)-1].UDPAddr = false, addr
		default:
			fmt.Fprintf(os.Stderr, "%s: %q is not tcp:ADDR, or udp:ADDR after a tcp:ADDR of its own\n", ReceiverHelper, a)
			return 125
		}
	}
	logf, err := os.OpenFile(args[0], os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 125
	}
	events := make(chan string)
	for _, o := range opts {
		r, err := receiver.Start(o)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 125
		}
		go func() {
			for e := range r.Events {
				at := r.TCP.Addr()
				if e.Net == "udp" {
					at = r.UDP.LocalAddr()
				}
				events <- fmt.Sprintf("%s %s from %s (%d bytes)", e.Net, at, e.From, len(e.Data))
			}
		}()
	}
	fmt.Println("ready")
	for l := range events {
		fmt.Fprintln(logf, l)
	}
	return 0
}
