package initkit

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/boundary"
)

// Stdio is a process's standard input, output and error: the three
// descriptors it gets, and the copies that pump readers and writers which
// are not files.
type Stdio struct {
	// Child are the process's fds 0, 1 and 2, each a file of its own (a
	// dup where the caller gave a file): pass them, then CloseChild.
	Child [3]*os.File

	parent []*os.File // our ends of the output pipes
	copies sync.WaitGroup
}

// OpenStdio makes the process's stdio from p. With p.TTY all three are
// the terminal. A nil reader or writer is /dev/null; an *os.File is passed
// as it is; anything else is copied through a pipe, by one goroutine per
// pipe. One writer given as both Stdout and Stderr gets one pipe (as
// exec.Cmd does), so it is never written from two goroutines at once and
// sees the output in the order the process wrote it.
func OpenStdio(p boundary.Process) (*Stdio, error) {
	s := &Stdio{}
	fail := func(err error) (*Stdio, error) {
		CloseFiles(s.Child[:])
		CloseFiles(s.parent)
		return nil, err
	}
	if p.TTY != nil {
		for i := range s.Child {
			f, err := Dup(p.TTY)
			if err != nil {
				return fail(err)
			}
			s.Child[i] = f
		}
		return s, nil
	}
	switch r := p.Stdin.(type) {
	case nil:
		f, err := os.Open(os.DevNull)
		if err != nil {
			return fail(err)
		}
		s.Child[0] = f
	case *os.File:
		f, err := Dup(r)
		if err != nil {
			return fail(err)
		}
		s.Child[0] = f
	default:
		pr, pw, err := os.Pipe()
		if err != nil {
			return fail(err)
		}
		s.Child[0] = pr
		go func() { io.Copy(pw, r); pw.Close() }()
	}
	for i, w := range []io.Writer{p.Stdout, p.Stderr} {
		if i == 1 && w != nil && sameWriter(p.Stdout, w) {
			f, err := Dup(s.Child[1])
			if err != nil {
				return fail(err)
			}
			s.Child[2] = f
			continue
		}
		switch w := w.(type) {
		case nil:
			f, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
			if err != nil {
				return fail(err)
			}
			s.Child[1+i] = f
		case *os.File:
			f, err := Dup(w)
			if err != nil {
				return fail(err)
			}
			s.Child[1+i] = f
		default:
			rd, wr, err := os.Pipe()
			if err != nil {
				return fail(err)
			}
			s.Child[1+i] = wr
			s.parent = append(s.parent, rd)
			s.copies.Add(1)
			go func() { defer s.copies.Done(); io.Copy(w, rd) }()
		}
	}
	return s, nil
}

// FDs are the numbers of Child, to attach to a control message.
func (s *Stdio) FDs() []int {
	return []int{int(s.Child[0].Fd()), int(s.Child[1].Fd()), int(s.Child[2].Fd())}
}

// CloseChild closes the process's ends, once they were passed on.
func (s *Stdio) CloseChild() { CloseFiles(s.Child[:]) }

// Wait waits for the output copies to end (every writer of the pipes
// gone), for at most limit when limit > 0 (a descendant may hold a pipe
// long after the process exited), then closes our ends of the pipes.
func (s *Stdio) Wait(limit time.Duration) {
	done := make(chan struct{})
	go func() { s.copies.Wait(); close(done) }()
	if limit > 0 {
		select {
		case <-done:
		case <-time.After(limit):
		}
	} else {
		<-done
	}
	s.Close()
}

// Close closes our ends of the output pipes: their copies end. Idempotent.
func (s *Stdio) Close() { CloseFiles(s.parent) }

// sameWriter reports whether a and b are the same comparable writer.
func sameWriter(a, b io.Writer) (same bool) {
	defer func() {
		if recover() != nil {
			same = false
		}
	}()
	return a == b
}

// Dup returns a close-on-exec duplicate of f.
func Dup(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup %s: %w", f.Name(), err)
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}
