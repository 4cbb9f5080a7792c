package broker

import (
	"maps"
	"slices"
	"strings"
	"testing"
)

// TestForwardedHeadersCanonicalAndSigned: the workload-influenced headers
// reach the provider only in their canonical form, and exactly those
// headers (name and value) are in the signed pre-effect record. Spacing,
// order and unknown values cannot carry bits past the record.
func TestForwardedHeadersCanonicalAndSigned(t *testing.T) {
	h := newHarness(t, 100)
	const (
		think = "interleaved-thinking-2025-05-14"
		cache = "prompt-caching-2024-07-31"
	)
	tests := []struct {
		name    string
		headers []string
		want    map[string]string // forwarded and recorded; nil: none
	}{
		{"no anthropic headers", nil, nil},
		{"version", []string{"Anthropic-Version: 2023-06-01"}, map[string]string{"anthropic-version": "2023-06-01"}},
		{"one beta", []string{"Anthropic-Beta: " + think}, map[string]string{"anthropic-beta": think}},
		{"whitespace-stuffed betas", []string{"Anthropic-Beta: " + think + " \t ,\t    " + cache},
			map[string]string{"anthropic-beta": think + "," + cache}},
		{"betas in another order", []string{"Anthropic-Beta: " + cache + "," + think},
			map[string]string{"anthropic-beta": think + "," + cache}},
		{"both", []string{"Anthropic-Version: 2023-01-01", "Anthropic-Beta: " + cache},
			map[string]string{"anthropic-version": "2023-01-01", "anthropic-beta": cache}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := h.raw(post("/v1/messages", anthropicBody, tt.headers...))
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			s := h.fp.last()
			for _, name := range []string{"anthropic-version", "anthropic-beta"} {
				if got, want := s.header.Get(name), tt.want[name]; got != want || len(s.header.Values(name)) > 1 {
					t.Errorf("provider got %s %q, want %q", name, s.header.Values(name), want)
				}
			}
			// The record the provider received (and the journal holds).
			p := payloadOf(t, s.preEffect)
			got := map[string]string{}
			if raw, ok := p["headers"]; ok {
				m, ok := raw.(map[string]any)
				if !ok || len(m) == 0 {
					t.Fatalf("record headers = %v, want a non-empty object or absent", raw)
				}
				for k, v := range m {
					got[k] = v.(string)
				}
			}
			want := tt.want
			if want == nil {
				want = map[string]string{}
			}
			if !maps.Equal(got, want) {
				t.Errorf("signed record headers = %v, want %v", got, want)
			}
		})
	}
	h.j.verifyAll(t)
}

// TestHeaderRefusals: values that are not canonical and cannot be made so
// are refused with a message that says what to send; nothing reaches the
// provider.
func TestHeaderRefusals(t *testing.T) {
	h := newHarness(t, 100)
	tests := []struct {
		name, header string
		reason       Reason
		msg          string
	}{
		{"unknown beta", "Anthropic-Beta: files-api-2025-04-14", ReasonBetaNotAllowed, "is not allowed (allowed:"},
		{"beta with a suffix", "Anthropic-Beta: interleaved-thinking-2025-05-14x", ReasonBetaNotAllowed, "is not allowed"},
		{"beta in upper case", "Anthropic-Beta: INTERLEAVED-THINKING-2025-05-14", ReasonBetaNotAllowed, "is not allowed"},
		{"empty element", "Anthropic-Beta: interleaved-thinking-2025-05-14,,prompt-caching-2024-07-31", ReasonBadHeaderValue, "single commas"},
		{"trailing comma", "Anthropic-Beta: interleaved-thinking-2025-05-14,", ReasonBadHeaderValue, "single commas"},
		{"beta twice", "Anthropic-Beta: prompt-caching-2024-07-31,prompt-caching-2024-07-31", ReasonBadHeaderValue, "twice"},
		{"unknown version date", "Anthropic-Version: 2024-99-99", ReasonBadHeaderValue, "2023-06-01"},
		{"version with a suffix", "Anthropic-Version: 2023-06-01x", ReasonBadHeaderValue, "not one moat forwards"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := h.fp.count()
			r := h.raw(post("/v1/messages", anthropicBody, tt.header))
			if r.status != 400 || Reason(r.header.Get("Moat-Reason")) != tt.reason || !strings.Contains(r.body, tt.msg) {
				t.Errorf("status %d reason %s body %s; want 400 %s saying %q", r.status, r.header.Get("Moat-Reason"), r.body, tt.reason, tt.msg)
			}
			if rec := h.lastRecord(); rec["reason"] != string(tt.reason) {
				t.Errorf("journal: last record %v, want a refusal with reason %s", rec, tt.reason)
			}
			if h.fp.count() != before {
				t.Errorf("the refused request reached the provider")
			}
		})
	}
	h.mustSucceed() // positive control in the same setup
}

// FuzzCanonicalBetas: whatever the header holds, an accepted value is
// forwarded in the one canonical form: allowed names only, each once, in
// allowedBetas order, joined by "," alone; and that form maps to itself.
func FuzzCanonicalBetas(f *testing.F) {
	for _, s := range []string{"interleaved-thinking-2025-05-14", "prompt-caching-2024-07-31 ,\tinterleaved-thinking-2025-05-14",
		"a,,b", ",", "", "context-1m-2025-08-07,context-1m-2025-08-07", "files-api-2025-04-14"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		out, fe := canonicalBetas("anthropic-beta", v)
		if fe != nil {
			if out != "" {
				t.Errorf("refused %q but returned %q", v, out)
			}
			return
		}
		names := strings.Split(out, ",")
		last := -1
		for _, n := range names {
			i := slices.Index(allowedBetas, n)
			if i <= last {
				t.Fatalf("canonical form %q of %q: %q unknown, repeated or out of order", out, v, n)
			}
			last = i
		}
		if again, fe := canonicalBetas("anthropic-beta", out); fe != nil || again != out {
			t.Errorf("canonical form %q is not a fixed point: %q, %v", out, again, fe)
		}
	})
}
