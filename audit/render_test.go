package audit

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/confirmation"
)

// renderJournal writes a small journal: a run with a confirmed boundary,
// one completed and one refused request, and the end.
func renderJournal(t *testing.T) []byte {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "run")
	w, err := Create(dir, "run-render")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []Record{
		RunStarted{PolicySHA256: strings.Repeat("a", 64), Backend: "native", BinarySHA256: strings.Repeat("b", 64), PublicKey: string(w.PublicKeyPEM())},
		BoundaryConfirmed{Ready: true, Properties: confirmation.Properties{
			FilesystemConfinement: confirmation.EnforcedProperty{Enforced: true, Mechanism: "landlock"}}},
		InferenceRequested{RequestID: "r1", Provider: "anthropic", Endpoint: "/v1/messages", Model: "m",
			Attribution: Attribution{Status: confirmation.AttributionResolved, PID: 7, Executable: "/bin/agent"}},
		InferenceCompleted{RequestID: "r1", Status: 200, ResponseBytes: 10},
		InferenceRefused{RequestID: "r2", Reason: "model_not_allowed", Detail: `a "b"`,
			Attribution: Attribution{Status: confirmation.AttributionUnavailable, Reason: "test"}},
		RunTerminated{Reason: ReasonCompleted},
	} {
		if _, err := w.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, JournalFile))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestWriteTimeline(t *testing.T) {
	j := renderJournal(t)
	// A line that is not a record, and a torn tail after it.
	j = append(j, []byte("{\"not\":\"a record\"}\n{\"torn")...)
	var out bytes.Buffer
	WriteTimeline(&out, j)
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	want := []string{
		`^   \S+ +1  run\.started +backend=native policy=aaaaaaaaaaaa binary=bbbbbbbbbbbb$`,
		`^   \S+ +2  boundary\.confirmed +ready=true fs=landlock egress=NOT-ENFORCED attribution=NOT-ENFORCED privilege=NOT-ENFORCED$`,
		`^   \S+ +3  inference\.requested +id=r1 anthropic /v1/messages model=m stream=false reserved=0 pid=7 exe=/bin/agent$`,
		`^   \S+ +4  inference\.completed +id=r1 status=200 bytes=10 tokens=0/0$`,
		`^!! \S+ +5  REFUSED inference\.refused +id=r2 reason=model_not_allowed attribution=unavailable\(test\) detail="a \\"b\\""$`,
		`^   \S+ +6  run\.terminated +reason=completed exit=0 requested=1 completed=1 refused=1 failed=0 processes=0$`,
		`^!! +7  UNREADABLE: `,
		`^ +8  \(torn tail of 6 bytes: a write cut short\)$`,
	}
	if len(lines) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%s", len(lines), len(want), out.String())
	}
	for i, w := range want {
		if !regexp.MustCompile(w).MatchString(lines[i]) {
			t.Errorf("line %d: got %q, want it to match %s", i+1, lines[i], w)
		}
	}
}

func TestPayloads(t *testing.T) {
	j := renderJournal(t)
	recs, err := Payloads(j)
	if err != nil || len(recs) != 6 {
		t.Fatalf("got %d payloads, %v; want 6, nil", len(recs), err)
	}
	if !bytes.Contains(recs[0], []byte(`"type":"run.started"`)) {
		t.Errorf("first payload %s is not run.started", recs[0])
	}
	// A bad line is reported by number; the lines after it still count; a
	// torn tail does not.
	bad := append([]byte("garbage\n"), j...)
	recs, err = Payloads(append(bad, "{\"torn"...))
	if err == nil || !strings.HasPrefix(err.Error(), "line 1: ") || len(recs) != 6 {
		t.Fatalf("got %d payloads, %v; want 6 and a line 1 error", len(recs), err)
	}
}

func TestDescribeArgvCapped(t *testing.T) {
	got := Describe(ProcessStarted{ProcessID: "p1", HostPID: 3, Argv: []string{strings.Repeat("x", 300)}})
	if !strings.HasSuffix(got, "…]") || len(got) > maxShownArgv+40 {
		t.Fatalf("got %q (%d bytes), want the argv cut at %d bytes", got, len(got), maxShownArgv)
	}
}
