package probe

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/fakeprovider"
)

// The probe always ends with its loud claims, whatever happened.
func TestProbeAlwaysClaims(t *testing.T) {
	defer func(d time.Duration) { markerWait = d }(markerWait)
	markerWait = 100 * time.Millisecond
	for _, args := range [][]string{nil, {"--bogus"}, {"no-such-case"}, {"--marker", "/nonexistent/never", "direct-network"}} {
		var out bytes.Buffer
		if code := Main(args, &out); code != 0 {
			t.Errorf("%v: exit %d, want 0", args, code)
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if lines[len(lines)-1] != ClaimsLine {
			t.Errorf("%v: last line %q, want the claims", args, lines[len(lines)-1])
		}
	}
}

// Each case's requests reach a (fake) broker, with the control labels
// before and after the attacks.
func TestProbeCasesTalkToBroker(t *testing.T) {
	srv, err := fakeprovider.Start(fakeprovider.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	t.Setenv("ANTHROPIC_BASE_URL", srv.URL)
	for _, name := range []string{"unapproved-model", "malformed-json", "twenty-signed-requests"} {
		before := srv.Count()
		var out bytes.Buffer
		Main([]string{"--model", "m", "--openai-model", "o", name}, &out)
		var bodies []string
		for _, r := range srv.Requests()[before:] {
			bodies = append(bodies, string(r.Body))
		}
		all := strings.Join(bodies, "\n")
		if name == "twenty-signed-requests" {
			if n := strings.Count(all, ControlPrefix+"seq-"); n != 20 {
				t.Errorf("%s: %d seq requests, want 20", name, n)
			}
			continue
		}
		if !strings.HasPrefix(bodies[0], `{"max_tokens"`) || !strings.Contains(bodies[0], ControlPrefix+"before") {
			t.Errorf("%s: first request %q is not the before control", name, bodies[0])
		}
		if !strings.Contains(bodies[len(bodies)-1], ControlPrefix+"after") {
			t.Errorf("%s: last request %q is not the after control", name, bodies[len(bodies)-1])
		}
		if !strings.Contains(all, AttackMarker) {
			t.Errorf("%s: no attack was sent", name)
		}
	}
}
