package kubernetes

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/go-json-experiment/json"
)

// TestStageConfig: what start encodes, the stage decodes; each defect is
// refused.
func TestStageConfig(t *testing.T) {
	good := stageConfig{ID: "p12", Argv: []string{"/bin/sh", "-c", "x"}, Env: []string{"A=b=c", "PATH=/bin"}, Dir: "/srv/ws"}
	b, _ := json.Marshal(good)
	got, err := decodeStageConfig(string(b))
	if err != nil || !reflect.DeepEqual(got, good) {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	for _, bad := range []string{
		``, `{}`, `[]`, `{"id":"p1","argv":[],"env":[],"dir":"/"}`,
		`{"id":"p1","argv":[""],"env":[],"dir":"/"}`,
		`{"id":"1","argv":["x"],"env":[],"dir":"/"}`, `{"id":"p0","argv":["x"],"env":[],"dir":"/"}`,
		`{"id":"p01","argv":["x"],"env":[],"dir":"/"}`, `{"id":"p-1","argv":["x"],"env":[],"dir":"/"}`,
		`{"id":"p1","argv":["x"],"env":[],"dir":"rel"}`, `{"id":"p1","argv":["x"],"env":[],"dir":"/a/../b"}`,
		`{"id":"p1","argv":["x"],"env":["NOEQUALS"],"dir":"/"}`, `{"id":"p1","argv":["x"],"env":["=v"],"dir":"/"}`,
		`{"id":"p1","argv":["x\u0000y"],"env":[],"dir":"/"}`,
		`{"id":"p1","argv":["x"],"env":[],"dir":"/","extra":1}`,
		`{"id":"p1","argv":["x"],"env":[],"dir":"/"` + strings.Repeat(" ", maxStageConfigBytes) + `}`,
	} {
		if _, err := decodeStageConfig(bad); err == nil {
			t.Errorf("accepted %.80q", bad)
		}
	}
}

// FuzzStageConfig: no input panics; an accepted configuration is valid
// and encodes back to one that decodes the same.
func FuzzStageConfig(f *testing.F) {
	f.Add(`{"id":"p1","argv":["/bin/true"],"env":["PATH=/bin"],"dir":"/"}`)
	f.Add(`{"id":"p1","argv":[],"env":null,"dir":""}`)
	f.Fuzz(func(t *testing.T, s string) {
		cfg, err := decodeStageConfig(s)
		if err != nil {
			return
		}
		if len(cfg.Argv) == 0 || !validID(cfg.ID) {
			t.Fatalf("accepted %+v", cfg)
		}
		b, err := json.Marshal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		again, err := decodeStageConfig(string(b))
		if err != nil || again.ID != cfg.ID || again.Dir != cfg.Dir || !slices.Equal(again.Argv, cfg.Argv) || !slices.Equal(again.Env, cfg.Env) {
			t.Fatalf("re-decoding %s: %+v %v", b, again, err)
		}
	})
}
