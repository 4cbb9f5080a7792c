package kubeapi

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// heavy are the client-go packages that moat's binary must not link: the
// typed clientset, whose scheme registers every API group at package
// initialisation (milliseconds and thousands of allocations in every moat
// process), and what is built on it. moat reaches the cluster through
// this package; tests may still use client-go's fake clientset.
var heavy = []string{
	"k8s.io/client-go/kubernetes",
	"k8s.io/client-go/discovery",
	"k8s.io/client-go/applyconfigurations",
	"k8s.io/client-go/informers",
	"k8s.io/client-go/listers",
	"k8s.io/client-go/dynamic",
}

func heavyImport(path string) bool {
	for _, h := range heavy {
		if path == h || strings.HasPrefix(path, h+"/") {
			return true
		}
	}
	return false
}

// heavyImports lists the heavy imports of a Go source file.
func heavyImports(fset *token.FileSet, name string, src any) ([]string, error) {
	f, err := parser.ParseFile(fset, name, src, parser.ImportsOnly)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, im := range f.Imports {
		p, err := strconv.Unquote(im.Path.Value)
		if err == nil && heavyImport(p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// TestNoTypedClientset: no non-test file of the module imports client-go's
// typed clientset or what is built on it.
func TestNoTypedClientset(t *testing.T) {
	// Control: the check sees such an import, and a rest one is fine.
	fset := token.NewFileSet()
	if got, err := heavyImports(fset, "x.go", "package x\nimport (\n\t\"k8s.io/client-go/rest\"\n\tk \"k8s.io/client-go/kubernetes/scheme\"\n)\n"); err != nil || len(got) != 1 || got[0] != "k8s.io/client-go/kubernetes/scheme" {
		t.Fatalf("control: heavyImports = %v, %v", got, err)
	}
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("runtime.Caller: no file for this test")
	}
	root := filepath.Join(filepath.Dir(file), "..", "..")
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root %s: %v", root, err)
	}
	files := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != root && (name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		files++
		got, err := heavyImports(fset, p, nil)
		if err != nil {
			return err
		}
		for _, h := range got {
			rel, _ := filepath.Rel(root, p)
			t.Errorf("%s imports %s: moat would link client-go's typed clientset and its every-group scheme; use internal/kubeapi", rel, h)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("walked only %d Go files under %s", files, root)
	}
}
