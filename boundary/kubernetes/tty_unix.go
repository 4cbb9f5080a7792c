//go:build unix

package kubernetes

import (
	"os"
	"sync"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/tools/remotecommand"
)

// makeRaw puts the terminal that moat gives the workload (the slave of
// moat's relay) in raw mode: the Pod's own terminal does the line
// discipline, so this one must pass every byte unchanged.
func makeRaw(f *os.File) error {
	t, err := unix.IoctlGetTermios(int(f.Fd()), ioctlGetTermios)
	if err != nil {
		return err
	}
	t.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	t.Oflag &^= unix.OPOST
	t.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	t.Cflag &^= unix.CSIZE | unix.PARENB
	t.Cflag |= unix.CS8
	t.Cc[unix.VMIN], t.Cc[unix.VTIME] = 1, 0
	return unix.IoctlSetTermios(int(f.Fd()), ioctlSetTermios, t)
}

// sizeQueue gives the exec the terminal's size once, then waits for the
// end of the stream.
type sizeQueue struct {
	first *remotecommand.TerminalSize
	done  chan struct{}
	once  sync.Once
}

func newSizeQueue(f *os.File) *sizeQueue {
	q := &sizeQueue{done: make(chan struct{})}
	if ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ); err == nil && ws.Col > 0 {
		q.first = &remotecommand.TerminalSize{Width: ws.Col, Height: ws.Row}
	}
	return q
}

func (q *sizeQueue) Next() *remotecommand.TerminalSize {
	if s := q.first; s != nil {
		q.first = nil
		return s
	}
	<-q.done
	return nil
}

func (q *sizeQueue) stop() { q.once.Do(func() { close(q.done) }) }
