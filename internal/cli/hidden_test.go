package cli

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/internal/reexec"
)

func TestHiddenCheck(t *testing.T) {
	if err := reexec.Check(hidden); err != nil {
		t.Fatal(err)
	}
}

// testHelperPrefix starts the helpers of test binaries (reexectest.Helper);
// they are never in the moat binary.
const testHelperPrefix = reexec.Prefix + "test-"

// TestHiddenListed: every hidden helper name that the module's code
// spells (reexec.Prefix + "…", or a literal "__moat-…") is in hidden, and
// hidden lists nothing else. Test helpers (in test files, or named by
// reexectest) are left out: they serve only their own test binary.
func TestHiddenListed(t *testing.T) {
	// The source is found beside this file, not from the working
	// directory: scripts/test runs the test binary again elsewhere as an
	// unprivileged uid.
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("runtime.Caller: no file for this test")
	}
	root := filepath.Join(filepath.Dir(self), "..", "..")
	var err error
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found: %v", err)
	}
	found := map[string]string{} // name → where
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || n == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, name := range helperNames(f) {
			if strings.HasPrefix(name, testHelperPrefix) {
				continue
			}
			rel, _ := filepath.Rel(root, path)
			found[name] = rel
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, h := range hidden {
		listed[h.Name] = true
		if strings.HasPrefix(h.Name, testHelperPrefix) {
			t.Errorf("%s is a test helper's name", h.Name)
		}
		if found[h.Name] == "" {
			t.Errorf("%s is listed in hidden but spelled nowhere in the module", h.Name)
		}
	}
	for name, where := range found {
		if !listed[name] {
			t.Errorf("%s (%s) is not listed in hidden.go", name, where)
		}
	}
	// Control: the walk saw the helpers of several packages, not none.
	if len(found) < 10 {
		t.Fatalf("found only %d helper names: %v", len(found), found)
	}
}

// helperNames returns the helper names f spells: reexec.Prefix + "x" (or
// Prefix + "x" inside package reexec) and string literals "__moat-x".
func helperNames(f *ast.File) []string {
	var names []string
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.BinaryExpr:
			if n.Op != token.ADD || !isPrefix(n.X) {
				return true
			}
			if lit, ok := n.Y.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if s, err := strconv.Unquote(lit.Value); err == nil {
					names = append(names, reexec.Prefix+s)
				}
			}
			return false
		case *ast.BasicLit:
			if n.Kind != token.STRING {
				return true
			}
			if s, err := strconv.Unquote(n.Value); err == nil && strings.HasPrefix(s, reexec.Prefix) && s != reexec.Prefix {
				names = append(names, s)
			}
		}
		return true
	})
	return names
}

func isPrefix(e ast.Expr) bool {
	switch e := e.(type) {
	case *ast.SelectorExpr:
		x, ok := e.X.(*ast.Ident)
		return ok && x.Name == "reexec" && e.Sel.Name == "Prefix"
	case *ast.Ident:
		return e.Name == "Prefix"
	}
	return false
}

func TestHelperNames(t *testing.T) {
	const src = `package p
const (
	a = reexec.Prefix + "one"
	b = "__moat-two"
	c = Prefix + "three"
	d = "__moat-"
	e = other.Prefix + "no"
	f = "moat-no"
)`
	f, err := parser.ParseFile(token.NewFileSet(), "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := helperNames(f)
	want := []string{"__moat-one", "__moat-two", "__moat-three"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// The backends are registered explicitly (hidden.go), not by blank imports.
func TestBackendsRegistered(t *testing.T) {
	registerBackends()
	for _, b := range backends() {
		got, err := boundary.Lookup(b.Name())
		if err != nil || got.Name() != b.Name() {
			t.Errorf("Lookup(%q): got %v, %v", b.Name(), got, err)
		}
	}
	if names := boundary.Names(); !slices.Contains(names, "native") || !slices.Contains(names, "gvisor") {
		t.Errorf("got backends %v, want native and gvisor among them", names)
	}
}
