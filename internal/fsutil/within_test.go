package fsutil

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestWithin(t *testing.T) {
	for _, tc := range []struct {
		p, dir string
		want   bool
	}{
		{"/a/b", "/a", true},
		{"/a", "/a", true},
		{"/a/", "/a", true},
		{"/a", "/a/", true},
		{"/a/b/../c", "/a", true},
		{"/a/./b", "/a/b", true},
		{"/anything", "/", true},
		{"/", "/", true},
		{"/ab", "/a", false},
		{"/a", "/a/b", false},
		{"/a/../b", "/a", false},
		{"/a/..b", "/a", true},
		{"/..a", "/a", false},
		{"a/b", "a", true},
		{"a", ".", true},
		{"../a", ".", false},
		{"..", ".", false},
		{"../a", "..", true},
		{"a/b", "/a", false},
		{"/a/b", "a", false},
		{"", ".", true},
	} {
		if got := Within(tc.p, tc.dir); got != tc.want {
			t.Errorf("Within(%q, %q) = %v, want %v", tc.p, tc.dir, got, tc.want)
		}
	}
}

// Within agrees with the filepath.Rel test three packages used, wherever
// both paths are absolute or both relative.
func FuzzWithin(f *testing.F) {
	f.Add("/a/b", "/a")
	f.Add("/a/..b", "/a")
	f.Add("../x", "..")
	f.Fuzz(func(t *testing.T, p, dir string) {
		if filepath.IsAbs(p) != filepath.IsAbs(dir) || strings.ContainsRune(p+dir, 0) {
			return
		}
		rel, err := filepath.Rel(dir, p)
		want := err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
		if got := Within(p, dir); got != want {
			t.Fatalf("Within(%q, %q) = %v; filepath.Rel says %q, %v", p, dir, got, rel, err)
		}
	})
}
