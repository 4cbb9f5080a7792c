package measure

import (
	"fmt"
	"net"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/moat-sandbox/moat/internal/reaper"
)

// maxUnixPath is the longest pathname a Unix socket address holds (sun_path
// less its NUL).
const maxUnixPath = 107

// receivers are host-side listeners that Confirm opens for the duration of
// a measurement, outside the sandbox, for the helper to try to reach: TCP
// and UDP on the host's 127.0.0.1, an abstract Unix socket in the host's
// network namespace, and a pathname Unix socket in each read-write grant
// (below Landlock ABI 9 nothing but a seccomp filter or the mount
// namespace keeps a process from connecting to one). Every one of them
// must observe nothing.
type receivers struct {
	tcp     net.Listener
	hostTCP net.Listener // on Config.BrokerHost (a Pod's sandbox)
	udp     []net.PacketConn
	unix    []net.Listener // abstract
	socks   []*grantSock   // in the read-write grants
	paths   []string       // their paths, for the reaper
	reaper  *reaper.Reaper
	notes   []string // receivers that could not be set up, and why

	mu       sync.Mutex
	observed []string
	wg       sync.WaitGroup

	stopOnce sync.Once
	result   Check
}

func (r *receivers) saw(what string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.observed) < maxMeasureConns {
		r.observed = append(r.observed, what)
	}
}

// startReceivers opens the receivers and adds them to cfg's targets.
func startReceivers(cfg *Config, nonce string) *receivers {
	r := &receivers{reaper: cfg.Reaper}
	if ln, err := net.Listen("tcp4", "127.0.0.1:0"); err == nil {
		r.tcp = ln
		cfg.ExtraTCPPorts = append(cfg.ExtraTCPPorts[:len(cfg.ExtraTCPPorts):len(cfg.ExtraTCPPorts)], ln.Addr().(*net.TCPAddr).Port)
		r.acceptAll(ln, "tcp")
	} else {
		r.notes = append(r.notes, "no host TCP receiver: "+err.Error())
	}
	if pc, err := net.ListenPacket("udp4", "127.0.0.1:0"); err == nil {
		r.udp = append(r.udp, pc)
		cfg.ExtraUDPPorts = append(cfg.ExtraUDPPorts[:len(cfg.ExtraUDPPorts):len(cfg.ExtraUDPPorts)], pc.LocalAddr().(*net.UDPAddr).Port)
		r.echoAll(pc)
	} else {
		r.notes = append(r.notes, "no host UDP receiver: "+err.Error())
	}
	// A sandbox with a network of its own (a Pod) must not reach the
	// broker's host at any other port: a TCP and a UDP receiver there.
	if host, ok := cfg.podNetwork(); ok {
		hp := joinHostPort(host.String(), 0)
		if ln, err := net.Listen("tcp", hp); err == nil {
			r.hostTCP = ln
			cfg.hostTCPPorts = append(cfg.hostTCPPorts, ln.Addr().(*net.TCPAddr).Port)
			r.acceptAll(ln, "tcp "+host.String())
		} else {
			r.notes = append(r.notes, "no TCP receiver on the broker's host: "+err.Error())
		}
		if pc, err := net.ListenPacket("udp", hp); err == nil {
			r.udp = append(r.udp, pc)
			cfg.hostUDPPorts = append(cfg.hostUDPPorts, pc.LocalAddr().(*net.UDPAddr).Port)
			r.echoAll(pc)
		} else {
			r.notes = append(r.notes, "no UDP receiver on the broker's host: "+err.Error())
		}
	}
	if runtime.GOOS == "linux" {
		s := "@moat-measure-" + nonce
		if ln, err := net.Listen("unix", s); err == nil {
			r.unix = append(r.unix, ln)
			cfg.ExtraUnixSockets = append(cfg.ExtraUnixSockets[:len(cfg.ExtraUnixSockets):len(cfg.ExtraUnixSockets)], s)
			r.acceptAll(ln, "unix "+s)
		} else {
			r.notes = append(r.notes, fmt.Sprintf("no Unix receiver at %s: %v", s, err))
		}
	}
	// A stream and a datagram socket in each read-write grant: a host
	// process that drops one there must not hear from the sandbox (below
	// Landlock ABI 9 nothing but the seccomp filter stops a connect, and a
	// datagram socket from socketpair(2) can sendto without socket(2)).
	tag := ".moat-measure-" + nonce[:min(len(nonce), 16)]
	for _, g := range cfg.ReadWrite {
		for _, network := range []string{"unix", "unixgram"} {
			name := tag + ".sock"
			if network == "unixgram" {
				name = tag + ".dgram"
			}
			s := filepath.Join(g, name)
			if len(s) > maxUnixPath {
				r.notes = append(r.notes, fmt.Sprintf("no receiver at %s: path longer than %d bytes", s, maxUnixPath))
				continue
			}
			cfg.Reaper.OwnFile(s) // before it exists: no kill leaves it
			gs, err := bindInGrant(g, name, network)
			if err != nil {
				cfg.Reaper.Done(s)
				r.notes = append(r.notes, fmt.Sprintf("no receiver at %s: %v", s, err))
				continue
			}
			r.socks = append(r.socks, gs)
			r.paths = append(r.paths, s)
			if network == "unix" {
				cfg.ExtraUnixSockets = append(cfg.ExtraUnixSockets[:len(cfg.ExtraUnixSockets):len(cfg.ExtraUnixSockets)], s)
				r.acceptAll(gs.ln, "unix "+s)
				continue
			}
			cfg.ExtraUnixDgram = append(cfg.ExtraUnixDgram[:len(cfg.ExtraUnixDgram):len(cfg.ExtraUnixDgram)], s)
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				buf := make([]byte, 1500)
				for {
					n, _, err := gs.pc.ReadFrom(buf)
					if err != nil {
						return
					}
					r.saw(fmt.Sprintf("unix datagram of %d bytes at %s", n, s))
				}
			}()
		}
	}
	return r
}

// echoAll records and answers every datagram, so that the helper knows
// it got through.
func (r *receivers) echoAll(pc net.PacketConn) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			r.saw(fmt.Sprintf("udp datagram of %d bytes from %s", n, from))
			pc.WriteTo(buf[:n], from)
		}
	}()
}

func (r *receivers) acceptAll(ln net.Listener, what string) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.saw(what + " connection")
			c.Close()
		}
	}()
}

// stop closes every receiver and returns the host-side check. It is
// idempotent.
func (r *receivers) stop() Check {
	r.stopOnce.Do(func() { r.result = r.close() })
	return r.result
}

func (r *receivers) close() Check {
	if r.tcp != nil {
		r.tcp.Close()
	}
	if r.hostTCP != nil {
		r.hostTCP.Close()
	}
	for _, pc := range r.udp {
		pc.Close()
	}
	for _, ln := range r.unix {
		ln.Close()
	}
	for _, gs := range r.socks {
		gs.close()
	}
	r.wg.Wait()
	for _, p := range r.paths {
		r.reaper.Done(p)
	}
	c := Check{Property: PropEgress, Name: checkReceivers, Kind: KindViolation, Outcome: OutcomeFailed}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.observed) > 0 {
		c.Outcome = OutcomeSucceeded
		c.Detail = "host receivers observed: " + strings.Join(r.observed, "; ")
	} else {
		c.Detail = "host receivers (TCP, UDP, Unix) observed nothing"
	}
	if len(r.notes) > 0 {
		c.Detail += " (" + strings.Join(r.notes, "; ") + ")"
	}
	c.OK = judge(c.Kind, c.Outcome)
	c.Detail = truncate(c.Detail)
	return c
}
