package kubernetes

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/go-json-experiment/json"

	"github.com/moat-sandbox/moat/boundary"
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

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestStageFrame: the frame start encodes is read back whole and not a
// byte further; a configuration over the bound is refused at start.
func TestStageFrame(t *testing.T) {
	cfg := stageConfig{ID: "p2", Argv: []string{"x"}, Env: []string{"K=v"}, Dir: "/", Stdin: true}
	f, err := encodeStageFrame(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := bytes.NewReader(append(slices.Clone(f), "rest"...))
	got, raw, err := readStageFrame(r)
	if err != nil || !reflect.DeepEqual(got, cfg) || !bytes.Equal(raw, f) {
		t.Fatalf("%+v %q %v", got, raw, err)
	}
	if rest, _ := io.ReadAll(r); string(rest) != "rest" {
		t.Errorf("the workload's stdin after the frame: %q", rest)
	}
	cfg.Env = []string{"K=" + strings.Repeat("v", maxStageConfigBytes)}
	var se *boundary.StartError
	if _, err := encodeStageFrame(cfg); !errors.As(err, &se) || se.Code != boundary.ExitRefused {
		t.Errorf("oversized configuration: %v", err)
	}
}

// FuzzStageFrame: no input panics; an accepted frame was read to its
// end and not past it (the rest is the workload's stdin, untouched), is
// a valid configuration, and encodes back to a frame that reads the same.
func FuzzStageFrame(f *testing.F) {
	good, _ := encodeStageFrame(stageConfig{ID: "p1", Argv: []string{"/bin/true"}, Env: []string{"PATH=/bin"}, Dir: "/", Stdin: true})
	f.Add(append(slices.Clone(good), "stdin"...))
	f.Add([]byte(stageMagic + "\x00\x00\x00\x02{}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		cfg, raw, err := readStageFrame(r)
		if err != nil {
			return
		}
		if !bytes.Equal(raw, b[:len(raw)]) || r.Len() != len(b)-len(raw) || len(raw) > stageHeaderLen+maxStageConfigBytes {
			t.Fatalf("read %d bytes, frame %d, of %d", len(b)-r.Len(), len(raw), len(b))
		}
		if len(cfg.Argv) == 0 || !validID(cfg.ID) {
			t.Fatalf("accepted %+v", cfg)
		}
		again, err := encodeStageFrame(cfg)
		if err != nil {
			t.Fatal(err)
		}
		back, _, err := readStageFrame(bytes.NewReader(again))
		if err != nil || !reflect.DeepEqual(back, cfg) {
			t.Fatalf("re-reading %q: %+v %v", again, back, err)
		}
	})
}
