package audit

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/confirmation"
)

// testJournal is a real journal with every record type, and the key that
// signed it (tests need the private key to forge well-signed bad lines).
type testJournal struct {
	raw   []byte
	lines [][]byte
	pub   ed25519.PublicKey
	priv  ed25519.PrivateKey
	w     *Writer
}

func newTestWriter(t testing.TB) (*Writer, ed25519.PrivateKey) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	w, err := create(dir, "20261129T083000Z-0123456789ab", priv, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w, priv
}

// sampleRecords are the records after run.started, one of each type.
func sampleRecords() []Record {
	attr := Attribution{Status: confirmation.AttributionResolved, PID: 4242, Executable: "/usr/bin/python3", SHA256: strings.Repeat("c", 64)}
	return []Record{
		BoundaryConfirmed{Ready: true, Properties: confirmation.Properties{
			FilesystemConfinement: confirmation.EnforcedProperty{Enforced: true, Mechanism: "mountns+landlock-v7"},
			EgressInterception:    confirmation.EnforcedProperty{Enforced: true, Mechanism: "netns-loopback+seccomp"},
			RequestAttribution:    confirmation.EnforcedProperty{Enforced: true, Mechanism: "procfs-socket-inode"},
			PrivilegeFloor:        confirmation.EnforcedProperty{Enforced: true, Mechanism: "userns+no_new_privs+seccomp"},
		}},
		ProcessStarted{ProcessID: "p1", Argv: []string{"python3", "agent.py", "--task", "ünïcode <&>"}, HostPID: 4242},
		InferenceRequested{RequestID: "r1", Provider: "anthropic", API: "anthropic-messages", Endpoint: "/v1/messages",
			Model: "claude-sonnet-4-5", BodySHA256: strings.Repeat("d", 64), ReservedTokens: 1024, Attribution: attr},
		InferenceCompleted{RequestID: "r1", Status: 200, ResponseSHA256: strings.Repeat("e", 64), ResponseBytes: 1234,
			Usage: Usage{InputTokens: 10, OutputTokens: 20}},
		InferenceRefused{RequestID: "r2", Reason: "model_not_allowed", Detail: `moat: refused: model "gpt-x" is not allowed by policy (allowed: claude-sonnet-4-5)`,
			Provider: "anthropic", Attribution: attr},
		InferenceRequested{RequestID: "r3", Provider: "openai", API: "openai-chat", Endpoint: "/v1/chat/completions",
			Model: "gpt-4o", BodySHA256: strings.Repeat("f", 64), ReservedTokens: 512, Stream: true,
			Attribution: Attribution{Status: confirmation.AttributionUnavailable, Reason: "endpoint-only backend"}},
		InferenceFailed{RequestID: "r3", Reason: "upstream_error", Detail: "moat: upstream: connection reset"},
		ProcessExited{ProcessID: "p1", ExitCode: 3},
	}
}

func runStarted(w *Writer) RunStarted {
	return RunStarted{PolicySHA256: strings.Repeat("a", 64), Backend: "native",
		BinarySHA256: strings.Repeat("b", 64), PublicKey: string(w.PublicKeyPEM())}
}

// buildJournal writes a complete journal of 10 lines.
func buildJournal(t testing.TB) testJournal {
	t.Helper()
	w, priv := newTestWriter(t)
	lines := appendAll(t, w, append(append([]Record{runStarted(w)}, sampleRecords()...), RunTerminated{Reason: ReasonCompleted, ExitCode: 3})...)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(w.JournalPath())
	if err != nil {
		t.Fatal(err)
	}
	return testJournal{raw: raw, lines: lines, pub: w.PublicKey(), priv: priv, w: w}
}

func joinLines(lines [][]byte) []byte {
	var b bytes.Buffer
	for _, l := range lines {
		b.Write(l)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// signLine makes an envelope line for payload, signed with priv.
func signLine(priv ed25519.PrivateKey, payload []byte) []byte {
	pub := priv.Public().(ed25519.PublicKey)
	return appendEnvelope(nil, payload, KeyID(pub), ed25519.Sign(priv, PAE(PayloadType, payload)))
}
