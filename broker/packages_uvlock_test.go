package broker

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/policy"
)

// TestParseUVLock: a uv.lock as uv writes it (a workspace with an
// editable project, a virtual member, git, path and url sources, optional
// and dev dependencies, metadata tables) pins exactly its registry
// packages, each with the sha256 of every sdist and wheel.
func TestParseUVLock(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "uv.lock"))
	if err != nil {
		t.Fatal(err)
	}
	pins, err := ParseUVLock("/w/uv.lock", data)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range pins {
		got = append(got, p.Name+"=="+p.Version)
		if p.Lockfile != "/w/uv.lock" {
			t.Errorf("%s: lockfile %q", p.Name, p.Lockfile)
		}
		for _, h := range p.SHA256 {
			if len(h) != 64 || !isLowerHex(h) {
				t.Errorf("%s: hash %q", p.Name, h)
			}
		}
	}
	want := []string{"anyio==4.8.0", "idna==3.10", "markupsafe==3.0.2", "sniffio==1.3.1", "typing-extensions==4.12.2"}
	if !slices.Equal(got, want) {
		t.Fatalf("pins %v, want %v (registry packages only)", got, want)
	}
	if ms := pins[2].SHA256; len(ms) != 4 || ms[0] != "ee55d3edf80167e48ea11a923c7386f4669df67d7994554387f84e7d8b0a2bf0" ||
		ms[3] != "e17c96c14e19278594aa4841ec148115f9c7615a47382ecb6b82bd8fea3ab0c8" {
		t.Errorf("markupsafe hashes %v, want the sdist's and the 3 wheels'", ms)
	}
	// The pins are usable by the pypi route.
	g := &policy.PackageGrant{Kind: policy.PackagePyPI, Upstream: policy.DefaultPyPIUpstream, FilesUpstream: policy.DefaultPyPIFiles}
	if r, err := newPyPIRegistry(&registry{grant: g}, pins); err != nil || len(r.byName["markupsafe"]) != 1 || r.byHash[pins[0].SHA256[0]] == nil {
		t.Errorf("newPyPIRegistry: %v", err)
	}
	// CRLF line ends and a repeated name==version (two registries) merge.
	lock := strings.ReplaceAll(`version = 1
[[package]]
name = "Demo_Pkg"
version = "1.0"
source = { registry = "https://pypi.org/simple" }
wheels = [{ url = "https://x/a.whl", hash = "sha256:`+strings.Repeat("a", 64)+`" }]
[[package]]
name = "demo-pkg"
version = "1.0"
source = { registry = "https://mirror.example/simple" }
sdist = { url = "https://x/a.tar.gz", hash = "sha256:`+strings.Repeat("b", 64)+`" } # comment
`, "\n", "\r\n")
	pins, err = ParseUVLock("uv.lock", []byte(lock))
	if err != nil || len(pins) != 1 || pins[0].Name != "demo-pkg" || len(pins[0].SHA256) != 2 {
		t.Errorf("merged pins %+v, %v", pins, err)
	}
	// No packages: nothing pinned, no error.
	if pins, err := ParseUVLock("uv.lock", []byte("version = 1\nrequires-python = \">=3.12\"\n")); err != nil || len(pins) != 0 {
		t.Errorf("empty lock: %v %v", pins, err)
	}
}

// TestParseUVLockRefused: bad input gets an error that says what and
// where, never a panic; each case differs from an accepted lock (the one
// above) in one thing.
func TestParseUVLockRefused(t *testing.T) {
	h := strings.Repeat("a", 64)
	pkg := func(body string) string {
		return "version = 1\n[[package]]\nname = \"demo\"\nversion = \"1.0\"\nsource = { registry = \"https://pypi.org/simple\" }\n" + body
	}
	good := pkg(`wheels = [{ url = "https://x/a.whl", hash = "sha256:` + h + `" }]` + "\n")
	if _, err := ParseUVLock("uv.lock", []byte(good)); err != nil {
		t.Fatalf("control: %v", err)
	}
	for _, c := range []struct{ name, in, says string }{
		{"lock version 2", strings.Replace(good, "version = 1", "version = 2", 1), "version 2: moat reads uv.lock version 1"},
		{"no version", strings.Replace(good, "version = 1\n", "", 1), `no integer "version"`},
		{"wheel without hash", pkg(`wheels = [{ url = "https://x/a.whl" }]`), `file "https://x/a.whl" has no hash`},
		{"md5 hash", pkg(`wheels = [{ url = "https://x/a.whl", hash = "md5:` + h[:32] + `" }]`), "is not sha256:"},
		{"upper-case hash", pkg(`wheels = [{ url = "https://x/a.whl", hash = "sha256:` + strings.ToUpper(h) + `" }]`), "lower-case hex"},
		{"short hash", pkg(`sdist = { url = "https://x/a.tgz", hash = "sha256:abc" }`), "is not sha256:"},
		{"registry package without files", pkg(""), "without sdist or wheels"},
		{"no source", strings.Replace(good, "source = { registry = \"https://pypi.org/simple\" }\n", "", 1), "no source table"},
		{"bad name", strings.Replace(good, `name = "demo"`, `name = "de mo"`, 1), "holds byte 0x20"},
		{"bad version", strings.Replace(good, `version = "1.0"`, `version = "1.0;rm"`, 1), "version"},
		{"package not an array", "version = 1\n[package]\nname = \"x\"\n", "not an array of tables"},
		{"multi-line string", pkg(`wheels = []` + "\n" + `x = """a` + "\nb\"\"\"\n"), "multi-line string"},
		{"dotted key", pkg(`a.b = 1`), "dotted key a.b"},
		{"float", pkg(`size = 1.5`), "not a decimal integer"},
		{"date", pkg(`t = 2024-01-01`), "not a decimal integer"},
		{"leading zero", pkg(`size = 01`), "not a decimal integer"},
		{"duplicate key", strings.Replace(good, `name = "demo"`, "name = \"demo\"\nname = \"other\"", 1), `key "name" is defined twice`},
		{"table twice", "version = 1\n[options]\na = 1\n[options]\nb = 2\n", "table [options] is defined twice"},
		{"unclosed string", pkg(`wheels = [{ url = "https://x/a.whl, hash = "x" }]`), "expected , or }"},
		{"string across lines", pkg("x = \"a\nb\""), "not closed on its line"},
		{"inline table across lines", pkg("sdist = { url = \"u\",\n hash = \"sha256:" + h + "\" }"), "expected a key"},
		{"extend inline table", good + "[package.source]\nx = 1\n", "defined inline"},
		{"array header over a value", "version = 1\npackage = 3\n[[package]]\n", "is a value, not a table"},
		{"two values on a line", pkg(`a = 1 b = 2`), "after a value"},
		{"bad escape", pkg(`a = "\q"`), `unknown escape \q`},
		{"control character", pkg("a = \"\x01\""), "control character 0x01"},
		{"not UTF-8", pkg("a = \"\xff\""), "not UTF-8"},
		{"unclosed array", pkg("a = [1, 2"), "array not closed"},
		{"unclosed header", "version = 1\n[[package]\n", "not closed by ]]"},
		{"deep nesting", pkg("a = " + strings.Repeat("[", 40) + strings.Repeat("]", 40)), "nested deeper than"},
		{"garbage value", pkg("a = @"), "unexpected '@' where a value belongs"},
	} {
		_, err := ParseUVLock("/w/uv.lock", []byte(c.in))
		if err == nil || !strings.Contains(err.Error(), c.says) || !strings.HasPrefix(err.Error(), "/w/uv.lock: ") {
			t.Errorf("%s: %v, want an error naming the file and saying %q", c.name, err, c.says)
		}
	}
	big := make([]byte, MaxLockfileBytes+1)
	if _, err := ParseUVLock("uv.lock", big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("oversized lock: %v", err)
	}
}

// FuzzParseUVLock: no input panics; every pin accepted has a normalized
// name, a checked version and only sha256 hex digests, and parsing is
// deterministic.
func FuzzParseUVLock(f *testing.F) {
	if data, err := os.ReadFile(filepath.Join("testdata", "uv.lock")); err == nil {
		f.Add(data)
	}
	f.Add([]byte("version = 1\n[[package]]\nname = \"a\"\nversion = \"1\"\nsource = { registry = \"r\" }\nsdist = { hash = \"sha256:" + strings.Repeat("0", 64) + "\" }\n"))
	f.Add([]byte("version = 1\n[a.b]\n[a]\nx = [1, [2, {y = 'z'}], \"\\u00e9\"]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		pins, err := ParseUVLock("uv.lock", data)
		again, err2 := ParseUVLock("uv.lock", data)
		if (err == nil) != (err2 == nil) || len(pins) != len(again) {
			t.Fatalf("not deterministic: %v / %v", err, err2)
		}
		if err != nil {
			return
		}
		for _, p := range pins {
			if norm, bad := normalizePyPIName(p.Name); bad != "" || norm != p.Name {
				t.Fatalf("pin name %q", p.Name)
			}
			if checkPyPIVersion(p.Version) != "" || len(p.SHA256) == 0 {
				t.Fatalf("pin %+v", p)
			}
			for _, h := range p.SHA256 {
				if len(h) != 64 || !isLowerHex(h) {
					t.Fatalf("hash %q", h)
				}
			}
		}
	})
}
