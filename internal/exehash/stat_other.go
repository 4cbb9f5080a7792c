//go:build !linux

package exehash

import "os"

// stat returns f's size and whether it is a regular file. Off Linux the
// key has no inode and ctime, so no version is remembered.
func stat(f *os.File) (Key, bool, error) {
	fi, err := f.Stat()
	if err != nil {
		return Key{}, false, err
	}
	return Key{Size: fi.Size()}, fi.Mode().IsRegular(), nil
}
