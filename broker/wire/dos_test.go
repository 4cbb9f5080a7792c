package wire

import (
	"strings"
	"testing"
	"time"
)

// orderBody returns a chat request with 2^bits extra top-level members
// (refused as unknown_field once their names are checked) whose names
// are bits characters each, U+10000 or U+E000. Canonical (UTF-16) order
// sorts U+10000 first, UTF-8 byte order U+E000 first, so when reversed
// is set the names arrive, in canonical order, in exactly the reverse of
// their byte order; otherwise the two orders agree (the control).
func orderBody(bits int, reversed bool) []byte {
	lo, hi := "\U00010000", "\uE000" // lo < hi in UTF-16, hi < lo in UTF-8
	if !reversed {
		lo, hi = "\u4E00", "\U00010000" // lo < hi in both, and the same sizes
	}
	var sb strings.Builder
	sb.WriteString(`{"messages":[{"content":"hi","role":"user"}],"model":"gpt-4.1"`)
	for i := 0; i < 1<<bits; i++ {
		sb.WriteString(`,"x`)
		for j := bits - 1; j >= 0; j-- {
			if i>>j&1 == 0 {
				sb.WriteString(lo)
			} else {
				sb.WriteString(hi)
			}
		}
		sb.WriteString(`":0`)
	}
	sb.WriteString("}")
	return []byte(sb.String())
}

// TestAdmitMemberOrderNotQuadratic: admission sorts an object's members
// by their decoded names before it checks them. An insertion sort there
// made an object whose names come in reverse byte order quadratic (0.8 s
// for 885 KB here, minutes for a 32 MiB body: a denial of service by one
// request). The reversed body must cost about what the same number of
// names in agreeing order costs (the control, same size).
func TestAdmitMemberOrderNotQuadratic(t *testing.T) {
	bits := 15 // 32,768 names, about 1.9 MB
	if testing.Short() {
		bits = 13
	}
	ep := Endpoints(APIOpenAIChat)[0]
	timeAdmit := func(body []byte) time.Duration {
		best := time.Duration(1 << 62)
		for range 3 {
			start := time.Now()
			_, ref := Admit(APIOpenAIChat, ep, body, testLimits)
			d := time.Since(start)
			if ref == nil || ref.Code != ReasonUnknownField {
				t.Fatalf("got %v, want an unknown_field refusal", ref)
			}
			best = min(best, d)
		}
		return best
	}
	bad, ctl := orderBody(bits, true), orderBody(bits, false)
	if len(bad) != len(ctl) {
		t.Fatalf("bodies of %d and %d bytes: not comparable", len(bad), len(ctl))
	}
	tc, tb := timeAdmit(ctl), timeAdmit(bad)
	t.Logf("%d names, %d bytes: agreeing order %v, reversed %v", 1<<bits, len(bad), tc, tb)
	if tb > 8*tc+50*time.Millisecond {
		t.Errorf("reversed member order took %v, agreeing order %v: admission is super-linear in the number of members", tb, tc)
	}
}
