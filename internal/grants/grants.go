// Package grants resolves the policy's filesystem grants exactly once, from
// descriptors, and says how the namespace that mounts them must open them.
//
// A grant path is walked one component at a time with openat2 and
// RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS. A symlink on the way is
// followed only when the directory holding it and every directory above
// it is owned by root and writable by no one else, and the link itself is
// owned by root (the /bin → usr/bin and /lib64 → usr/lib64 of merged-/usr
// hosts). Such a link is recorded in the [Plan] and recreated inside the
// sandbox as a symlink; it is never mounted through. Any other symlink
// makes the grant refused: a directory that the caller, the workload, or
// another sandbox can write is where a symlink gets planted between two
// runs (found by attack: a nested grant re-resolved through a renamed
// parent mounted the host's /etc read-write).
//
// Why root only, and not "root or the caller" as the issue first put it:
// rootless, every sandbox of the caller writes as the caller, so a
// directory the caller owns is one that another sandbox of the caller can
// write. Below the first directory that is not trusted in this sense
// (the "untrusted zone"), every component is also opened with
// RESOLVE_NO_XDEV, except the grant's own last component, which may be a
// mount point.
//
// The [Plan] is made in the supervisor, which sees host ownership. The
// namespace that clones the trees (the native init, inside its user
// namespace; the gVisor init) opens each canonical, symlink-free path
// again with [Mount.Open], which refuses any symlink, checks the
// descriptor's identity (device and inode) against the plan, and runs the
// authorizing checks (type, forbidden trees, owner) on that very
// descriptor. open_tree(2) refuses a descriptor from another mount
// namespace (EINVAL, checked on this kernel), so the descriptor cannot be
// handed over; the identity check makes the second open safe: the tree
// cloned is the inode that was authorized, or the run is refused.
package grants

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/moat-sandbox/moat/internal/fsutil"
)

// Spec is one grant as the policy wrote it (clean and absolute).
type Spec struct {
	Key   string `json:"key"` // e.g. filesystem.read_write[0], for messages
	Path  string `json:"path"`
	Write bool   `json:"write"`
}

// Mount is one grant resolved: a canonical host path, free of symlinks,
// mounted at the same path inside the sandbox.
type Mount struct {
	Spec
	// Real is the canonical path (Spec.Path with trusted symlinks
	// resolved). It holds no symlink and no "." or "..".
	Real string `json:"real"`
	Dir  bool   `json:"dir"`
	Dev  uint64 `json:"dev"`
	Ino  uint64 `json:"ino"`
	// Trusted is the deepest directory on Real's way whose chain is root
	// owned and writable by no one else. Below it, Open also refuses to
	// cross mounts (the grant itself excepted).
	Trusted string `json:"trusted"`
	// Runtime marks a file that moat's own dynamically linked binary
	// needs (see Runtime): mounted for moat's helpers, with no Landlock
	// rule for the workload.
	Runtime bool `json:"runtime,omitempty"`
}

// Link is a trusted symlink met while resolving, recreated inside the
// sandbox at Path (unless a mounted grant covers Path).
type Link struct {
	Path   string `json:"path"`
	Target string `json:"target"`
}

// Plan is the result of resolving every grant.
type Plan struct {
	Mounts []Mount `json:"mounts"`
	Links  []Link  `json:"links,omitempty"`
}

// Problem codes, shared with the policy package's error codes.
const (
	CodeNotFound    = "not_found"
	CodeForbidden   = "forbidden"
	CodeSymlink     = "symlink"
	CodeBadPath     = "bad_path"
	CodeBadType     = "bad_type"
	CodeAuditInside = "audit_inside"
)

// Problem is one grant that cannot be resolved.
type Problem struct {
	Key     string
	Code    string
	Message string
}

// Error lists every problem found.
type Error struct{ Problems []Problem }

func (e *Error) Error() string {
	var b strings.Builder
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteString("; ")
		}
		if p.Key != "" {
			b.WriteString(p.Key + ": ")
		}
		b.WriteString(p.Message)
	}
	return b.String()
}

// MaxLinks bounds the symlinks followed for one grant (the kernel's own
// limit is 40).
const MaxLinks = 40

// forbiddenRoots are host trees never granted: the sandbox gets its own
// /proc and /dev, and /sys exposes the host.
var forbiddenRoots = []string{"/proc", "/sys", "/dev"}

// Forbidden says why a path may never be granted, or "".
func Forbidden(p string) string {
	if p == "/" {
		return "it is the host's whole root; grant the directories the workload needs"
	}
	for _, r := range forbiddenRoots {
		if fsutil.Within(p, r) {
			return fmt.Sprintf("it is inside %s, which moat never grants (the sandbox has its own /proc and /dev, and no /sys)", r)
		}
	}
	return ""
}

// Covered reports whether p lies at or below the real path of a mount.
func (pl *Plan) Covered(p string) bool {
	for _, m := range pl.Mounts {
		if fsutil.Within(p, m.Real) {
			return true
		}
	}
	return false
}

// split turns a clean absolute path into its components.
func split(p string) []string {
	p = strings.TrimPrefix(filepath.Clean(p), "/")
	if p == "" {
		return nil
	}
	return strings.Split(p, "/")
}
