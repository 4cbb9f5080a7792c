package wire

import (
	"strings"
	"testing"
)

// TestBugIsInternal: a schema node that is not valid (moat's bug) refuses
// with ReasonInternal, not with a code that blames the client; the
// control, a valid node given a wrong value, blames the value.
func TestBugIsInternal(t *testing.T) {
	r := (&node{}).validateRaw(&rawWalker{}, []byte(`"x"`))
	if r == nil || r.Code != ReasonInternal || !strings.Contains(r.Message, "BUG") {
		t.Errorf("invalid node: %+v, want %s", r, ReasonInternal)
	}
	r = str().validateRaw(&rawWalker{}, []byte("true"))
	if r == nil || r.Code != ReasonInvalidValue {
		t.Errorf("string node given a boolean: %+v, want %s", r, ReasonInvalidValue)
	}
}
