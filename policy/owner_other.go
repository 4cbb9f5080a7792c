//go:build !unix

package policy

import "errors"

// owner is unsupported where files have no numeric owner.
func owner(path string) (uid, gid int, err error) {
	return 0, 0, errors.New("file owners are not supported on this system")
}

// CheckWriteOwners cannot check owners here.
func (p *Policy) CheckWriteOwners(uid, gid int, how string) error {
	return errors.New("file owners are not supported on this system")
}
