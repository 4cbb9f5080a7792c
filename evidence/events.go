package evidence

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/moat-sandbox/moat/evidence/probe"
)

// Markers the probe puts into its requests. The provider and receivers
// never interpret them; ObserveCase finds them in the raw events.
const (
	// AttackMarker is placed only where a refusal must stop it (a refused
	// body, a worker header, a query credential, a direct connection).
	AttackMarker = probe.AttackMarker
	// ControlPrefix precedes a useful-work label in a request body.
	ControlPrefix = probe.ControlPrefix
	// Canary is the synthetic data canary of allowed-inference-canary.
	Canary = probe.Canary
	// RedactedCredential replaces a synthetic credential wherever the
	// controller writes something that might hold one.
	RedactedCredential = "[REDACTED-SYNTHETIC-CREDENTIAL]"
	// MaxEventsBytes caps an events file read by the verifier.
	MaxEventsBytes = 64 << 20
)

// ProviderEvent is what the synthetic provider persisted about one request,
// before answering it.
type ProviderEvent struct {
	N               int               `json:"n"` // arrival order, from 1
	Time            string            `json:"time"`
	Method          string            `json:"method"`
	Path            string            `json:"path"`
	Query           string            `json:"query"`
	Headers         map[string]string `json:"headers"` // lower-case names; synthetic credentials redacted
	Body            []byte            `json:"body"`    // the exact bytes received
	BodySHA256      string            `json:"body_sha256"`
	PreEffect       string            `json:"pre_effect"` // the decoded Moat-Pre-Effect line
	NativeVerified  bool              `json:"native_verified"`
	OpenSSLVerified bool              `json:"openssl_verified"`
	Detail          string            `json:"detail,omitempty"` // why not verified
	CredentialOK    bool              `json:"credential_ok"`    // exactly the synthetic credential, in the API's header
	Response        string            `json:"response"`         // normal | redirect | reflect | refused
}

// ReceiverEvent is one delivery a host receiver observed.
type ReceiverEvent struct {
	Receiver string `json:"receiver"` // tcp | udp | abstract | unix | unixgram | redirect
	Kind     string `json:"kind"`     // control (sent by the controller) | hit
	Time     string `json:"time"`
	Bytes    int    `json:"bytes"`
	SHA256   string `json:"sha256"`
}

// eventLog appends JSON lines to a file and syncs each one.
type eventLog struct {
	mu sync.Mutex
	f  *os.File
}

func openEventLog(path string) (*eventLog, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &eventLog{f: f}, nil
}

func (l *eventLog) append(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := l.f.Write(append(b, '\n')); err != nil {
		return err
	}
	return l.f.Sync()
}

func (l *eventLog) close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Close()
}

// readJSONLines decodes a JSON Lines file strictly (unknown fields refused).
// A missing file is reported with os.ErrNotExist.
func readJSONLines[T any](path string) ([]T, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.Size() > MaxEventsBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, MaxEventsBytes)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []T
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), MaxEventsBytes)
	for n := 1; sc.Scan(); n++ {
		var v T
		d := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		d.DisallowUnknownFields()
		if err := d.Decode(&v); err != nil {
			return nil, fmt.Errorf("%s line %d: %w", path, n, err)
		}
		if d.More() {
			return nil, fmt.Errorf("%s line %d: trailing data", path, n)
		}
		out = append(out, v)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

var errNoKey = errors.New("no run key pinned yet")
