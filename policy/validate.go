package policy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
)

// MaxWalkEntries caps how many directory entries moat examines, over all
// grants, when it looks for Unix sockets. A grant too large to check is
// refused: grant a narrower directory.
const MaxWalkEntries = 1_000_000

// forbiddenRoots are host trees never granted: moat builds its own /proc
// and /dev, and /sys exposes the host.
var forbiddenRoots = []string{"/proc", "/sys", "/dev"}

// validate fills the path defaults and checks what needs the whole policy
// or the file system.
func (d *decoder) validate(p *Policy) {
	if p.Audit.Dir == "" {
		abs, err := filepath.Abs(DefaultAuditDir)
		if err != nil {
			d.add(nil, CodeBadPath, "audit.dir", "default %s: cannot find the current directory: %v; set audit.dir", DefaultAuditDir, err)
		}
		p.Audit.Dir = abs
	}
	if !d.set["process.workdir"] {
		p.Process.Workdir = "/tmp"
		if len(p.Filesystem.ReadWrite) > 0 {
			p.Process.Workdir = p.Filesystem.ReadWrite[0]
		}
	}

	grants := d.grants
	seen := map[string]string{}
	for _, g := range grants {
		if prev, dup := seen[g.path]; dup {
			d.add(d.nodes[g.key], CodeDuplicate, g.key, "%s is already granted by %s", g.path, prev)
			continue
		}
		seen[g.path] = g.key
	}
	budget := MaxWalkEntries
	for _, pr := range checkGrants(grants, &budget) {
		d.add(d.nodes[pr.Path], pr.Code, pr.Path, "%s", pr.Message)
	}

	// The audit directory must be invisible to the workload: not inside a
	// grant, not equal to one, and not containing one; compared both as
	// written and after resolving symlinks.
	audit, auditReal := p.Audit.Dir, realPrefix(p.Audit.Dir)
	for _, g := range grants {
		gReal := realPrefix(g.path)
		if overlaps(audit, g.path) || overlaps(auditReal, gReal) {
			hint := "set audit.dir to a directory outside every grant"
			if d.nodes["audit.dir"] == nil {
				hint = "audit.dir defaults to " + DefaultAuditDir + " under the current directory: run moat from elsewhere or " + hint
			}
			d.add(d.nodes["audit.dir"], CodeAuditInside, "audit.dir",
				"audit directory %s overlaps the grant %s (%s); the workload could read or change its own journal: %s", audit, g.key, g.path, hint)
		}
	}

	// The workdir must exist inside the sandbox: /tmp itself (the private
	// tmpfs starts empty) or a directory inside a grant.
	wd := p.Process.Workdir
	inGrant := slices.ContainsFunc(grants, func(g grant) bool { return within(wd, g.path) })
	switch {
	case inGrant:
		if st, err := os.Stat(wd); err != nil {
			d.add(d.nodes["process.workdir"], CodeNotFound, "process.workdir", "workdir %s: %s", wd, errText(err))
		} else if !st.IsDir() {
			d.add(d.nodes["process.workdir"], CodeBadPath, "process.workdir", "workdir %s is not a directory", wd)
		}
	case wd != "/tmp":
		d.add(d.nodes["process.workdir"], CodeBadPath, "process.workdir", "workdir %s is neither inside a grant nor /tmp; it would not exist inside the sandbox", wd)
	}
}

func overlaps(a, b string) bool { return within(a, b) || within(b, a) }

type grant struct {
	key  string // e.g. filesystem.read_write[0]
	path string
}

func (p *Policy) grants() []grant {
	var out []grant
	for i, g := range p.Filesystem.ReadOnly {
		out = append(out, grant{fmt.Sprintf("filesystem.read_only[%d]", i), g})
	}
	for i, g := range p.Filesystem.ReadWrite {
		out = append(out, grant{fmt.Sprintf("filesystem.read_write[%d]", i), g})
	}
	return out
}

// CheckGrants checks the grants against the file system again: each exists,
// is not /, /proc, /sys or /dev (or inside them), and neither is nor holds
// a Unix socket. Load already does this; call it again when the run starts
// (a socket added after that is stopped by the seccomp filter). It returns
// an *Error listing every problem, or nil.
func (p *Policy) CheckGrants() error {
	budget := MaxWalkEntries
	probs := checkGrants(p.grants(), &budget)
	if len(probs) == 0 {
		return nil
	}
	return &Error{File: p.Source, Problems: probs}
}

func checkGrants(grants []grant, budget *int) []Problem {
	var probs []Problem
	var walked []string
	bad := func(code string, g grant, format string, a ...any) {
		probs = append(probs, Problem{Code: code, Path: g.key, Message: fmt.Sprintf(format, a...)})
	}
	for _, g := range grants {
		if !filepath.IsAbs(g.path) || filepath.Clean(g.path) != g.path {
			bad(CodeBadPath, g, "grant %q is not a clean absolute path", g.path)
			continue
		}
		real, err := filepath.EvalSymlinks(g.path)
		if err != nil {
			bad(CodeNotFound, g, "grant %s: %s; create it or remove the grant", g.path, errText(err))
			continue
		}
		if msg := forbidden(g.path, real); msg != "" {
			bad(CodeForbidden, g, "%s", msg)
			continue
		}
		if slices.ContainsFunc(walked, func(w string) bool { return within(real, w) }) {
			continue // already checked through another grant (e.g. /bin -> /usr/bin)
		}
		walked = append(walked, real)
		sock, err := findSocket(real, budget)
		switch {
		case sock != "":
			bad(CodeSocket, g, "grant %s holds the Unix socket %s; a socket in a grant is a way out of the sandbox: grant a directory without it", g.path, sock)
		case errors.Is(err, errWalkBudget):
			bad(CodeTooLarge, g, "grant %s holds more than %d entries (with the other grants), too many to check for Unix sockets; grant narrower directories", g.path, MaxWalkEntries)
		case err != nil:
			bad(CodeNotFound, g, "grant %s cannot be checked for Unix sockets: %v", g.path, err)
		}
	}
	return probs
}

func forbidden(path, real string) string {
	for _, p := range []string{path, real} {
		if p == "/" {
			return fmt.Sprintf("grant %s is the host's whole root; grant the directories the workload needs", path)
		}
		for _, r := range forbiddenRoots {
			if within(p, r) {
				return fmt.Sprintf("grant %s is inside %s, which moat never grants (the sandbox has its own /proc and /dev, and no /sys)", path, r)
			}
		}
	}
	return ""
}

var errWalkBudget = errors.New("too many entries")

// realPrefix resolves symlinks in the longest existing prefix of p and
// appends the rest, so that a path that does not exist yet (the audit
// directory) can still be compared with grants.
func realPrefix(p string) string {
	rest := ""
	for cur := p; ; {
		if real, err := filepath.EvalSymlinks(cur); err == nil {
			return filepath.Join(real, rest)
		}
		parent := filepath.Dir(cur)
		if parent == cur {
			return p
		}
		rest = filepath.Join(filepath.Base(cur), rest)
		cur = parent
	}
}
