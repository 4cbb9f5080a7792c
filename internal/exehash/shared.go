package exehash

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// A version's hash shared between processes.
//
// Every moat process that records its own binary's sha256 (moat run for
// run.started, each sandbox's supervisor) used to hash the whole binary
// again: 33 MB is about 26 ms of one core on a slow machine, on the cold
// start's path. FileShared remembers the hash of a settled version in the
// kernel's keyring of the calling user (keyrings(7), @u), under the same
// key and settle rule as the in-process cache, and answers from it in
// later processes. Two walls keep a workload from planting an entry:
//
//   - moat's seccomp filter refuses add_key, keyctl and request_key in
//     every sandbox, and a native sandbox's processes live in user
//     namespaces of their own, each of which has its own user keyring
//     (Linux 5.3 and later): neither can reach the keyring moat reads;
//   - each entry carries an HMAC-SHA256 of its description and digest
//     under a secret kept in a file of moat's state directory (mode 0600,
//     in a directory of the caller's only, checked at every open). A
//     process that can write the keyring (the same user, in the host's
//     user namespace, outside moat's filter: e.g. an unconfined container
//     running as the same uid without a user namespace) cannot also read
//     that file unless it can read the user's files, and a workload that
//     may read it (a grant over the state directory) cannot write the
//     keyring.
//
// An entry that is missing, malformed or fails its HMAC is ignored and
// the file is hashed, as before; so is everything when the keyring or
// the secret is unavailable (a container whose seccomp profile refuses
// keyctl, a quota reached). The cache only ever saves work: a version is
// still identified by what the workload cannot set (the kernel's ctime),
// and the answer is still the sha256 of the bytes of that version.

// sharedTimeout is how long an entry lives in the keyring.
const sharedTimeout = 7 * 24 * time.Hour

// sharedPrefix starts every entry's description.
const sharedPrefix = "moat-exehash:v1:"

// secretName is the secret's file in the state directory.
const secretName = "exehash.key"

// keyring is the kernel keyring store; nil where there is none (not
// Linux). Tests replace it.
var keyring sharedStore = newKeyring()

// sharedStore reads and writes entries by description.
type sharedStore interface {
	get(desc string) ([]byte, error)
	put(desc string, payload []byte) error
}

var (
	secretMu sync.Mutex
	secrets  = map[string][]byte{} // state directory -> secret, once read
	// sharedHits counts the answers FileShared took from the keyring.
	sharedHits int
)

// FileShared is File for an executable whose hash other moat processes
// will ask for too (moat's own binary): a settled version's hash is also
// remembered in the kernel keyring, with an HMAC under a secret kept in
// stateDir, and taken from there when it verifies. stateDir is created
// (0700) when missing. Any failure of the shared cache falls back to
// hashing the file; only the file's own errors are returned.
func FileShared(path string, max int64, stateDir string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	key, regular, err := stat(f)
	if err != nil {
		return "", err
	}
	if !regular || key.Ino == 0 || key.Size > max || keyring == nil ||
		!time.Unix(0, key.Ctime).Add(Settle).Before(now()) {
		return Sum(f, max)
	}
	mu.Lock()
	sum, ok := cache[key]
	mu.Unlock()
	if ok {
		return sum, nil
	}
	secret, serr := loadSecret(stateDir)
	desc := sharedDesc(key)
	if serr == nil {
		if p, err := keyring.get(desc); err == nil {
			if digest, ok := openEntry(secret, desc, p); ok {
				sum := hex.EncodeToString(digest)
				mu.Lock()
				if len(cache) >= maxEntries {
					clear(cache)
				}
				cache[key] = sum
				sharedHits++
				mu.Unlock()
				return sum, nil
			}
		}
	}
	sum, err = Sum(f, max)
	if err != nil || serr != nil {
		return sum, err
	}
	// Sum remembered it only if the version was settled when it began and
	// unchanged when it ended; share exactly what it remembered.
	mu.Lock()
	remembered := cache[key] == sum
	mu.Unlock()
	if remembered {
		if digest, derr := hex.DecodeString(sum); derr == nil {
			keyring.put(desc, sealEntry(secret, desc, digest))
		}
	}
	return sum, nil
}

// sharedDesc is the keyring description of a version: its whole key.
func sharedDesc(k Key) string {
	return fmt.Sprintf("%s%x:%x:%x:%x:%x", sharedPrefix, k.Dev, k.Ino, k.Size, k.Mtime, k.Ctime)
}

// sealEntry is digest followed by its HMAC over desc and digest.
func sealEntry(secret []byte, desc string, digest []byte) []byte {
	return append(append([]byte(nil), digest...), entryMAC(secret, desc, digest)...)
}

// openEntry returns the digest of an entry whose HMAC verifies.
func openEntry(secret []byte, desc string, p []byte) ([]byte, bool) {
	if len(p) != 2*sha256.Size {
		return nil, false
	}
	digest, mac := p[:sha256.Size], p[sha256.Size:]
	return digest, hmac.Equal(mac, entryMAC(secret, desc, digest))
}

func entryMAC(secret []byte, desc string, digest []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(desc))
	m.Write([]byte{0})
	m.Write(digest)
	return m.Sum(nil)
}

// loadSecret returns the HMAC secret kept in dir, creating it when
// missing. The directory must belong to this user and be writable by no
// one else, the file likewise and readable by no one else.
func loadSecret(dir string) ([]byte, error) {
	if dir == "" || !filepath.IsAbs(dir) {
		return nil, errors.New("no state directory")
	}
	secretMu.Lock()
	defer secretMu.Unlock()
	if s, ok := secrets[dir]; ok {
		return s, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return nil, err
	}
	if err := private(dir, fi, true); err != nil {
		return nil, err
	}
	p := filepath.Join(dir, secretName)
	s, err := readSecret(p)
	if errors.Is(err, os.ErrNotExist) {
		s = make([]byte, 32)
		rand.Read(s)
		tmp, terr := os.CreateTemp(dir, secretName+".*")
		if terr != nil {
			return nil, terr
		}
		_, werr := tmp.Write(s)
		if cerr := tmp.Close(); werr == nil {
			werr = cerr
		}
		// Link, not rename: of two processes making it at once, the
		// second reads the first's.
		if werr == nil {
			werr = os.Link(tmp.Name(), p)
		}
		os.Remove(tmp.Name())
		if werr != nil && !errors.Is(werr, os.ErrExist) {
			return nil, werr
		}
		s, err = readSecret(p)
	}
	if err != nil {
		return nil, err
	}
	secrets[dir] = s
	return s, nil
}

// readSecret reads a secret file that passes ownedPrivate.
func readSecret(p string) ([]byte, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|oNoFollow, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if err := private(p, fi, false); err != nil {
		return nil, err
	}
	b := make([]byte, 33)
	n, _ := f.Read(b)
	if n != 32 {
		return nil, fmt.Errorf("%s: not a 32-byte secret", p)
	}
	return b[:32], nil
}
