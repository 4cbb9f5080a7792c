// Package receiver is the one TCP+UDP receiver of moat's tests and of the
// conformance suite: a listener of each on the host's loopback that a
// sandbox must not reach, reporting every arrival. A test starts one,
// gives its ports to the workload, and then expects no Event (and, as its
// positive control, one from a process outside the sandbox).
//
// The conformance suite's test host runs the same listeners as a process
// of its own in a network namespace it creates (conformance.ReceiverMain,
// the hidden helper __moat-conf-receiver), logging each Event to a file:
// one concept, the process form only because a listener cannot be moved
// into another namespace. The evidence suite's receivers
// (evidence.Receivers) are not this one: they are a product, with abstract
// and pathname sockets, a secret nonce telling the controller's own
// delivery from a hit, and persisted, hashed events.
package receiver

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
)

// Limits.
const (
	// MaxDatagram is the most of a UDP datagram an Event keeps.
	MaxDatagram = 1500
	// eventBuffer is how many Events wait on the channel; arrivals beyond
	// it are still counted (Count) but their Events are dropped.
	eventBuffer = 256
)

// Event is one arrival.
type Event struct {
	Net  string // "tcp" or "udp"
	From string // the peer's address
	Data []byte // a UDP datagram's bytes (nil for TCP)
}

func (e Event) String() string {
	if e.Net == "udp" {
		return fmt.Sprintf("udp from %s %q", e.From, e.Data)
	}
	return e.Net + " from " + e.From
}

// Options configure a Receiver.
type Options struct {
	// TCPAddr and UDPAddr are where to listen ("" is 127.0.0.1:0).
	TCPAddr, UDPAddr string
	// EchoUDP sends each datagram back to its sender, so that a sender
	// that waits for an answer gets one.
	EchoUDP bool
	// TCPOnly listens on TCP alone (UDP is nil, UDPAddr unused).
	TCPOnly bool
}

// Receiver listens on TCP and UDP until Close.
type Receiver struct {
	TCP net.Listener
	UDP net.PacketConn // nil with Options.TCPOnly
	// Events has each arrival, in order, until Close.
	Events <-chan Event

	events chan Event
	n      atomic.Int64
	wg     sync.WaitGroup
	once   sync.Once
}

// Start listens on both and serves until Close: a TCP connection is
// accepted, reported and closed; a UDP datagram is reported (and echoed
// with EchoUDP).
func Start(o Options) (*Receiver, error) {
	if o.TCPAddr == "" {
		o.TCPAddr = "127.0.0.1:0"
	}
	if o.UDPAddr == "" {
		o.UDPAddr = "127.0.0.1:0"
	}
	tl, err := net.Listen("tcp", o.TCPAddr)
	if err != nil {
		return nil, fmt.Errorf("receiver: %w", err)
	}
	r := &Receiver{TCP: tl, events: make(chan Event, eventBuffer)}
	r.Events = r.events
	if !o.TCPOnly {
		ul, err := net.ListenPacket("udp", o.UDPAddr)
		if err != nil {
			tl.Close()
			return nil, fmt.Errorf("receiver: %w", err)
		}
		r.UDP = ul
		r.wg.Add(1)
		go r.serveUDP(o.EchoUDP)
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			r.report(Event{Net: "tcp", From: c.RemoteAddr().String()})
			c.Close()
		}
	}()
	return r, nil
}

func (r *Receiver) serveUDP(echo bool) {
	defer r.wg.Done()
	buf := make([]byte, MaxDatagram)
	for {
		n, from, err := r.UDP.ReadFrom(buf)
		if err != nil {
			return
		}
		r.report(Event{Net: "udp", From: from.String(), Data: append([]byte(nil), buf[:n]...)})
		if echo {
			r.UDP.WriteTo(buf[:n], from)
		}
	}
}

func (r *Receiver) report(e Event) {
	r.n.Add(1)
	select {
	case r.events <- e:
	default:
	}
}

// TCPPort and UDPPort are the ports listened on (UDPPort is 0 with
// Options.TCPOnly).
func (r *Receiver) TCPPort() int { return r.TCP.Addr().(*net.TCPAddr).Port }
func (r *Receiver) UDPPort() int {
	if r.UDP == nil {
		return 0 // TCPOnly
	}
	return r.UDP.LocalAddr().(*net.UDPAddr).Port
}

// Count is the number of arrivals so far, dropped Events included.
func (r *Receiver) Count() int { return int(r.n.Load()) }

// Seen returns the Events waiting now, without blocking.
func (r *Receiver) Seen() []Event {
	var out []Event
	for {
		select {
		case e, ok := <-r.events:
			if !ok {
				return out
			}
			out = append(out, e)
		default:
			return out
		}
	}
}

// Close stops both listeners and waits for their goroutines; Events is
// closed after the last arrival.
func (r *Receiver) Close() {
	r.TCP.Close()
	if r.UDP != nil {
		r.UDP.Close()
	}
	r.wg.Wait()
	r.once.Do(func() { close(r.events) })
}
