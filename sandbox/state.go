package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/internal/fsutil"
)

// The lifecycle's state lives in one directory: $MOAT_STATE_DIR if set,
// else /var/lib/moat for root and $XDG_STATE_HOME/moat (default
// ~/.local/state/moat) for users. Layout:
//
//	<state>/lock                    flock held while names are created or removed
//	<state>/sandboxes/<name>/       0700, one per sandbox
//	    state.json                  written atomically by the supervisor
//	    control.sock                the supervisor's control socket (0600)
//	    supervisor.log              the supervisor's stderr
const (
	stateFile   = "state.json"
	controlSock = "control.sock"
	logFile     = "supervisor.log"
)

// StateDir returns the lifecycle state directory for this user.
func StateDir() (string, error) {
	if d := os.Getenv("MOAT_STATE_DIR"); d != "" {
		return filepath.Abs(d)
	}
	if os.Geteuid() == 0 {
		return "/var/lib/moat", nil
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" && filepath.IsAbs(d) {
		return filepath.Join(d, "moat"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no state directory: set MOAT_STATE_DIR or HOME: %w", err)
	}
	return filepath.Join(home, ".local", "state", "moat"), nil
}

// nameRE is compiled when first used: its {0,62} is 62 copies in the
// compiled program (724 allocations, 0.1 ms), which every start of the
// moat binary paid in package initialisation, the sandbox's init, stage
// and measurement helper included.
var nameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`) })

// ValidateName checks a sandbox name.
func ValidateName(name string) error {
	if !nameRE().MatchString(name) || strings.Contains(name, "..") {
		return fmt.Errorf("invalid sandbox name %q: use 1-63 characters of a-z, 0-9, '.', '_' and '-', starting with a letter or digit", name)
	}
	return nil
}

// State is what `moat sandbox get` reports.
type State struct {
	Name            string              `json:"name"`
	Phase           boundary.Phase      `json:"phase"`
	Error           string              `json:"error,omitempty"`
	Backend         string              `json:"backend"`
	RunID           string              `json:"run_id,omitempty"`
	Properties      boundary.Properties `json:"properties"`
	PolicySHA256    string              `json:"policy_sha256"`
	Journal         string              `json:"journal,omitempty"`
	PublicKey       string              `json:"public_key,omitempty"` // path of pubkey.pem
	KeyID           string              `json:"keyid,omitempty"`
	Created         time.Time           `json:"created"`
	SupervisorPID   int                 `json:"supervisor_pid,omitempty"`
	SupervisorStart uint64              `json:"supervisor_start,omitempty"` // /proc/<pid>/stat start time, against pid reuse
	HostPID         int                 `json:"host_pid,omitempty"`
	BrokerPort      int                 `json:"broker_port,omitempty"`
	Staging         string              `json:"staging,omitempty"` // the backend staging dir, removed by delete
	// Parent is the sandbox whose budget this one draws on (--parent);
	// Ledger the directory of the budget ledger it is charged in.
	Parent string `json:"parent,omitempty"`
	Ledger string `json:"ledger,omitempty"`
	// Live fields, filled by get from the supervisor.
	AllowanceUsed int            `json:"allowance_used"`
	AllowanceMax  int            `json:"allowance_max"`
	Processes     map[string]int `json:"processes,omitempty"`
}

// ErrNotFound is returned (as a *NotFoundError) for a sandbox name that
// does not exist.
var ErrNotFound = errors.New("sandbox not found")

// NotFoundError names the sandbox that does not exist; errors.Is(err,
// ErrNotFound) holds for it.
type NotFoundError struct{ Name string }

func (e *NotFoundError) Error() string {
	return fmt.Sprintf("no sandbox named %s (not found; moat sandbox list shows the sandboxes)", e.Name)
}

func (e *NotFoundError) Is(target error) bool { return target == ErrNotFound }

type store struct{ dir string }

func openStore() (*store, error) {
	d, err := StateDir()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(d, "sandboxes"), 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	return &store{dir: d}, nil
}

func (s *store) sandboxDir(name string) string { return filepath.Join(s.dir, "sandboxes", name) }

// lock takes the store's exclusive lock; the returned func releases it.
func (s *store) lock() (func(), error) {
	f, err := os.OpenFile(filepath.Join(s.dir, "lock"), os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, nil
}

func (s *store) read(name string) (*State, error) {
	b, err := os.ReadFile(filepath.Join(s.sandboxDir(name), stateFile))
	if errors.Is(err, os.ErrNotExist) {
		if _, derr := os.Stat(s.sandboxDir(name)); derr == nil {
			// Created, supervisor not yet written its first state.
			return &State{Name: name, Phase: boundary.PhaseProvisioning}, nil
		}
		return nil, &NotFoundError{Name: name}
	}
	if err != nil {
		return nil, err
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("state of %s is corrupt: %w", name, err)
	}
	return &st, nil
}

// writeState replaces state.json atomically (fsutil.Dir.WriteFile: a
// temporary file, fsync, rename, never following a symlink at the name).
func writeState(dir string, st *State) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(filepath.Join(dir, stateFile), append(b, '\n'), 0o600)
}

func procStart(pid int) uint64 { return fsutil.ProcStart(pid) }

// alive reports whether the supervisor recorded in st still runs.
func (st *State) alive() bool {
	return st.SupervisorPID > 0 && st.SupervisorStart != 0 && procStart(st.SupervisorPID) == st.SupervisorStart
}
