//go:build linux

package exehash

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

const oNoFollow = unix.O_NOFOLLOW

// private checks that fi (of path) belongs to this user and that no one
// else may write it (a directory) or read it (a file).
func private(path string, fi os.FileInfo, dir bool) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s: no owner", path)
	}
	switch {
	case int(st.Uid) != os.Geteuid():
		return fmt.Errorf("%s: owned by uid %d, not %d", path, st.Uid, os.Geteuid())
	case dir && !fi.IsDir():
		return fmt.Errorf("%s: not a directory", path)
	case dir && fi.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("%s: writable by others (%v)", path, fi.Mode().Perm())
	case !dir && !fi.Mode().IsRegular():
		return fmt.Errorf("%s: not a regular file", path)
	case !dir && fi.Mode().Perm()&0o077 != 0:
		return fmt.Errorf("%s: open to others (%v)", path, fi.Mode().Perm())
	}
	return nil
}

// userKeyring keeps entries in the caller's user keyring (@u), as
// "user" keys that only their owner may change and that expire after
// sharedTimeout.
type userKeyring struct{}

func newKeyring() sharedStore { return userKeyring{} }

func (userKeyring) get(desc string) ([]byte, error) {
	id, err := unix.KeyctlSearch(unix.KEY_SPEC_USER_KEYRING, "user", desc, 0)
	if err != nil {
		return nil, err
	}
	b := make([]byte, 128)
	n, err := unix.KeyctlBuffer(unix.KEYCTL_READ, id, b, 0)
	if err != nil {
		return nil, err
	}
	if n > len(b) {
		return nil, errors.New("entry too long")
	}
	return b[:n], nil
}

// The entry's permissions: its possessor and its owner may view, read
// and search it; no one may write it or change its attributes (a new
// version is a new entry).
// (keyctl_setperm(3): possessor bits in the top byte, the owner's in the
// third.)
const entryPerm = 0x0b0b0000 // VIEW (1) | READ (2) | SEARCH (8), for both

func (k userKeyring) put(desc string, payload []byte) error {
	id, err := unix.AddKey("user", desc, payload, unix.KEY_SPEC_USER_KEYRING)
	if errors.Is(err, unix.EDQUOT) {
		// Full (a user may keep 200 keys and 20000 bytes by default):
		// moat's own entries go, the user's others stay.
		k.clear()
		id, err = unix.AddKey("user", desc, payload, unix.KEY_SPEC_USER_KEYRING)
	}
	if err != nil {
		return err
	}
	unix.KeyctlInt(unix.KEYCTL_SET_TIMEOUT, id, int(sharedTimeout.Seconds()), 0, 0)
	return unix.KeyctlSetperm(id, entryPerm)
}

// clear unlinks moat's entries from the user keyring.
func (userKeyring) clear() {
	b := make([]byte, 4*4096)
	n, err := unix.KeyctlBuffer(unix.KEYCTL_READ, unix.KEY_SPEC_USER_KEYRING, b, 0)
	if err != nil {
		return
	}
	ring, err := unix.KeyctlGetKeyringID(unix.KEY_SPEC_USER_KEYRING, false)
	if err != nil {
		return
	}
	for i := 0; i+4 <= min(n, len(b)); i += 4 {
		id := int(int32(uint32(b[i]) | uint32(b[i+1])<<8 | uint32(b[i+2])<<16 | uint32(b[i+3])<<24))
		d, err := unix.KeyctlString(unix.KEYCTL_DESCRIBE, id)
		// "type;uid;gid;perm;description"
		if f := strings.SplitN(d, ";", 5); err == nil && len(f) == 5 && f[0] == "user" && strings.HasPrefix(f[4], sharedPrefix) {
			unix.KeyctlInt(unix.KEYCTL_UNLINK, id, ring, 0, 0)
		}
	}
}
