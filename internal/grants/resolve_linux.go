package grants

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/fsutil"
)

// noLinks is how every component is opened: no symlink and no magic link
// is ever followed by the kernel; trusted symlinks are followed by hand.
const noLinks = unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// Resolve plans every grant. read_write grants are resolved first, so that
// everything at or below one counts as writable by the workload when the
// others are resolved.
//
// audit, when not "", is the audit directory: no grant may hold it or lie
// inside it (checked on the resolved descriptors).
func Resolve(specs []Spec, audit string) (*Plan, error) {
	pl := &Plan{}
	var probs []Problem
	var rw []string
	for _, s := range specs {
		if s.Write {
			rw = append(rw, s.Path)
		}
	}
	order := slices.Clone(specs)
	slices.SortStableFunc(order, func(a, b Spec) int {
		switch {
		case a.Write && !b.Write:
			return -1
		case !a.Write && b.Write:
			return 1
		}
		return 0
	})
	seen := map[string]bool{}
	for _, s := range order {
		m, links, p := resolveOne(s, rw, audit)
		if p != nil {
			probs = append(probs, *p)
			continue
		}
		if s.Write && m.Real != s.Path {
			rw = append(rw, m.Real)
		}
		pl.Mounts = append(pl.Mounts, m)
		for _, l := range links {
			if !seen[l.Path] {
				seen[l.Path] = true
				pl.Links = append(pl.Links, l)
			}
		}
	}
	if len(probs) > 0 {
		return nil, &Error{Problems: probs}
	}
	// Mount parents before children; keep only links no mount covers.
	slices.SortStableFunc(pl.Mounts, func(a, b Mount) int { return strings.Compare(a.Real, b.Real) })
	pl.Links = slices.DeleteFunc(pl.Links, func(l Link) bool { return pl.Covered(l.Path) })
	return pl, nil
}

type step struct {
	path    string
	fd      int
	trusted bool
}

func trustedDir(st *unix.Stat_t, path string, rw []string) bool {
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Uid != 0 || st.Mode&0o022 != 0 {
		return false
	}
	return !slices.ContainsFunc(rw, func(w string) bool { return fsutil.Within(path, w) })
}

func resolveOne(s Spec, rw []string, audit string) (Mount, []Link, *Problem) {
	bad := func(code, format string, a ...any) (Mount, []Link, *Problem) {
		return Mount{}, nil, &Problem{Key: s.Key, Code: code, Message: fmt.Sprintf(format, a...)}
	}
	if !filepath.IsAbs(s.Path) || filepath.Clean(s.Path) != s.Path {
		return bad(CodeBadPath, "grant %q is not a clean absolute path", s.Path)
	}
	if why := Forbidden(s.Path); why != "" {
		return bad(CodeForbidden, "grant %s: %s", s.Path, why)
	}
	rootFD, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return bad(CodeNotFound, "opening /: %v", err)
	}
	var rst unix.Stat_t
	if err := unix.Fstat(rootFD, &rst); err != nil {
		unix.Close(rootFD)
		return bad(CodeNotFound, "stat /: %v", err)
	}
	stack := []step{{path: "/", fd: rootFD, trusted: trustedDir(&rst, "/", rw)}}
	defer func() {
		for _, st := range stack {
			unix.Close(st.fd)
		}
	}()
	queue := split(s.Path)
	var links []Link
	var st unix.Stat_t
	for n := 0; len(queue) > 0; {
		c := queue[0]
		queue = queue[1:]
		top := stack[len(stack)-1]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(stack) > 1 {
				unix.Close(top.fd)
				stack = stack[:len(stack)-1]
			}
			continue
		}
		next := filepath.Join(top.path, c)
		how := uint64(noLinks | unix.RESOLVE_BENEATH)
		if !top.trusted && len(queue) > 0 {
			how |= unix.RESOLVE_NO_XDEV
		}
		fd, err := unix.Openat2(top.fd, c, &unix.OpenHow{Flags: unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: how})
		switch {
		case errors.Is(err, unix.EXDEV):
			return bad(CodeBadPath, "grant %s crosses the mount point %s below %s, a directory that is not root's alone; grant the path below the mount point itself", s.Path, next, top.path)
		case errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR):
			return bad(CodeNotFound, "grant %s: %s does not exist; create it or remove the grant", s.Path, next)
		case err != nil:
			return bad(CodeNotFound, "grant %s: opening %s: %v", s.Path, next, err)
		}
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return bad(CodeNotFound, "grant %s: stat %s: %v", s.Path, next, err)
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			target, rerr := readlinkFD(fd)
			unix.Close(fd)
			if rerr != nil {
				return bad(CodeNotFound, "grant %s: reading the symlink %s: %v", s.Path, next, rerr)
			}
			if !top.trusted || st.Uid != 0 {
				return bad(CodeSymlink, "grant %s goes through the symlink %s (-> %s), which sits where a user other than root, the workload or another sandbox can write: such a link can be planted or swapped between runs, so moat does not follow it; grant the real path instead", s.Path, next, target)
			}
			if n++; n > MaxLinks {
				return bad(CodeSymlink, "grant %s: more than %d symlinks", s.Path, MaxLinks)
			}
			links = append(links, Link{Path: next, Target: target})
			if filepath.IsAbs(target) {
				for _, x := range stack[1:] {
					unix.Close(x.fd)
				}
				stack = stack[:1]
			}
			queue = append(strings.Split(target, "/"), queue...)
			continue
		}
		if len(queue) > 0 && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			unix.Close(fd)
			return bad(CodeNotFound, "grant %s: %s is not a directory", s.Path, next)
		}
		stack = append(stack, step{path: next, fd: fd, trusted: top.trusted && trustedDir(&st, next, rw)})
	}
	top := stack[len(stack)-1]
	if err := unix.Fstat(top.fd, &st); err != nil {
		return bad(CodeNotFound, "grant %s: %v", s.Path, err)
	}
	if why := Forbidden(top.path); why != "" {
		return bad(CodeForbidden, "grant %s resolves to %s: %s", s.Path, top.path, why)
	}
	typ := st.Mode & unix.S_IFMT
	if typ != unix.S_IFDIR && typ != unix.S_IFREG {
		return bad(CodeBadType, "grant %s is neither a directory nor a regular file (mode %#o); grant the directory or file the workload needs", s.Path, st.Mode)
	}
	if audit != "" {
		if err := auditApart(top.fd, &st, audit); err != nil {
			return bad(CodeAuditInside, "grant %s: %v; set audit.dir to a directory outside every grant", s.Path, err)
		}
	}
	m := Mount{Spec: s, Real: top.path, Dir: typ == unix.S_IFDIR, Dev: st.Dev, Ino: st.Ino, Trusted: "/"}
	for _, x := range stack {
		if !x.trusted {
			break
		}
		m.Trusted = x.path
	}
	return m, links, nil
}

func readlinkFD(fd int) (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(fd, "", buf)
	if err != nil {
		return "", err
	}
	if n >= len(buf) {
		return "", errors.New("target too long")
	}
	return string(buf[:n]), nil
}

// Checks are what the namespace that clones a grant verifies on the
// descriptor it clones, beyond the plan's identity.
type Checks struct {
	// WriteOwner, when >= 0, is the uid (as seen in the calling
	// namespace) that must own every read_write grant.
	WriteOwner int
}

// Open opens the grant's canonical path in the calling namespace without
// following any symlink (and, below m.Trusted, without crossing a mount
// except at the grant itself), and checks the descriptor: same device and
// inode as planned, same type, not one of the forbidden trees, owner, and
// no overlap with the audit directory. It returns an O_PATH descriptor.
func (m Mount) Open(c Checks) (int, error) {
	fail := func(format string, a ...any) (int, error) {
		return -1, fmt.Errorf("grant %s: "+format, append([]any{m.Path}, a...)...)
	}
	if !filepath.IsAbs(m.Real) || filepath.Clean(m.Real) != m.Real || !fsutil.Within(m.Real, m.Trusted) {
		return fail("BUG: bad plan (real %q, trusted %q)", m.Real, m.Trusted)
	}
	if why := Forbidden(m.Real); why != "" {
		return fail("%s", why)
	}
	fd, err := unix.Openat2(unix.AT_FDCWD, m.Trusted, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: noLinks})
	if err != nil {
		return fail("opening %s: %v", m.Trusted, err)
	}
	rest := split(strings.TrimPrefix(m.Real, m.Trusted))
	if m.Trusted == "/" {
		rest = split(m.Real)
	}
	for i, c := range rest {
		how := uint64(noLinks | unix.RESOLVE_BENEATH)
		if i < len(rest)-1 {
			how |= unix.RESOLVE_NO_XDEV
		}
		nfd, err := unix.Openat2(fd, c, &unix.OpenHow{Flags: unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: how})
		unix.Close(fd)
		if err != nil {
			return fail("opening %s without following symlinks or crossing mounts: %v; something changed it since moat checked the policy: look at it, then run again", m.Real, err)
		}
		fd = nfd
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return fail("%v", err)
	}
	typ := st.Mode & unix.S_IFMT
	switch {
	case typ == unix.S_IFLNK:
		err = fmt.Errorf("%s became a symlink", m.Real)
	case st.Dev != m.Dev || st.Ino != m.Ino:
		err = fmt.Errorf("%s is no longer the directory or file moat checked (device/inode %d/%d, now %d/%d): something replaced it since; look at it, then run again", m.Real, m.Dev, m.Ino, st.Dev, st.Ino)
	case (typ == unix.S_IFDIR) != m.Dir || (typ != unix.S_IFDIR && typ != unix.S_IFREG):
		err = fmt.Errorf("%s changed type (mode %#o)", m.Real, st.Mode)
	case m.Write && c.WriteOwner >= 0 && int(st.Uid) != c.WriteOwner:
		err = fmt.Errorf("the read_write grant %s is not owned by the workload's host uid", m.Real)
	}
	if err == nil {
		err = notSpecial(&st)
	}
	if err != nil {
		unix.Close(fd)
		return fail("%v", err)
	}
	return fd, nil
}

// notSpecial refuses a descriptor on the file systems of /proc, /sys and
// /dev as mounted in the calling namespace, and the root itself.
func notSpecial(st *unix.Stat_t) error {
	var rs unix.Stat_t
	if unix.Stat("/", &rs) == nil && rs.Dev == st.Dev && rs.Ino == st.Ino {
		return errors.New("it is the whole root")
	}
	for _, p := range forbiddenRoots {
		var fs unix.Stat_t
		if unix.Stat(p, &fs) == nil && fs.Dev == st.Dev && fs.Dev != rs.Dev {
			return fmt.Errorf("it lies on the file system of %s", p)
		}
	}
	return nil
}

// maxDepth bounds the ".." walks of auditApart.
const maxDepth = 4096

type ident struct{ dev, ino uint64 }

// ancestors lists the identities of fd's directory and every directory
// above it, up to the root, by opening "..".
func ancestors(fd int) ([]ident, error) {
	var out []ident
	cur, err := unix.Openat(fd, ".", unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer func() { unix.Close(cur) }()
	for range maxDepth {
		var st unix.Stat_t
		if err := unix.Fstat(cur, &st); err != nil {
			return nil, err
		}
		id := ident{st.Dev, st.Ino}
		if len(out) > 0 && out[len(out)-1] == id {
			return out, nil // ".." of the root is the root
		}
		out = append(out, id)
		up, err := unix.Openat(cur, "..", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		unix.Close(cur)
		cur = up
	}
	return nil, errors.New("too deep")
}

// auditApart checks, on descriptors, that the audit directory is neither
// inside the grant nor holds it. An audit directory that does not exist
// yet is checked through its deepest existing parent.
func auditApart(fd int, st *unix.Stat_t, audit string) error {
	p := filepath.Clean(audit)
	var afd int
	for {
		var err error
		afd, err = unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.ENOENT) || p == "/" {
			return fmt.Errorf("checking the audit directory %s: %v", audit, err)
		}
		p = filepath.Dir(p)
	}
	defer unix.Close(afd)
	up, err := ancestors(afd)
	if err != nil {
		return fmt.Errorf("checking the audit directory %s: %v", audit, err)
	}
	if slices.Contains(up, ident{st.Dev, st.Ino}) {
		return fmt.Errorf("the audit directory %s lies inside it; the workload could read or change its own journal", audit)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || p != filepath.Clean(audit) {
		return nil
	}
	var ast unix.Stat_t
	if err := unix.Fstat(afd, &ast); err != nil {
		return err
	}
	mine, err := ancestors(fd)
	if err != nil {
		return err
	}
	if slices.Contains(mine, ident{ast.Dev, ast.Ino}) {
		return fmt.Errorf("it lies inside the audit directory %s", audit)
	}
	return nil
}
