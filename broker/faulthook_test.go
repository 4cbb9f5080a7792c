package broker

import (
	"strings"
	"testing"
)

// TestFaultStageCheck: the hook's variables as a hooks build reads them;
// a valid setting is the control.
func TestFaultStageCheck(t *testing.T) {
	tests := []struct {
		stage, marker, skip string
		want                string // "" accepted
	}{
		{"", "", "", ""},
		{FaultPreDurable, "/tmp/m", "", ""},
		{FaultPreSend, "/tmp/m", "1", ""},
		{FaultPreComplete, "/tmp/m", "0", ""},
		{"pre-nothing", "/tmp/m", "", "is not a stage"},
		{FaultPreSend, "", "", "without " + FaultMarkerEnv},
		{FaultPreSend, "/tmp/m", "-1", "want a count"},
		{FaultPreSend, "/tmp/m", "01", "want a count"},
		{FaultPreSend, "/tmp/m", "1x", "want a count"},
	}
	for _, tt := range tests {
		t.Setenv(FaultStageEnv, tt.stage)
		t.Setenv(FaultMarkerEnv, tt.marker)
		t.Setenv(FaultSkipEnv, tt.skip)
		err := checkFaultStage()
		if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("stage %q marker %q skip %q: %v, want %q", tt.stage, tt.marker, tt.skip, err, tt.want)
		}
	}
}

// TestCheckFaultHooks: a build without the moat_test_hooks tag (this
// test's, in CI) refuses when any of the hook's variables is set, even
// empty, and accepts none set (the control). A hooks build accepts a
// valid setting.
func TestCheckFaultHooks(t *testing.T) {
	if err := CheckFaultHooks(); err != nil {
		t.Fatalf("no variable set: %v", err)
	}
	if FaultHooksBuilt {
		t.Setenv(FaultStageEnv, FaultPreSend)
		t.Setenv(FaultMarkerEnv, "/tmp/m")
		if err := CheckFaultHooks(); err != nil {
			t.Fatalf("hooks build, valid setting: %v", err)
		}
		return
	}
	for _, name := range []string{FaultStageEnv, FaultMarkerEnv, FaultSkipEnv} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(name, "")
			if err := CheckFaultHooks(); err == nil || !strings.Contains(err.Error(), name+" set") || !strings.Contains(err.Error(), "moat_test_hooks") {
				t.Fatalf("normal build with %s set: %v, want a refusal naming it and the tag", name, err)
			}
		})
	}
}
