package policy

import (
	"path/filepath"
	"testing"
)

// TestVolumes: a volume is decoded with its image made absolute; each
// mistake is an error naming the key.
func TestVolumes(t *testing.T) {
	f := newFixture(t)
	pol, perr := f.parse(t, "version: 1\nfilesystem:\n  read_write: [workspace]\n  volumes: [{image: scratch.img, path: /scratch, size: 64Mi}]\nprocess: {workdir: /scratch}\n")
	if perr != nil {
		t.Fatalf("valid volume: %v", perr)
	}
	v := pol.Filesystem.Volumes
	if len(v) != 1 || v[0].Image != filepath.Join(f.dir, "scratch.img") || v[0].Path != "/scratch" || v[0].Size != 64<<20 {
		t.Errorf("decoded %+v", v)
	}
	for _, tc := range []struct {
		name, fs, code, key string
	}{
		{"missing size", "volumes: [{image: s.img, path: /s}]", CodeMissing, "filesystem.volumes[0].size"},
		{"too small", "volumes: [{image: s.img, path: /s, size: 1Mi}]", CodeBadValue, "filesystem.volumes[0].size"},
		{"relative path", "volumes: [{image: s.img, path: s, size: 64Mi}]", CodeBadPath, "filesystem.volumes[0].path"},
		{"in /proc", "volumes: [{image: s.img, path: /proc/s, size: 64Mi}]", CodeForbidden, "filesystem.volumes[0].path"},
		{"over a grant", "read_write: [workspace]\n  volumes: [{image: s.img, path: " + f.ws + "/v, size: 64Mi}]", CodeBadPath, "filesystem.volumes[0].path"},
		{"image in a grant", "read_write: [workspace]\n  volumes: [{image: workspace/s.img, path: /s, size: 64Mi}]", CodeBadPath, "filesystem.volumes[0].image"},
		{"unknown key", "volumes: [{image: s.img, path: /s, size: 64Mi, mode: rw}]", CodeUnknownKey, "filesystem.volumes[0].mode"},
		{"twice", "volumes: [{image: a.img, path: /s, size: 64Mi}, {image: b.img, path: /s, size: 64Mi}]", CodeDuplicate, "filesystem.volumes[1].path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, perr := f.parse(t, "version: 1\nfilesystem:\n  "+tc.fs+"\n")
			if perr == nil || !perr.Has(tc.code, tc.key) {
				t.Errorf("got %v, want %s at %s", perr, tc.code, tc.key)
			}
		})
	}
}
