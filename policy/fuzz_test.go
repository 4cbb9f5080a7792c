package policy

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// readTestdata returns the files of testdata/<sub> by name.
func readTestdata(t testing.TB, sub string) map[string][]byte {
	t.Helper()
	dir := filepath.Join("testdata", sub)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = b
	}
	if len(out) == 0 {
		t.Fatalf("no files in %s", dir)
	}
	return out
}

// TestTestdata loads every good policy and refuses every bad one with the
// problem its first line names ("# want: CODE [PATH]").
func TestTestdata(t *testing.T) {
	f := newFixture(t)
	for name, b := range readTestdata(t, "good") {
		t.Run("good/"+name, func(t *testing.T) {
			p, err := Parse(b, f.dir)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if p.Process.UID == 0 || p.Audit.Dir == "" || p.Process.Workdir == "" {
				t.Errorf("effective policy incomplete: %+v", p)
			}
		})
	}
	for name, b := range readTestdata(t, "bad") {
		t.Run("bad/"+name, func(t *testing.T) {
			first, _, _ := strings.Cut(string(b), "\n")
			w, ok := strings.CutPrefix(first, "# want: ")
			if !ok {
				t.Fatalf("first line %q is not # want: CODE [PATH]", first)
			}
			code, path, _ := strings.Cut(w, " ")
			_, err := Parse(b, f.dir)
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("got %v, want *Error", err)
			}
			if !pe.Has(code, path) {
				t.Errorf("got %v\nwant %s at %q", pe, code, path)
			}
		})
	}
}

// FuzzParse: no input panics; an accepted policy prints as YAML that loads
// back to the same policy, and a refused one says why.
func FuzzParse(f *testing.F) {
	for _, sub := range []string{"good", "bad"} {
		for _, b := range readTestdata(f, sub) {
			f.Add(b)
		}
	}
	f.Add([]byte("a: &a [*a, *a]\nb: *a\n"))
	f.Add([]byte(strings.Repeat("[", 1000)))
	f.Add([]byte("process: {env: {\"\": x}}"))
	dir := f.TempDir()
	for _, d := range []string{"workspace", "data"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			f.Fatal(err)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse(data, dir)
		if err != nil {
			var pe *Error
			if errors.As(err, &pe) && (len(pe.Problems) == 0 || pe.Error() == "") {
				t.Fatalf("error without problems: %#v", pe)
			}
			if p != nil {
				t.Fatal("policy returned with an error")
			}
			return
		}
		if p.Process.UID <= 0 || p.Process.GID <= 0 || p.Process.HostUID < 0 || p.Inference.MaxRequests < 0 ||
			p.Filesystem.TmpSize <= 0 || p.Process.Limits.Memory <= 0 || p.Process.Limits.Pids <= 0 {
			t.Fatalf("accepted impossible values: %+v", p)
		}
		y, err := p.YAML()
		if err != nil {
			t.Fatal(err)
		}
		q, err := Parse(y, "")
		if err != nil {
			t.Fatalf("printed policy does not load: %v\n%s", err, y)
		}
		if !reflect.DeepEqual(p, q) {
			t.Fatalf("round trip changed the policy:\n%+v\n%+v", p, q)
		}
	})
}
