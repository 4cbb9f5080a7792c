package broker

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"slices"
	"strings"
)

// A GoPin is one module version a go.sum pins: the h1 hash of its zip's
// contents (ZipHash), of its go.mod (ModHash), or both.
type GoPin struct {
	Module   string
	Version  string
	ZipHash  string // "h1:<base64>", "" when go.sum pins only the go.mod
	ModHash  string // "h1:<base64>", "" when go.sum pins only the zip
	Lockfile string
}

// Limits of a go.sum.
const (
	maxGoSumLines   = 1 << 18
	maxGoModPathLen = 512
	maxGoVersionLen = 128
	goSumAdvice     = "run go mod tidy (or go mod download) with a Go toolchain and commit go.sum"
)

// ParseGoSum reads the pins of a go.sum: "module version h1:hash" (the
// module zip's contents) and "module version/go.mod h1:hash" lines. A
// malformed line, a hash other than h1, or two lines pinning one file to
// different hashes refuses the whole file; name is used in messages.
func ParseGoSum(name string, data []byte) ([]GoPin, error) {
	if len(data) > MaxLockfileBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes", name, MaxLockfileBytes)
	}
	idx := map[string]int{}
	var out []GoPin
	lines := strings.Split(string(data), "\n")
	if len(lines) > maxGoSumLines {
		return nil, fmt.Errorf("%s: more than %d lines", name, maxGoSumLines)
	}
	for i, line := range lines {
		line = strings.TrimSuffix(line, "\r")
		if strings.TrimSpace(line) == "" {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 3 {
			return nil, fmt.Errorf("%s:%d: malformed line (want: module version h1:hash); %s", name, i+1, goSumAdvice)
		}
		mod, ver, hash := f[0], f[1], f[2]
		ver, isMod := strings.CutSuffix(ver, "/go.mod")
		if msg := checkGoModule(mod); msg != "" {
			return nil, fmt.Errorf("%s:%d: %s", name, i+1, msg)
		}
		if msg := checkGoVersion(ver); msg != "" {
			return nil, fmt.Errorf("%s:%d: %s", name, i+1, msg)
		}
		if msg := checkH1(hash); msg != "" {
			return nil, fmt.Errorf("%s:%d: %s", name, i+1, msg)
		}
		id := mod + "@" + ver
		j, ok := idx[id]
		if !ok {
			j = len(out)
			idx[id] = j
			out = append(out, GoPin{Module: mod, Version: ver, Lockfile: name})
		}
		p := &out[j]
		slot := &p.ZipHash
		if isMod {
			slot = &p.ModHash
		}
		if *slot != "" && *slot != hash {
			return nil, fmt.Errorf("%s:%d: %s is pinned to two different hashes", name, i+1, strings.Join(f[:2], " "))
		}
		*slot = hash
	}
	return out, nil
}

func checkH1(h string) string {
	b64, ok := strings.CutPrefix(h, "h1:")
	if !ok {
		return fmt.Sprintf("hash %q is not h1: moat checks h1 hashes only; %s", h, goSumAdvice)
	}
	if raw, err := base64.StdEncoding.DecodeString(b64); err != nil || len(raw) != sha256.Size {
		return fmt.Sprintf("hash %q is not an h1 hash (base64 of 32 bytes)", h)
	}
	return ""
}

// checkGoModule: a module path of [A-Za-z0-9.-_~+/] elements, none empty
// or starting or ending with a dot.
func checkGoModule(m string) string {
	if m == "" || len(m) > maxGoModPathLen {
		return fmt.Sprintf("module path %q is empty or longer than %d bytes", m, maxGoModPathLen)
	}
	for _, el := range strings.Split(m, "/") {
		if el == "" || el[0] == '.' || el[len(el)-1] == '.' {
			return fmt.Sprintf("module path %q has an empty or dotted element", m)
		}
		for i := 0; i < len(el); i++ {
			c := el[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-._~+", c) >= 0) {
				return fmt.Sprintf("module path %q holds byte 0x%02x", m, c)
			}
		}
	}
	return ""
}

// checkGoVersion: "v" and a semver of [0-9A-Za-z.+-].
func checkGoVersion(v string) string {
	if len(v) < 2 || len(v) > maxGoVersionLen || v[0] != 'v' || v[1] < '0' || v[1] > '9' {
		return fmt.Sprintf("version %q is not a module version", v)
	}
	for i := 1; i < len(v); i++ {
		c := v[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '+') {
			return fmt.Sprintf("version %q holds byte 0x%02x", v, c)
		}
	}
	return ""
}

// goEscape is the module proxy protocol's case encoding: each upper-case
// letter becomes '!' and its lower case.
func goEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			b.WriteByte('!')
			c += 'a' - 'A'
		}
		b.WriteByte(c)
	}
	return b.String()
}

// goUnescape reverses goEscape; an upper-case letter, or a '!' not
// followed by a lower-case letter, is refused.
func goUnescape(s string) (string, bool) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'A' <= c && c <= 'Z':
			return "", false
		case c == '!':
			if i+1 >= len(s) || s[i+1] < 'a' || s[i+1] > 'z' {
				return "", false
			}
			i++
			c = s[i] - ('a' - 'A')
		}
		b.WriteByte(c)
	}
	return b.String(), true
}

// hash1 is golang.org/x/mod/sumdb/dirhash.Hash1: the SHA-256 of the
// lines "<hex sha256 of the file>  <name>\n", names sorted, base64. Each
// file is hashed as it is read, never held whole in memory.
func hash1(names []string, open func(string) (io.ReadCloser, error)) (string, error) {
	names = slices.Clone(names)
	slices.Sort(names)
	h := sha256.New()
	fh := sha256.New()
	buf := make([]byte, 32<<10) // one buffer for every file: a zip may hold very many
	for _, n := range names {
		if strings.Contains(n, "\n") {
			return "", fmt.Errorf("file name %q holds a newline", n)
		}
		rc, err := open(n)
		if err != nil {
			return "", err
		}
		fh.Reset()
		_, err = io.CopyBuffer(fh, struct{ io.Reader }{rc}, buf)
		rc.Close()
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%x  %s\n", fh.Sum(nil), n)
	}
	return "h1:" + base64.StdEncoding.EncodeToString(h.Sum(nil)), nil
}

// goModHash is the h1 hash of a go.mod file (go.sum's "/go.mod" lines).
func goModHash(data []byte) string {
	h, _ := hash1([]string{"go.mod"}, func(string) (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	return h
}

// goZipHash is the h1 hash of a module zip's contents (dirhash.HashZip):
// every file of the zip by its name in the zip. A zip with a directory
// entry's data, a duplicate name, an entry that is neither a regular file
// nor a directory, or more than max decoded bytes fails.
// The contents are streamed through the hash: a small zip that inflates
// to max costs max bytes of inflating, not of memory.
func goZipHash(data []byte, max int64) (string, error) {
	zr, err := zip.NewReader(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		return "", fmt.Errorf("not a zip: %v", err)
	}
	files := map[string]*zip.File{}
	var names []string
	for _, f := range zr.File {
		if _, dup := files[f.Name]; dup {
			return "", fmt.Errorf("the zip holds %q twice", f.Name)
		}
		// The hash does not cover modes: an entry the go command would
		// never write (a symlink, a device) is refused, not served.
		if m := f.Mode(); m.Type() != 0 && !m.IsDir() {
			return "", fmt.Errorf("the zip's entry %q is not a regular file (%s)", f.Name, m.Type())
		}
		files[f.Name] = f
		names = append(names, f.Name)
	}
	left := max
	return hash1(names, func(n string) (io.ReadCloser, error) {
		rc, err := files[n].Open()
		if err != nil {
			return nil, err
		}
		return &cappedReader{rc: rc, left: &left, max: max}, nil
	})
}

// cappedReader fails once more than max bytes in all were read through
// the readers sharing left.
type cappedReader struct {
	rc   io.ReadCloser
	left *int64
	max  int64
}

func (c *cappedReader) Read(p []byte) (int, error) {
	if int64(len(p)) > *c.left+1 {
		p = p[:*c.left+1]
	}
	n, err := c.rc.Read(p)
	if *c.left -= int64(n); *c.left < 0 {
		return n, fmt.Errorf("the zip's contents are over %d bytes", c.max)
	}
	return n, err
}

func (c *cappedReader) Close() error { return c.rc.Close() }
