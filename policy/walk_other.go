//go:build !linux

package policy

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
)

// MaxWalkDepth caps how deep moat descends into a grant; WalkDir keeps
// no descriptors open, so here it bounds the work like MaxWalkEntries.
const MaxWalkDepth = 256

// findSocket returns the first Unix socket at or under root (not following
// symlinks), examining at most *budget entries.
func findSocket(root string, budget *int) (string, error) {
	var found string
	err := filepath.WalkDir(root, func(path string, de fs.DirEntry, err error) error {
		if err != nil {
			// A directory moat cannot search is one the workload, which
			// has no more rights than moat, cannot reach into either.
			if errors.Is(err, fs.ErrPermission) && de != nil && de.IsDir() && !searchable(path) {
				return filepath.SkipDir
			}
			return fmt.Errorf("%s: %s", path, errText(err))
		}
		*budget--
		if *budget < 0 || strings.Count(path[len(root):], string(filepath.Separator)) > MaxWalkDepth {
			return errWalkBudget
		}
		if de.Type()&fs.ModeSocket != 0 {
			found = path
			return filepath.SkipAll
		}
		return nil
	})
	if found != "" {
		return found, nil
	}
	return "", err
}
