package policy

import (
	"strings"
	"testing"
	"time"
)

// TestSupervisorTimeout: process.supervisor_timeout defaults to 10s,
// decodes a valid duration, and each mistake is reported at its key path.
func TestSupervisorTimeout(t *testing.T) {
	f := newFixture(t)
	if p, pe := f.parse(t, "version: 1\n"); pe != nil || p.Process.SupervisorWait() != 10*time.Second {
		t.Fatalf("default: %v %+v", pe, p)
	}
	if p, pe := f.parse(t, "version: 1\nprocess: {supervisor_timeout: 2s}\n"); pe != nil || p.Process.SupervisorWait() != 2*time.Second {
		t.Fatalf("2s: %v %+v", pe, p)
	}
	if got := (Process{SupervisorTimeout: Duration(3 * time.Second)}).ExplainSupervisorTimeout(); !strings.HasPrefix(got, "process.supervisor_timeout 3s: ") {
		t.Errorf("explain: got %q", got)
	}
	if (Process{}).SupervisorWait() != 10*time.Second {
		t.Errorf("zero value: want the default")
	}
	for _, c := range []struct{ y, want string }{
		{"process: {supervisor_timeout: 5}", "process.supervisor_timeout: want a string"},
		{"process: {supervisor_timeout: 500ms}", "process.supervisor_timeout: 500ms is out of range [1s, 1h0m0s]"},
		{"process: {supervisor_timeout: 2h}", "process.supervisor_timeout: 2h0m0s is out of range"},
		{"process: {supervisor_timeout: -1s}", "process.supervisor_timeout: -1s is out of range"},
		{"process: {supervisor_timeout: never}", `process.supervisor_timeout: "never" is not a duration`},
	} {
		_, pe := f.parse(t, "version: 1\n"+c.y+"\n")
		if pe == nil || !strings.Contains(pe.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", c.y, pe, c.want)
		}
	}
}

// TestDurationJSON: a Duration reads back the JSON it writes; anything
// but a Go duration string is refused.
func TestDurationJSON(t *testing.T) {
	d := Duration(1500 * time.Millisecond)
	b, err := d.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	var got Duration
	if err := got.UnmarshalJSON(b); err != nil || got != d {
		t.Fatalf("round trip of %s: got %s, %v", b, got, err)
	}
	for _, bad := range []string{`10`, `"soon"`, `null`, `{}`} {
		var x Duration
		if err := x.UnmarshalJSON([]byte(bad)); err == nil {
			t.Errorf("%s: accepted as %s", bad, x)
		}
	}
}
