package policy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/moat-sandbox/moat/internal/fsutil"
	"github.com/moat-sandbox/moat/internal/grants"
)

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
	if _, err := resolve(grants, p.Audit.Dir); err != nil {
		for _, pr := range err.Problems {
			d.add(d.nodes[pr.Key], pr.Code, pr.Key, "%s", pr.Message)
		}
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

	// Volumes: mounted where no grant is, their images outside every grant
	// and the audit directory (the workload must not reach the image file
	// behind its own file system).
	seenVol := map[string]int{}
	for i, v := range p.Filesystem.Volumes {
		key := fmt.Sprintf("filesystem.volumes[%d]", i)
		if j, dup := seenVol[v.Path]; dup {
			d.add(d.nodes[key+".path"], CodeDuplicate, key+".path", "volume path %s is already used by filesystem.volumes[%d]", v.Path, j)
		}
		seenVol[v.Path] = i
		for _, g := range grants {
			if overlaps(v.Path, g.path) {
				d.add(d.nodes[key+".path"], CodeBadPath, key+".path", "volume path %s overlaps the grant %s (%s); mount the volume where no grant is", v.Path, g.key, g.path)
			}
			if fsutil.Within(v.Image, g.path) || fsutil.Within(realPrefix(v.Image), realPrefix(g.path)) {
				d.add(d.nodes[key+".path"], CodeBadPath, key+".image", "volume image %s lies inside the grant %s (%s): the workload could change its own file system's image; keep images outside every grant", v.Image, g.key, g.path)
			}
		}
		if overlaps(v.Image, p.Audit.Dir) {
			d.add(d.nodes[key+".path"], CodeAuditInside, key+".image", "volume image %s overlaps the audit directory %s", v.Image, p.Audit.Dir)
		}
	}

	d.validatePackages(p)

	// The workdir must exist inside the sandbox: /tmp itself (the private
	// tmpfs starts empty), a directory inside a grant, or a volume.
	wd := p.Process.Workdir
	inGrant := slices.ContainsFunc(grants, func(g grant) bool { return fsutil.Within(wd, g.path) })
	if slices.ContainsFunc(p.Filesystem.Volumes, func(v Volume) bool { return fsutil.Within(wd, v.Path) }) {
		return // made by moat when the volume is mounted
	}
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

func overlaps(a, b string) bool { return fsutil.Within(a, b) || fsutil.Within(b, a) }

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

// ResolveGrants resolves every grant once, from descriptors (see package
// grants): what a backend mounts. Call it when the run starts; Load
// already did it once for its error messages.
func (p *Policy) ResolveGrants() (*grants.Plan, error) {
	pl, err := resolve(p.grants(), p.Audit.Dir)
	if err != nil {
		probs := make([]Problem, len(err.Problems))
		for i, pr := range err.Problems {
			probs[i] = Problem{Code: pr.Code, Path: pr.Key, Message: pr.Message}
		}
		return nil, &Error{File: p.Source, Problems: probs}
	}
	return pl, nil
}

func resolve(gs []grant, audit string) (*grants.Plan, *grants.Error) {
	specs := make([]grants.Spec, len(gs))
	for i, g := range gs {
		specs[i] = grants.Spec{Key: g.key, Path: g.path, Write: strings.HasPrefix(g.key, "filesystem.read_write")}
	}
	pl, err := grants.Resolve(specs, audit)
	if err != nil {
		var ge *grants.Error
		if errors.As(err, &ge) {
			return nil, ge
		}
		return nil, &grants.Error{Problems: []grants.Problem{{Code: CodeNotFound, Message: err.Error()}}}
	}
	return pl, nil
}

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
