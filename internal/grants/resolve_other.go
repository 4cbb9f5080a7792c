//go:build !linux

package grants

import (
	"errors"
	"fmt"
	"path/filepath"
)

// Resolve, away from Linux, checks what it can by path (for `moat policy
// check`); no backend runs here, so nothing is mounted from it.
func Resolve(specs []Spec, audit string) (*Plan, error) {
	pl := &Plan{}
	var probs []Problem
	for _, s := range specs {
		if !filepath.IsAbs(s.Path) || filepath.Clean(s.Path) != s.Path {
			probs = append(probs, Problem{s.Key, CodeBadPath, fmt.Sprintf("grant %q is not a clean absolute path", s.Path)})
			continue
		}
		if why := Forbidden(s.Path); why != "" {
			probs = append(probs, Problem{s.Key, CodeForbidden, fmt.Sprintf("grant %s: %s", s.Path, why)})
			continue
		}
		real, err := filepath.EvalSymlinks(s.Path)
		if err != nil {
			probs = append(probs, Problem{s.Key, CodeNotFound, fmt.Sprintf("grant %s: %v", s.Path, err)})
			continue
		}
		pl.Mounts = append(pl.Mounts, Mount{Spec: s, Real: real, Trusted: "/"})
	}
	if len(probs) > 0 {
		return nil, &Error{Problems: probs}
	}
	return pl, nil
}

// Checks are what the namespace that clones a grant verifies.
type Checks struct{ WriteOwner int }

// Open is Linux-only.
func (m Mount) Open(Checks) (int, error) { return -1, errors.New("grants: only on Linux") }

// Runtime is Linux-only: no backend runs here.
func Runtime() ([]Spec, error) { return nil, nil }

// AddRuntime is Linux-only.
func (pl *Plan) AddRuntime() error { return nil }
