package broker

import (
	"crypto/sha512"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func sri(b []byte) string {
	s := sha512.Sum512(b)
	return "sha512-" + base64.StdEncoding.EncodeToString(s[:])
}

func TestParseNPMLockfile(t *testing.T) {
	good := `{"name":"app","lockfileVersion":3,"packages":{
	  "": {"name":"app","dependencies":{"left-pad":"^1.3.0"}},
	  "node_modules/left-pad": {"version":"1.3.0","resolved":"https://registry.npmjs.org/left-pad/-/left-pad-1.3.0.tgz","integrity":"` + sri([]byte("a")) + ` sha1-AAAA"},
	  "node_modules/@s/x": {"version":"2.0.0-rc.1","resolved":"https://registry.npmjs.org/@s/x/-/x-2.0.0-rc.1.tgz","integrity":"` + sri([]byte("b")) + `"},
	  "node_modules/y/node_modules/left-pad": {"version":"1.3.0","resolved":"https://registry.npmjs.org/left-pad/-/left-pad-1.3.0.tgz","integrity":"` + sri([]byte("a")) + `"},
	  "node_modules/alias": {"name":"real","version":"1.0.0","resolved":"https://registry.npmjs.org/real/-/real-1.0.0.tgz","integrity":"` + sri([]byte("c")) + `"},
	  "node_modules/bundled": {"version":"1.0.0","inBundle":true},
	  "node_modules/ws": {"resolved":"packages/ws","link":true},
	  "node_modules/g": {"version":"1.0.0","resolved":"git+ssh://git@github.com/o/g.git#abc","integrity":"sha512-x"},
	  "packages/ws": {"version":"0.0.1"}
	}}`
	pins, err := ParseNPMLockfile("package-lock.json", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range pins {
		got = append(got, p.Name+"@"+p.Version+" "+p.TarballPath)
	}
	want := "@s/x@2.0.0-rc.1 /@s/x/-/x-2.0.0-rc.1.tgz|real@1.0.0 /real/-/real-1.0.0.tgz|left-pad@1.3.0 /left-pad/-/left-pad-1.3.0.tgz"
	if strings.Join(got, "|") != want {
		t.Errorf("pins %q\nwant %q", strings.Join(got, "|"), want)
	}
	if pins[2].IntegrityString() != sri([]byte("a")) || pins[2].Lockfile != "package-lock.json" {
		t.Errorf("pin %+v", pins[2])
	}
	entry := func(e string) string {
		return `{"lockfileVersion":3,"packages":{"node_modules/p":` + e + `}}`
	}
	ok := entry(`{"version":"1.0.0","resolved":"https://r/p/-/p-1.0.0.tgz","integrity":"` + sri(nil) + `"}`)
	if _, err := ParseNPMLockfile("l", []byte(ok)); err != nil {
		t.Fatalf("control: %v", err)
	}
	for _, c := range []struct{ data, want string }{
		{`{"lockfileVersion":1,"dependencies":{}}`, "lockfileVersion 1"},
		{`{"lockfileVersion":3}`, `no "packages"`},
		{`{"lockfileVersion":3,"packages":{}} {}`, "data after"},
		{`[`, "not a package-lock.json"},
		{entry(`{"version":"1.0.0","resolved":"https://r/p/-/p-1.0.0.tgz","integrity":"sha1-AAAA"}`), "no sha512"},
		{entry(`{"version":"1.0.0","resolved":"https://r/p/-/p-1.0.0.tgz"}`), "no sha512"},
		{entry(`{"version":"1.0.0","resolved":"https://r/p/-/p-1.0.0.tgz","integrity":"sha512-AAAA"}`), "not a sha512"},
		{entry(`{"version":"1.0.0","resolved":"https://r/p/-/p-1.0.0.tgz","integrity":"` + sri(nil) + " " + sri([]byte("x")) + `"}`), "two different"},
		{entry(`{"version":"1.0.0","resolved":"https://r/other/-/other-1.0.0.tgz","integrity":"` + sri(nil) + `"}`), "not a registry tarball URL"},
		{entry(`{"version":"1.0.0","resolved":"https://r/p/-/p-1.0.0.tgz?x=1","integrity":"` + sri(nil) + `"}`), "not a registry tarball URL"},
		{entry(`{"version":"1.0.0","resolved":"https://r/p/-/../p-1.0.0.tgz","integrity":"` + sri(nil) + `"}`), "not a registry tarball URL"},
		{entry(`{"version":"latest","resolved":"https://r/p/-/p-1.0.0.tgz","integrity":"` + sri(nil) + `"}`), "not a registry version"},
		{entry(`{"version":"1.0.0","integrity":"` + sri(nil) + `"}`), "no resolved URL"},
		{`{"lockfileVersion":3,"packages":{"node_modules/P%":{"version":"1.0.0","resolved":"https://r/P%/-/P%-1.0.0.tgz","integrity":"` + sri(nil) + `"}}}`, "not a URL"},
		{`{"lockfileVersion":3,"packages":{"node_modules/p q":{"version":"1.0.0","resolved":"https://r/p/-/p-1.0.0.tgz","integrity":"` + sri(nil) + `"}}}`, "holds byte 0x20"},
		{`{"lockfileVersion":3,"packages":{"node_modules/p":{"version":"1.0.0","resolved":"https://r/p/-/p-1.0.0.tgz","integrity":"` + sri(nil) + `"},"node_modules/q/node_modules/p":{"version":"1.0.0","resolved":"https://r/p/-/p-1.0.0.tgz","integrity":"` + sri([]byte("x")) + `"}}}`, "different integrity"},
	} {
		_, err := ParseNPMLockfile("l", []byte(c.data))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", c.data, err, c.want)
		}
	}
}

// FuzzNPMLockfile: no input panics, and every pin of an accepted
// lockfile is well formed.
func FuzzNPMLockfile(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/npm/*.json")
	for _, s := range seeds {
		b, err := os.ReadFile(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"lockfileVersion":2,"packages":{"node_modules/a":{"version":"1.0.0","resolved":"http://r/a/-/a-1.0.0.tgz","integrity":"` + sri(nil) + `"}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		pins, err := ParseNPMLockfile("l", data)
		if err != nil {
			return
		}
		for _, p := range pins {
			if checkNPMName(p.Name) != "" || checkNPMVersion(p.Version) != "" || checkPath(p.TarballPath) != nil ||
				!strings.Contains(p.TarballPath, fmt.Sprintf("/%s/-/", p.Name)) {
				t.Fatalf("malformed pin %+v", p)
			}
		}
	})
}
