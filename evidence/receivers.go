package evidence

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Receiver names. The tcp receiver takes HTTP as well as raw bytes: it
// records any connection, whatever it carries.
const (
	RecvTCP      = "tcp"
	RecvUDP      = "udp"
	RecvAbstract = "abstract"
	RecvUnix     = "unix"
	RecvUnixgram = "unixgram"
	RecvRedirect = "redirect"
)

// DirectReceivers are the receivers every case runs, in report order.
var DirectReceivers = []string{RecvTCP, RecvUDP, RecvAbstract, RecvUnix, RecvUnixgram}

const (
	// MaxReceiverRead caps what a receiver reads from one delivery.
	MaxReceiverRead = 64 << 10
	// receiverReadTimeout bounds one stream connection's read.
	receiverReadTimeout = 2 * time.Second
	// controlTimeout bounds the positive delivery control.
	controlTimeout = 10 * time.Second
)

// Receivers are host-side listeners that the sandbox must not reach. Each
// classifies a delivery as the controller's positive control (its payload
// is the secret control nonce) or as a hit.
type Receivers struct {
	nonce []byte
	log   *eventLog

	mu       sync.Mutex
	controls map[string]bool
	closers  []io.Closer

	TCPAddr, UDPAddr, AbstractName string
	UnixPath, UnixgramPath         string
}

// StartReceivers starts the TCP, UDP and abstract receivers, logging to
// eventsPath. The pathname sockets come later, with PlaceUnix.
func StartReceivers(eventsPath string) (*Receivers, error) {
	return StartReceiversAt(eventsPath, "127.0.0.1")
}

// StartReceiversAt is StartReceivers with the TCP and UDP receivers on
// host, an address of this host: for a sandbox whose loopback is its own
// (a kubernetes Pod), the address by which it reaches the host.
func StartReceiversAt(eventsPath, host string) (*Receivers, error) {
	r, err := startTCPReceiverAt(eventsPath, RecvTCP, host)
	if err != nil {
		return nil, err
	}
	uc, err := net.ListenPacket("udp", net.JoinHostPort(host, "0"))
	if err != nil {
		r.Close()
		return nil, err
	}
	r.add(uc)
	r.UDPAddr = uc.LocalAddr().String()
	go r.packetLoop(RecvUDP, uc)
	var rb [8]byte
	rand.Read(rb[:])
	r.AbstractName = "moat-evidence-" + hex.EncodeToString(rb[:])
	al, err := net.Listen("unix", "@"+r.AbstractName)
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("abstract receiver: %w", err)
	}
	r.add(al)
	go r.acceptLoop(RecvAbstract, al)
	return r, nil
}

// PlaceUnix creates the Unix stream and datagram receivers inside dir (the
// sandbox's writable workspace, after Ready), world-writable so that only
// the boundary can stop a connection.
func (r *Receivers) PlaceUnix(dir string) error {
	r.UnixPath = filepath.Join(dir, "recv.sock")
	r.UnixgramPath = filepath.Join(dir, "recv.dgram")
	ul, err := net.Listen("unix", r.UnixPath)
	if err != nil {
		return fmt.Errorf("unix receiver: %w", err)
	}
	r.add(ul)
	go r.acceptLoop(RecvUnix, ul)
	gc, err := net.ListenPacket("unixgram", r.UnixgramPath)
	if err != nil {
		return fmt.Errorf("unixgram receiver: %w", err)
	}
	r.add(gc)
	go r.packetLoop(RecvUnixgram, gc)
	for _, p := range []string{r.UnixPath, r.UnixgramPath} {
		if err := os.Chmod(p, 0o777); err != nil {
			return err
		}
	}
	return nil
}

// StartRedirectTarget starts the separate receiver that a provider
// redirect points at; it must observe nothing.
func StartRedirectTarget(eventsPath string) (*Receivers, error) {
	return startTCPReceiver(eventsPath, RecvRedirect)
}

// startTCPReceiver opens the event log and a TCP receiver of the given
// kind on 127.0.0.1.
func startTCPReceiver(eventsPath, kind string) (*Receivers, error) {
	return startTCPReceiverAt(eventsPath, kind, "127.0.0.1")
}

func startTCPReceiverAt(eventsPath, kind, host string) (*Receivers, error) {
	l, err := openEventLog(eventsPath)
	if err != nil {
		return nil, err
	}
	r := &Receivers{log: l, controls: map[string]bool{}, nonce: newNonce()}
	tl, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		r.Close()
		return nil, err
	}
	r.add(tl)
	r.TCPAddr = tl.Addr().String()
	go r.acceptLoop(kind, tl)
	return r, nil
}

func (r *Receivers) add(c io.Closer) {
	r.mu.Lock()
	r.closers = append(r.closers, c)
	r.mu.Unlock()
}

// Close stops every receiver and closes the log.
func (r *Receivers) Close() error {
	r.mu.Lock()
	cs := r.closers
	r.closers = nil
	r.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
	if r.UnixPath != "" {
		os.Remove(r.UnixPath)
		os.Remove(r.UnixgramPath)
	}
	return r.log.close()
}

func (r *Receivers) record(name string, data []byte) {
	kind := "hit"
	if string(data) == string(r.nonce) {
		kind = "control"
		r.mu.Lock()
		r.controls[name] = true
		r.mu.Unlock()
	}
	sum := sha256.Sum256(data)
	r.log.append(ReceiverEvent{Receiver: name, Kind: kind, Time: time.Now().UTC().Format(time.RFC3339Nano),
		Bytes: len(data), SHA256: hex.EncodeToString(sum[:])})
}

func (r *Receivers) acceptLoop(name string, l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			c.SetReadDeadline(time.Now().Add(receiverReadTimeout))
			data, _ := io.ReadAll(io.LimitReader(c, MaxReceiverRead))
			r.record(name, data)
		}()
	}
}

func (r *Receivers) packetLoop(name string, pc net.PacketConn) {
	buf := make([]byte, MaxReceiverRead)
	for {
		n, _, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		r.record(name, append([]byte(nil), buf[:n]...))
	}
}

// Control delivers the positive control to each named receiver from the
// host and waits until each has recorded it.
func (r *Receivers) Control(names ...string) error {
	for _, n := range names {
		if err := r.send(n); err != nil {
			return fmt.Errorf("positive control to the %s receiver: %w", n, err)
		}
	}
	deadline := time.Now().Add(controlTimeout)
	for {
		missing := ""
		r.mu.Lock()
		for _, n := range names {
			if !r.controls[n] {
				missing = n
				break
			}
		}
		r.mu.Unlock()
		if missing == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("positive control to the %s receiver was not observed", missing)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (r *Receivers) send(name string) error {
	var network, addr string
	switch name {
	case RecvTCP, RecvRedirect:
		network, addr = "tcp", r.TCPAddr
	case RecvUDP:
		network, addr = "udp", r.UDPAddr
	case RecvAbstract:
		network, addr = "unix", "@"+r.AbstractName
	case RecvUnix:
		network, addr = "unix", r.UnixPath
	case RecvUnixgram:
		network, addr = "unixgram", r.UnixgramPath
	default:
		return errors.New("BUG: unknown receiver " + name)
	}
	c, err := net.DialTimeout(network, addr, controlTimeout)
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Write(r.nonce)
	return err
}

// newNonce returns a fresh control payload that nothing inside a sandbox can know.
func newNonce() []byte {
	var b [16]byte
	rand.Read(b[:])
	return []byte("control-" + hex.EncodeToString(b[:]))
}
