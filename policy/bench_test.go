package policy

import (
	"os"
	"testing"
)

// BenchmarkParse measures decoding and validating a full policy whose
// grants are small directories.
func BenchmarkParse(b *testing.B) {
	dir := b.TempDir()
	for _, d := range []string{"workspace", "data"} {
		if err := os.Mkdir(dir+"/"+d, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	data, err := os.ReadFile("testdata/good/full.yaml")
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := Parse(data, dir); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseSystemGrants measures the cost that dominates a real load:
// walking /usr (and the directories linked into it) for Unix sockets.
func BenchmarkParseSystemGrants(b *testing.B) {
	data := []byte("filesystem: {read_only: [/usr, /bin, /lib, /lib64]}\n")
	for b.Loop() {
		if _, err := Parse(data, ""); err != nil {
			b.Fatal(err)
		}
	}
}
