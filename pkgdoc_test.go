package moat_test

import (
	"slices"
	"strings"
	"testing"
)

// TestPackageDocs: every package of the module has a package doc comment
// (in a doc.go or in one of its files), in every build context that builds
// it, and the comment starts the way godoc expects: "Package name …" (or
// "Command name …" for a main package). In the way of tailscale's
// pkgdoc_test.go.
func TestPackageDocs(t *testing.T) {
	root := moduleRoot(t)
	for _, c := range contexts {
		pkgs, err := loadGraph(root, c.goos, c.tags)
		if err != nil {
			t.Fatal(err)
		}
		for _, ip := range sortedKeys(pkgs) {
			if pkgs[ip].tests {
				continue // a package of tests only (its doc is in a _test.go file, which godoc does not show)
			}
			if msg := docProblem(pkgs[ip]); msg != "" {
				t.Errorf("GOOS=%s tags=%v: %s: %s", c.goos, c.tags, ip, msg)
			}
		}
	}
}

// docProblem says what is wrong with p's package doc, or "".
func docProblem(p *pkgInfo) string {
	if strings.TrimSpace(p.doc) == "" {
		return "no package doc comment (write one in a doc.go, or above the package clause of one file)"
	}
	want := "Package " + p.name
	if p.name == "main" {
		want = "Command"
	}
	rest, ok := strings.CutPrefix(p.doc, want)
	if !ok || rest == "" || isWordByte(rest[0]) {
		words := strings.Fields(p.doc)
		return "package doc starts " + strings.Join(words[:min(3, len(words))], " ") + ", want " + want + " …"
	}
	return ""
}

func isWordByte(c byte) bool {
	return c == '_' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

func sortedKeys[V any](m map[string]V) []string {
	k := make([]string, 0, len(m))
	for s := range m {
		k = append(k, s)
	}
	slices.Sort(k)
	return k
}

// TestPackageDocsControl: the check fails for a package without a doc
// comment and for one whose comment names another package, and passes for
// a real package of the module.
func TestPackageDocsControl(t *testing.T) {
	pkgs, err := loadGraph(moduleRoot(t), "linux", nil)
	if err != nil {
		t.Fatal(err)
	}
	audit := pkgs[module+"/audit"]
	if audit == nil || docProblem(audit) != "" {
		t.Fatalf("audit: %q, want a good doc", docProblem(audit))
	}
	for _, tc := range []struct {
		p    pkgInfo
		want string
	}{
		{pkgInfo{name: "x", doc: ""}, "no package doc comment"},
		{pkgInfo{name: "x", doc: "Package y does things.\n"}, "want Package x"},
		{pkgInfo{name: "main", doc: "Package main does things.\n"}, "want Command"},
		{pkgInfo{name: "x", doc: "Package xy does things.\n"}, "want Package x"},
	} {
		if got := docProblem(&tc.p); !strings.Contains(got, tc.want) {
			t.Errorf("%+v: got %q, want %q", tc.p, got, tc.want)
		}
	}
}
