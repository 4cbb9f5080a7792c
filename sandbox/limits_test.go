package sandbox

import (
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/policy"
)

func TestLimitsVerdict(t *testing.T) {
	def := policy.Limits{Memory: policy.DefaultMemory, Pids: policy.DefaultPids}
	none := boundary.LimitsStatus{Detail: "moat is not root"}
	both := boundary.LimitsStatus{Memory: true, Pids: true}
	for _, tc := range []struct {
		name      string
		want      policy.Limits
		got       boundary.LimitsStatus
		msg, warn string
	}{
		{"defaults enforced", def, both, "", ""},
		{"defaults not enforced: a warning", def, none, "", "default memory and pids limit is not enforced here (moat is not root)"},
		{"a written limit not enforced: refused", policy.Limits{Memory: 1 << 30, Pids: policy.DefaultPids}, none, "process.limits memory 1Gi cannot be enforced here", ""},
		{"required: defaults refused", policy.Limits{Memory: policy.DefaultMemory, Pids: policy.DefaultPids, Required: true}, none, "memory 512Mi, pids 256", ""},
		{"a written limit enforced", policy.Limits{Memory: 1 << 30, Pids: 64}, both, "", ""},
		{"no limits at all", policy.Limits{}, none, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg, warn := limitsVerdict(tc.want, tc.got)
			if (tc.msg == "") != (msg == "") || !strings.Contains(msg, tc.msg) {
				t.Errorf("refusal %q, want one containing %q", msg, tc.msg)
			}
			if (tc.warn == "") != (warn == "") || !strings.Contains(warn, tc.warn) {
				t.Errorf("warning %q, want one containing %q", warn, tc.warn)
			}
		})
	}
}
