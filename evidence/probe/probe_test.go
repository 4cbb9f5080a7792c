package probe

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
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
	var mu sync.Mutex
	var bodies []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		mu.Unlock()
		w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	t.Setenv("ANTHROPIC_BASE_URL", srv.URL)
	for _, name := range []string{"unapproved-model", "malformed-json", "twenty-signed-requests"} {
		bodies = nil
		var out bytes.Buffer
		Main([]string{"--model", "m", "--openai-model", "o", name}, &out)
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
