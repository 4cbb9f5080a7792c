package receiver

import (
	"net"
	"strconv"
	"testing"
	"time"
)

// A TCP connection and a UDP datagram from this process arrive as Events,
// and the echo answers the datagram.
func TestReceiver(t *testing.T) {
	r, err := Start(Options{EchoUDP: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if len(r.Seen()) != 0 || r.Count() != 0 {
		t.Fatalf("before anything was sent: %v, %d", r.Seen(), r.Count())
	}
	c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(r.TCPPort()))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	u, err := net.Dial("udp", "127.0.0.1:"+strconv.Itoa(r.UDPPort()))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if _, err := u.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	u.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 16)
	if n, err := u.Read(buf); err != nil || string(buf[:n]) != "hi" {
		t.Fatalf("echo: got %q, %v", buf[:n], err)
	}
	got := map[string]Event{}
	for len(got) < 2 {
		select {
		case e := <-r.Events:
			got[e.Net] = e
		case <-time.After(5 * time.Second):
			t.Fatalf("got %v, want a tcp and a udp event", got)
		}
	}
	if e := got["udp"]; string(e.Data) != "hi" || e.From != u.LocalAddr().String() {
		t.Errorf("udp event: got %+v, want %q from %s", e, "hi", u.LocalAddr())
	}
	if e := got["tcp"]; e.From == "" || e.String() != "tcp from "+e.From {
		t.Errorf("tcp event: got %+v (%s)", e, e)
	}
	if r.Count() != 2 {
		t.Errorf("Count: got %d, want 2", r.Count())
	}
	r.Close()
	r.Close() // twice is harmless
	if _, ok := <-r.Events; ok {
		t.Errorf("Events is open after Close")
	}
}

// Without EchoUDP nothing answers.
func TestReceiverNoEcho(t *testing.T) {
	r, err := Start(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	u, err := net.Dial("udp", "127.0.0.1:"+strconv.Itoa(r.UDPPort()))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	u.Write([]byte("x"))
	<-r.Events
	u.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, err := u.Read(make([]byte, 4)); err == nil {
		t.Fatalf("got an answer of %d bytes, want none", n)
	}
}

func TestStartBadAddr(t *testing.T) {
	if _, err := Start(Options{TCPAddr: "127.0.0.1:notaport"}); err == nil {
		t.Fatal("got no error for a bad address")
	}
}

// TCPOnly listens on TCP alone; the same options without it listen on UDP
// too (the control).
func TestReceiverTCPOnly(t *testing.T) {
	r, err := Start(Options{TCPOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", r.TCP.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if e := <-r.Events; e.Net != "tcp" {
		t.Errorf("event %v, want tcp", e)
	}
	if r.UDP != nil || r.UDPPort() != 0 {
		t.Errorf("TCPOnly listens on UDP: %v", r.UDP)
	}
	r.Close()
	both, err := Start(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer both.Close()
	if both.UDP == nil || both.UDPPort() == 0 {
		t.Error("without TCPOnly there is no UDP listener")
	}
}
