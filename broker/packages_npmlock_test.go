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

// TestPackagesNPMScoped: a scoped package's packument is served, filtered
// to the pin, under both of npm's spellings (@s%2futil, @s/util) and its
// tarball under /@s/util/-/; a typosquat of the scoped name, the same
// name under another scope (scope confusion) and an escape anywhere but
// after the scope are refused, none of them fetched.
func TestPackagesNPMScoped(t *testing.T) {
	f := newNPMFixture(t)
	evil := npmTarball(t, "@evil/util", "2.0.0", "evil")
	f.reg.files["/@s/util"] = []byte(`{"name":"@s/util","dist-tags":{"latest":"2.1.0"},"versions":{` +
		`"2.0.0":{"name":"@s/util","version":"2.0.0","dist":{"tarball":"https://evil.example/util-2.0.0.tgz"}},` +
		`"2.1.0":{"name":"@s/util","version":"2.1.0","dist":{"tarball":"https://registry.npmjs.org/@s/util/-/util-2.1.0.tgz"}}}}`)
	f.reg.files["/@evil/util"] = []byte(`{"name":"@evil/util","versions":{"2.0.0":{"name":"@evil/util","version":"2.0.0"}}}`)
	f.reg.files["/@evil/util/-/util-2.0.0.tgz"] = evil
	f.reg.files["/@s/utill/-/utill-2.0.0.tgz"] = evil
	h := f.harness(t)
	for _, path := range []string{"/pkg/npm/@s%2futil", "/pkg/npm/@s%2Futil", "/pkg/npm/@s/util"} {
		r := h.raw(pkgGet(path))
		if r.status != 200 || !strings.Contains(r.body, `"name":"@s/util"`) || !strings.Contains(r.body, "http://127.0.0.1:1/pkg/npm/@s/util/-/util-2.0.0.tgz") ||
			strings.Contains(r.body, "2.1.0") || strings.Contains(r.body, "evil.example") {
			t.Errorf("scoped packument %s: %d %s", path, r.status, r.body)
		}
	}
	if r := h.raw(pkgGet("/pkg/npm/@s/util/-/util-2.0.0.tgz")); r.status != 200 || r.body != string(f.tgz["@s/util@2.0.0"]) {
		t.Errorf("scoped tarball: %d", r.status)
	}
	n := len(f.reg.requests())
	for _, c := range []struct {
		name, path string
		reason     Reason
	}{
		{"typosquat packument", "/pkg/npm/@s%2futill", ReasonPackageNotPinned},
		{"typosquat tarball", "/pkg/npm/@s/utill/-/utill-2.0.0.tgz", ReasonPackageNotPinned},
		{"scope confusion packument", "/pkg/npm/@evil%2futil", ReasonPackageNotPinned},
		{"scope confusion packument, plain", "/pkg/npm/@evil/util", ReasonPackageNotPinned},
		{"scope confusion tarball", "/pkg/npm/@evil/util/-/util-2.0.0.tgz", ReasonPackageNotPinned},
		{"unscoped name of a scoped pin", "/pkg/npm/util/-/util-2.0.0.tgz", ReasonPackageNotPinned},
		{"escape after the name", "/pkg/npm/@s%2futil%2f..%2f..%2fx", ReasonPathTrick},
		{"escape in an unscoped name", "/pkg/npm/left-pad%2f..", ReasonPathTrick},
		{"escaped scope sign", "/pkg/npm/%40s%2futil", ReasonPathTrick},
		{"two scopes", "/pkg/npm/@s%2f@evil%2futil", ReasonPathTrick},
	} {
		r := h.raw(pkgGet(c.path))
		if r.status == 200 || r.header.Get("Moat-Reason") != string(c.reason) {
			t.Errorf("%s (%s): %d %s %s, want %s", c.name, c.path, r.status, r.header.Get("Moat-Reason"), r.body, c.reason)
		}
	}
	if got := f.reg.requests(); len(got) != n {
		t.Errorf("refused scoped requests reached the registry: %v", got[n:])
	}
	for in, want := range map[string]string{
		"/pkg/npm/@s%2futil":         "/pkg/npm/@s/util",
		"/pkg/npm/@s%2Futil":         "/pkg/npm/@s/util",
		"/pkg/npm/@s%2f":             "/pkg/npm/@s/",
		"/pkg/npm/@%2futil":          "/pkg/npm/@%2futil",
		"/pkg/npm/@s%2":              "/pkg/npm/@s%2",
		"/pkg/npm/@s.x%2fa%2fb":      "/pkg/npm/@s.x/a%2fb",
		"/pkg/npm/@s!%2fa":           "/pkg/npm/@s!%2fa",
		"/pkg/pypi/@s%2fa":           "/pkg/pypi/@s%2fa",
		"/pkg/npm/left-pad%2futil":   "/pkg/npm/left-pad%2futil",
		"/pkg/npm/@s%252futil":       "/pkg/npm/@s%252futil",
		"/pkg/npm/@s/util%2f-%2fx":   "/pkg/npm/@s/util%2f-%2fx",
		"/pkg/npm/@s%2futil/-/x.tgz": "/pkg/npm/@s/util/-/x.tgz",
	} {
		if got := npmScopedTarget(in); got != want {
			t.Errorf("npmScopedTarget(%q) = %q, want %q", in, got, want)
		}
	}
}
