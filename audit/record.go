package audit

import (
	"fmt"
	"strconv"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/moat-sandbox/moat/confirmation"
)

// Record types. Every payload carries the common header (v, run, seq, prev,
// time, type) written by the Writer; the structs below are the type-specific
// fields that follow it.
const (
	TypeRunStarted         = "run.started"
	TypeBoundaryConfirmed  = "boundary.confirmed"
	TypeInferenceRequested = "inference.requested"
	TypeInferenceCompleted = "inference.completed"
	TypeInferenceRefused   = "inference.refused"
	TypeInferenceFailed    = "inference.failed"
	TypeProcessStarted     = "process.started"
	TypeProcessExited      = "process.exited"
	TypeProcessFailed      = "process.failed"
	TypeRunTerminated      = "run.terminated"
)

// Record is one typed journal record.
type Record interface {
	RecordType() string
}

// RunStarted is the first record of every journal.
type RunStarted struct {
	PolicySHA256 string `json:"policy_sha256"`
	Backend      string `json:"backend"`
	BinarySHA256 string `json:"binary_sha256"`
	PublicKey    string `json:"public_key"` // PEM of the run's Ed25519 public key
	// Lockfiles are the lockfiles of the policy's egress.packages as moat
	// read them before the workload started: what the run admits until
	// an operator's package.reload (absent without package grants, and
	// in journals written before they were recorded here).
	Lockfiles []PackageLockfile `json:"lockfiles,omitempty"`
}

// BoundaryConfirmed carries the measured properties; it directly follows
// run.started.
type BoundaryConfirmed struct {
	Ready      bool                    `json:"ready"`
	Properties confirmation.Properties `json:"properties"`
	Reason     string                  `json:"reason,omitempty"` // why not ready
	// Checks are the measurement's individual attempts: each violation
	// tried and each positive control, with what came of it.
	Checks []Check `json:"checks,omitempty"`
	// Limits says which resource limits the backend enforces (memory,
	// pids, open files, disk), with the reason for any it does not.
	Limits *confirmation.LimitsStatus `json:"limits,omitempty"`
}

// Check is one attempted action of the boundary measurement (package
// confirmation holds the type, which the backend contract shares).
type Check = confirmation.Check

// Attribution identifies the process that made a broker connection, or says
// why it cannot (package confirmation holds the type).
type Attribution = confirmation.Attribution

// InferenceRequested is the pre-effect record: durable before the request
// leaves. The same line travels in the Moat-Pre-Effect header.
type InferenceRequested struct {
	RequestID      string      `json:"request_id"`
	Provider       string      `json:"provider"`
	API            string      `json:"api"`
	Endpoint       string      `json:"endpoint"`
	Model          string      `json:"model"`
	BodySHA256     string      `json:"body_sha256"`
	ReservedTokens int         `json:"reserved_tokens"`
	Stream         bool        `json:"stream"`
	Attribution    Attribution `json:"attribution"`
	// Headers are the workload-influenced headers forwarded to the
	// provider: lower-case name → the canonical value sent. Absent when
	// there are none.
	Headers map[string]string `json:"headers,omitempty"`
}

// Usage is token usage as the provider reported it. The provider chooses
// these integers, so they can be anything an int holds: each is journaled
// as a JSON number when it lies in [0, MaxExactInt] and otherwise as a
// JSON string of its decimal digits (see the package doc). MarshalJSON and
// UnmarshalJSON implement that form; the writer signs exactly the value it
// was given and the verifier decodes it back unchanged.
type Usage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

// MarshalJSON writes each count as a number in [0, MaxExactInt], else as a
// decimal string.
func (u Usage) MarshalJSON() ([]byte, error) {
	b := append([]byte(nil), `{"input_tokens":`...)
	b = appendCount(b, u.InputTokens)
	b = append(b, `,"output_tokens":`...)
	b = appendCount(b, u.OutputTokens)
	return append(b, '}'), nil
}

// UnmarshalJSON accepts exactly the form MarshalJSON writes: both members,
// each a number in [0, MaxExactInt] or a decimal string outside it.
func (u *Usage) UnmarshalJSON(b []byte) error {
	var raw struct {
		InputTokens  jsontext.Value `json:"input_tokens"`
		OutputTokens jsontext.Value `json:"output_tokens"`
	}
	if err := jsonv2.Unmarshal(b, &raw, jsonv2.RejectUnknownMembers(true)); err != nil {
		return err
	}
	in, err := parseCount("input_tokens", raw.InputTokens)
	if err != nil {
		return err
	}
	out, err := parseCount("output_tokens", raw.OutputTokens)
	if err != nil {
		return err
	}
	u.InputTokens, u.OutputTokens = in, out
	return nil
}

// exactCount reports whether v is journaled as a JSON number.
func exactCount(v int) bool { return v >= 0 && int64(v) <= MaxExactInt }

func appendCount(b []byte, v int) []byte {
	if exactCount(v) {
		return strconv.AppendInt(b, int64(v), 10)
	}
	b = append(b, '"')
	b = strconv.AppendInt(b, int64(v), 10)
	return append(b, '"')
}

func parseCount(name string, v jsontext.Value) (int, error) {
	switch v.Kind() {
	case '0':
		n, err := strconv.ParseInt(string(v), 10, strconv.IntSize)
		if err != nil || !exactCount(int(n)) || strconv.FormatInt(n, 10) != string(v) {
			return 0, fmt.Errorf("usage.%s: number %s is not an integer in [0, %d]", name, v, int64(MaxExactInt))
		}
		return int(n), nil
	case '"':
		var s string
		if err := jsonv2.Unmarshal(v, &s); err != nil {
			return 0, fmt.Errorf("usage.%s: %w", name, err)
		}
		n, err := strconv.ParseInt(s, 10, strconv.IntSize)
		if err != nil || strconv.FormatInt(n, 10) != s {
			return 0, fmt.Errorf("usage.%s: string %q is not a decimal integer", name, s)
		}
		if exactCount(int(n)) {
			return 0, fmt.Errorf("usage.%s: %s is in [0, %d] and must be a number, not a string", name, s, int64(MaxExactInt))
		}
		return int(n), nil
	case 0:
		return 0, fmt.Errorf("usage.%s: missing", name)
	}
	return 0, fmt.Errorf("usage.%s: want a number or a decimal string, got %s", name, v.Kind())
}

// InferenceCompleted records a provider response passed to the worker.
type InferenceCompleted struct {
	RequestID      string `json:"request_id"`
	Status         int    `json:"status"`
	ResponseSHA256 string `json:"response_sha256"`
	ResponseBytes  int64  `json:"response_bytes"`
	Usage          Usage  `json:"usage"`
}

// InferenceRefused records a request the broker refused. It never reached a
// provider.
type InferenceRefused struct {
	RequestID   string      `json:"request_id"`
	Reason      string      `json:"reason"` // a reason code, e.g. "model_not_allowed"
	Detail      string      `json:"detail"` // the message the worker was given
	Provider    string      `json:"provider,omitempty"`
	Endpoint    string      `json:"endpoint,omitempty"`
	Attribution Attribution `json:"attribution"`
}

// InferenceFailed records a request that was sent (or about to be) and then
// failed: upstream error, withheld response, cancelled run.
type InferenceFailed struct {
	RequestID string `json:"request_id"`
	Reason    string `json:"reason"`
	Detail    string `json:"detail"`
}

// ProcessStarted records a process started inside the sandbox.
type ProcessStarted struct {
	ProcessID  string   `json:"process_id"`
	Argv       []string `json:"argv"`
	HostPID    int      `json:"host_pid"`
	Executable string   `json:"executable,omitempty"`
	SHA256     string   `json:"sha256,omitempty"`
}

// ProcessFailed records a process that could not be started: not found
// (127), not executable (126), or moat could not confine it (125; it never
// ran unconfined).
type ProcessFailed struct {
	Argv     []string `json:"argv"`
	ExitCode int      `json:"exit_code"`
	Reason   string   `json:"reason"`
}

// ProcessExited records a process's end.
type ProcessExited struct {
	ProcessID string `json:"process_id"`
	ExitCode  int    `json:"exit_code"`
	// OOMKilled: the process was killed by the kernel for using more
	// memory than the sandbox's limit (counted by the memory cgroup).
	OOMKilled bool `json:"oom_killed,omitempty"`
}

// RunTerminated is the terminal record.
type RunTerminated struct {
	Reason   TerminalReason `json:"reason"`
	ExitCode int            `json:"exit_code"`
	Counts   Counts         `json:"counts"`
}

// TerminalReason is run.terminated's reason: how the run ended. The
// package doc lists them with the exit code that goes with each. The
// verifier checks the record's form, not which reason it names, so a
// journal from a later moat with a reason not listed here still verifies.
type TerminalReason string

// Terminal reasons.
const (
	// ReasonCompleted: the workload exited on its own.
	ReasonCompleted TerminalReason = "completed"
	// ReasonExecFailed: the command could not be started (126 or 127).
	ReasonExecFailed TerminalReason = "exec_failed"
	// ReasonRefused: moat refused before the workload started.
	ReasonRefused TerminalReason = "refused"
	// ReasonFailed: moat itself failed.
	ReasonFailed TerminalReason = "failed"
	// ReasonCancelled: the broker stopped all effects.
	ReasonCancelled TerminalReason = "cancelled"
	// ReasonRefusalLimit: more refusals than inference.max_refusals.
	ReasonRefusalLimit TerminalReason = "refusal_limit"
	// ReasonJournalLimit: the journal reached audit.max_bytes.
	ReasonJournalLimit TerminalReason = "journal_limit"
	// ReasonDeleted: a `moat sandbox` was deleted.
	ReasonDeleted TerminalReason = "deleted"
	// ReasonTerminated: moat got SIGTERM, SIGINT or SIGHUP.
	ReasonTerminated TerminalReason = "terminated"
	// ReasonSandboxLost: the sandbox ended from outside moat (a
	// kubernetes Pod deleted, evicted or failed; boundary.Ending).
	ReasonSandboxLost TerminalReason = "sandbox_lost"
)

// Counts summarize a run in its terminal record.
type Counts struct {
	Requested int `json:"requested"`
	Completed int `json:"completed"`
	Refused   int `json:"refused"`
	Failed    int `json:"failed"`
	Processes int `json:"processes"`
	// Tools counts the tool records; the member is absent when the run
	// had none, so that a run without tools keeps the counts it had
	// before tools existed.
	Tools ToolCounts `json:"tools,omitzero"`
}

// ToolCounts are the numbers of tool.requested, tool.completed,
// tool.refused and tool.failed records (tool.go).
type ToolCounts struct {
	Requested int `json:"requested"`
	Completed int `json:"completed"`
	Refused   int `json:"refused"`
	Failed    int `json:"failed"`
}

func (RunStarted) RecordType() string         { return TypeRunStarted }
func (BoundaryConfirmed) RecordType() string  { return TypeBoundaryConfirmed }
func (InferenceRequested) RecordType() string { return TypeInferenceRequested }
func (InferenceCompleted) RecordType() string { return TypeInferenceCompleted }
func (InferenceRefused) RecordType() string   { return TypeInferenceRefused }
func (InferenceFailed) RecordType() string    { return TypeInferenceFailed }
func (ProcessStarted) RecordType() string     { return TypeProcessStarted }
func (ProcessExited) RecordType() string      { return TypeProcessExited }
func (ProcessFailed) RecordType() string      { return TypeProcessFailed }
func (RunTerminated) RecordType() string      { return TypeRunTerminated }
