package kubeopt

import (
	"strings"
	"testing"
)

func TestObjectName(t *testing.T) {
	a57 := strings.Repeat("a", 57)
	for in, want := range map[string]string{
		"20261201T043217Z-abcdef012345": "moat-20261201t043217z-abcdef012345",
		"doctor-X_y":                    "moat-doctor-x-y",
		strings.Repeat("a", 80):         "moat-" + strings.Repeat("a", 58),
		a57 + "--b":                     "moat-" + a57, // cut to 63 bytes, trailing '-' dropped
		a57 + "_b":                      "moat-" + a57,
		a57 + "X":                       "moat-" + a57 + "x",
	} {
		if got := ObjectName(in); got != want {
			t.Errorf("ObjectName(%q) = %q, want %q", in, got, want)
		}
	}
}
