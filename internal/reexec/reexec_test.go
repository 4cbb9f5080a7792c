package reexec

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	ok := func([]string) int { return 0 }
	for _, tt := range []struct {
		name    string
		helpers []Helper
		want    string // "" for no error, else a part of it
	}{
		{"empty", nil, ""},
		{"good", []Helper{{Prefix + "a", ok}, {Prefix + "b", ok}}, ""},
		{"no prefix", []Helper{{"moat-a", ok}}, "does not start"},
		{"prefix only", []Helper{{Prefix, ok}}, "does not start"},
		{"nil main", []Helper{{Prefix + "a", nil}}, "no entry function"},
		{"twice", []Helper{{Prefix + "a", ok}, {Prefix + "a", ok}}, "listed twice"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := Check(tt.helpers)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("got %v, want no error", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("got %v, want an error with %q", err, tt.want)
			}
		})
	}
}

func TestDispatch(t *testing.T) {
	var got []string
	helpers := []Helper{{Prefix + "echo", func(args []string) int { got = args; return 7 }}}
	for _, tt := range []struct {
		name        string
		args        []string
		wantCode    int
		wantHandled bool
		wantArgs    []string
	}{
		{"no args", nil, 0, false, nil},
		{"a command", []string{"run", Prefix + "echo"}, 0, false, nil},
		{"the helper", []string{Prefix + "echo", "a", "b"}, 7, true, []string{"a", "b"}},
		// A hidden name never falls through to the CLI.
		{"unknown helper", []string{Prefix + "nope"}, ExitUsage, true, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got = nil
			code, handled := Dispatch(tt.args, helpers)
			if code != tt.wantCode || handled != tt.wantHandled || strings.Join(got, " ") != strings.Join(tt.wantArgs, " ") {
				t.Fatalf("got (%d, %v, %q), want (%d, %v, %q)", code, handled, got, tt.wantCode, tt.wantHandled, tt.wantArgs)
			}
		})
	}
}
