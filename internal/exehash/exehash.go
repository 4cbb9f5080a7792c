// Package exehash hashes executables (sha256) for the journal and for
// request attribution, hashing each version of a file once per process.
//
// One moat run hashes its own binary three times over: for run.started,
// for the measurement's attribution control, and when the attributor names
// the measurement helper's executable, which is the same file. Each is
// about 10 ms for a 16 MB binary, a third of a cold start. Sum hashes a
// version once and answers the later questions from memory, under a rule
// that a workload cannot get around:
//
//   - the key is the file's identity and version as the kernel reports it
//     (device, inode, size, mtime and ctime). ctime is set by the kernel
//     to the current time on every change of the contents or metadata and
//     cannot be set by any process (only by changing the host's clock), so
//     a file that was written since its hash has another key;
//   - a version is remembered only when its ctime was at least Settle
//     before the hash began, and the file still has the same key once it
//     is hashed. A change during or after the hash then gets a ctime later
//     than the remembered one even on file systems whose timestamps are
//     coarse (a clock tick), so the key cannot match again.
//
// Every lookup still opens and fstats the file in question: nothing is
// answered for a path or a pid, only for the version of the file that is
// open now. A caller that asks for a settled version while another is
// hashing it waits for that hash instead of reading the file again.
//
// FileShared (shared.go) also shares a settled version's hash between
// processes, for moat's own binary, through the kernel keyring: read
// shared.go for why a workload cannot plant an answer there.
package exehash

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Settle is how long before a hash a version must have last changed to
// be remembered. A file changed more recently is hashed every time.
const Settle = 2 * time.Second

// maxEntries bounds the cache; it is cleared when full.
const maxEntries = 256

// Key identifies one version of a file: device, inode, size, mtime and
// ctime (nanoseconds).
type Key struct {
	Dev, Ino     uint64
	Size         int64
	Mtime, Ctime int64
}

var (
	mu    sync.Mutex
	cache = map[Key]string{}
	// now is the clock that Settle is measured against (tests move it).
	now = time.Now
	// inflight are the settled versions being hashed now.
	inflight = map[Key]*call{}
	// hashes counts the files read and hashed, waiting the callers that
	// wait for another's hash; testHashing runs before each read (tests).
	hashes, waiting int
	testHashing     func()
)

// call is one hash in progress; done is closed when sum and err are set.
type call struct {
	done chan struct{}
	sum  string
	err  error
}

// ErrChanged is returned when the file changed while it was hashed.
var ErrChanged = errors.New("the file changed while it was hashed")

// Sum returns the hex sha256 of the regular file f (open for reading, at
// offset 0), at most max bytes long. A file larger than max is refused.
func Sum(f *os.File, max int64) (string, error) {
	key, regular, err := stat(f)
	if err != nil {
		return "", err
	}
	if !regular {
		return "", errors.New("not a regular file")
	}
	if key.Size > max {
		return "", fmt.Errorf("the file is %d bytes, more than the %d this hashes", key.Size, max)
	}
	began := now()
	settled := key.Ino != 0 && time.Unix(0, key.Ctime).Add(Settle).Before(began)
	mu.Lock()
	sum, ok := cache[key]
	if key.Ino != 0 && ok {
		mu.Unlock()
		return sum, nil
	}
	if c := inflight[key]; c != nil && settled {
		waiting++
		mu.Unlock()
		<-c.done
		return c.sum, c.err
	}
	var c *call
	if settled {
		c = &call{done: make(chan struct{})}
		inflight[key] = c
	}
	hashes++
	hook := testHashing
	mu.Unlock()
	if hook != nil {
		hook()
	}
	sum, err = hashOpen(f, key, max)
	mu.Lock()
	if c != nil {
		c.sum, c.err = sum, err
		delete(inflight, key)
		close(c.done)
	}
	if err == nil && settled {
		if len(cache) >= maxEntries {
			clear(cache)
		}
		cache[key] = sum
	}
	mu.Unlock()
	return sum, err
}

// hashOpen hashes f, whose version is key, and checks that it is still
// that version afterwards.
func hashOpen(f *os.File, key Key, max int64) (string, error) {
	h := sha256.New()
	n, err := io.Copy(h, io.LimitReader(f, max+1))
	if err != nil {
		return "", fmt.Errorf("reading: %w", err)
	}
	after, _, err := stat(f)
	if err != nil {
		return "", err
	}
	if n != key.Size || after != key {
		return "", fmt.Errorf("%w (%d bytes read, %d expected)", ErrChanged, n, key.Size)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// File opens path and returns Sum of it.
func File(path string, max int64) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	return Sum(f, max)
}
