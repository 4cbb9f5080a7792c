// Package runinfo is moat's --run-info file: the one type that moat run
// writes and that every reader (the evidence and conformance harnesses,
// the tests) decodes, and the one writer.
//
// The writer pins the file's parent directory by descriptor before anything
// starts (opened with O_DIRECTORY|O_NOFOLLOW), refuses a path that lies in
// one of the policy's filesystem grants, and later writes the file
// atomically relative to that descriptor: a temporary file created with
// O_EXCL, fsynced and renamed over the name, then the directory fsynced. A
// symlink planted at the name is replaced, never followed.
//
// Inside a grant is decided on inodes, not on spellings: the pinned
// directory and every directory above it (found by opening ".." from the
// descriptor) are compared by device and inode with each grant (stat'ed,
// following the grant's own symlinks, as the backends mount it), and the
// existing entry at the name with each grant that is a file. This is the
// directory that is written into, whatever symlinks, "..", or mount points
// the given path went through, and nothing is looked up again between the
// check and the write. A bind mount of a directory inside a grant, mounted
// elsewhere on the host, is not recognised (".." from a mount's root leaves
// the mount); the textual check catches every path spelled inside a grant.
package runinfo

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/internal/fsutil"
)

// Info is what --run-info holds: how an outside controller pins the
// journal key and observes the workload without trusting anything inside.
type Info struct {
	RunID        string                `json:"run_id"`
	Journal      string                `json:"journal"`
	PublicKeyPEM string                `json:"public_key_pem"`
	KeyID        string                `json:"keyid"`
	HostPID      int                   `json:"host_pid"`
	WorkloadPID  int                   `json:"workload_pid,omitempty"`
	Backend      string                `json:"backend"`
	Properties   boundary.Properties   `json:"properties"`
	Limits       boundary.LimitsStatus `json:"limits"`
	BrokerPort   int                   `json:"broker_port"`
}

// Mode is the run-info file's mode.
const Mode = 0o600

// GrantError is the refusal of a run-info path inside a grant.
type GrantError struct {
	Path  string // the run-info path as given
	Kind  string // "read_only" or "read_write"
	Grant string // the grant's path in the policy
	How   string // how it was found inside
}

func (e *GrantError) Error() string {
	return fmt.Sprintf("--run-info %s lies inside the policy's filesystem.%s grant %s (%s): the workload could replace or read it there; choose a path outside every grant",
		e.Path, e.Kind, e.Grant, e.How)
}

// Grants are the policy's filesystem grants, by kind.
type Grants struct {
	ReadOnly  []string
	ReadWrite []string
}

func (g Grants) each(f func(kind, path string) error) error {
	for _, p := range g.ReadOnly {
		if err := f("read_only", p); err != nil {
			return err
		}
	}
	for _, p := range g.ReadWrite {
		if err := f("read_write", p); err != nil {
			return err
		}
	}
	return nil
}

// Target is a run-info path, checked and with its directory pinned.
type Target struct {
	path string
	name string
	dir  *fsutil.Dir
}

// Open checks path against the grants and pins its directory. The error
// is a *GrantError when the path lies inside a grant.
func Open(path string, grants Grants) (*Target, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("--run-info %s: %w", path, err)
	}
	name := filepath.Base(abs)
	if name == "/" || name == "." || name == ".." || strings.HasSuffix(path, "/") {
		return nil, fmt.Errorf("--run-info %s: not a file path", path)
	}
	// The spelling first: a path written inside a grant is refused even
	// when nothing of it exists yet.
	if err := grants.each(func(kind, g string) error {
		if fsutil.Within(abs, filepath.Clean(g)) {
			return &GrantError{Path: path, Kind: kind, Grant: g, How: "by its path"}
		}
		return nil
	}); err != nil {
		return nil, err
	}
	dir, err := fsutil.OpenDir(filepath.Dir(abs))
	if err != nil {
		return nil, fmt.Errorf("--run-info %s: its directory: %w", path, err)
	}
	t := &Target{path: path, name: name, dir: dir}
	if err := t.check(grants); err != nil {
		dir.Close()
		return nil, err
	}
	return t, nil
}

func (t *Target) check(grants Grants) error {
	anc, err := t.dir.Ancestors()
	if err != nil {
		return fmt.Errorf("--run-info %s: %w", t.path, err)
	}
	entry, exists, err := t.dir.EntryID(t.name)
	if err != nil {
		return fmt.Errorf("--run-info %s: %w", t.path, err)
	}
	return grants.each(func(kind, g string) error {
		gid, err := fsutil.StatID(g)
		if errors.Is(err, os.ErrNotExist) {
			return nil // nothing there to be inside of; the backend refuses a missing grant
		}
		if err != nil {
			return fmt.Errorf("--run-info %s: cannot compare with the grant %s: %w", t.path, g, err)
		}
		for i, a := range anc {
			if a == gid {
				how := "its directory is the grant"
				if i > 0 {
					how = fmt.Sprintf("the grant is %d directories above it, reached through symlinks or mounts", i)
				}
				return &GrantError{Path: t.path, Kind: kind, Grant: g, How: how}
			}
		}
		if exists && entry == gid {
			return &GrantError{Path: t.path, Kind: kind, Grant: g, How: "it is the granted file itself"}
		}
		return nil
	})
}

// Write writes info atomically through the pinned directory.
func (t *Target) Write(info Info) error {
	b, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return err
	}
	if err := t.dir.WriteFile(t.name, append(b, '\n'), Mode); err != nil {
		return fmt.Errorf("--run-info %s: %w", t.path, err)
	}
	return nil
}

// Close releases the pinned directory.
func (t *Target) Close() error { return t.dir.Close() }

// Decode parses a run-info file; it must name a run and its key.
func Decode(b []byte) (Info, error) {
	var ri Info
	if err := json.Unmarshal(b, &ri); err != nil {
		return Info{}, fmt.Errorf("run info: %w", err)
	}
	if ri.RunID == "" || ri.PublicKeyPEM == "" {
		return Info{}, errors.New("run info: run_id or public_key_pem missing")
	}
	return ri, nil
}

// Read reads and decodes a run-info file, and returns its bytes too.
func Read(path string) (Info, []byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Info{}, nil, err
	}
	ri, err := Decode(b)
	return ri, b, err
}
