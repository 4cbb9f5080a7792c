package fsutil

import (
	"path/filepath"
	"strings"
)

// Within reports whether path p is dir or lies below it, lexically: both
// are cleaned first (so "a/./b" and "a/b" agree, and ".." steps are
// resolved as text, not through symlinks), and an absolute path is never
// within a relative one or the other way round. It is moat's one
// "path within dir" test; whether a path is within a grant on disk, with
// symlinks, is decided on descriptors (internal/grants), not here.
func Within(p, dir string) bool {
	p, dir = filepath.Clean(p), filepath.Clean(dir)
	if filepath.IsAbs(p) != filepath.IsAbs(dir) {
		return false
	}
	switch {
	case p == dir:
		return true
	case dir == "/":
		return true // p is absolute
	case dir == ".":
		return p != ".." && !strings.HasPrefix(p, "../")
	}
	rest, ok := strings.CutPrefix(p, dir+"/")
	// A clean path has its ".." elements at the front only: below a dir
	// that climbs ("../x"), p must not climb further.
	return ok && rest != ".." && !strings.HasPrefix(rest, "../")
}
