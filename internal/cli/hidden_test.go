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

// ModuleHelperNames is every hidden helper name that the module's
// non-test code spells (reexec.Prefix + "…", or a literal "__moat-…"),
// with the file that spells it. Test helpers (named by reexectest) and
// kubernetesHelperPrefix itself (a prefix, not a name) are left out.
// Exported for the external test (hidden_ext_test.go), which can import
// k8sext.
func ModuleHelperNames(t *testing.T) map[string]string {
	// The source is found beside this file, not from the working
	// directory: scripts/test runs the test binary again elsewhere as an
	// unprivileged uid.
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("runtime.Caller: no file for this test")
	}
	root := filepath.Join(filepath.Dir(self), "..", "..")
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found: %v", err)
	}
	found := map[string]string{} // name → where
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
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
			if strings.HasPrefix(name, testHelperPrefix) || name == kubernetesHelperPrefix {
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
	// Control: the walk saw the helpers of several packages, not none.
	if len(found) < 10 {
		t.Fatalf("found only %d helper names: %v", len(found), found)
	}
	return found
}

// Hidden and KubernetesHelperPrefix, for the external test.
var Hidden = hidden

const KubernetesHelperPrefix = kubernetesHelperPrefix

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
