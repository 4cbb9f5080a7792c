package sandbox

import (
	"net"
	"os"
	"sync"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/broker"
)

// fileListener wraps the backend's listening socket. net.FileListener dups
// the fd, so the original is closed here.
func fileListener(f *os.File) (net.Listener, error) {
	l, err := net.FileListener(f)
	f.Close()
	return l, err
}

// workloadKeyFor is the key the workload holds for the broker behind li
// (broker.Config.WorkloadKey, broker.WorkloadEnvAt): "" (the placeholder)
// for a listener on the sandbox's own loopback, which only the sandbox
// reaches; a fresh random key for a listener on a host address
// (li.Host != ""), whose admission by source address a neighbour that can
// forge the sandbox's address would pass. The key stays in memory: it is
// in the workload's environment and the broker's Config, never journaled.
func workloadKeyFor(li boundary.ListenerInfo) string {
	if li.Host == "" {
		return ""
	}
	return broker.NewWorkloadKey()
}

// maxRefusalRecords bounds how many refused connections one listener
// journals: a neighbour that keeps connecting cannot fill the journal;
// later refusals are closed all the same.
const maxRefusalRecords = 64

// admitListener is a listener whose accepted connections are first put
// to the backend's admission (boundary.ListenerInfo.Admit): one on a host
// address (the Kubernetes backend's) admits only the sandbox's own
// address. A refused connection is closed before anything is read from it
// and reported to refused (the session journals it).
type admitListener struct {
	net.Listener
	admit   func(net.Addr) error
	refused func(remote net.Addr, why error)

	mu sync.Mutex
	n  int
}

// withAdmission returns ln itself when admit is nil (a listener only the
// sandbox can reach), else ln behind admit.
func withAdmission(ln net.Listener, admit func(net.Addr) error, refused func(net.Addr, error)) net.Listener {
	if admit == nil {
		return ln
	}
	return &admitListener{Listener: ln, admit: admit, refused: refused}
}

func (l *admitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		why := l.admit(c.RemoteAddr())
		if why == nil {
			return c, nil
		}
		c.Close()
		l.mu.Lock()
		l.n++
		report := l.n <= maxRefusalRecords
		l.mu.Unlock()
		if report && l.refused != nil {
			l.refused(c.RemoteAddr(), why)
		}
	}
}
