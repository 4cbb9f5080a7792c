package broker

import (
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/moat-sandbox/moat/broker/wire"
)

// A PyPIPin is one requirement of a hashed requirements.txt: Name (PEP
// 503 normalized) at Version, any file whose sha256 is one of SHA256.
type PyPIPin struct {
	Name     string
	Version  string
	SHA256   []string // lower-case hex
	Lockfile string
}

const (
	maxReqLines  = 1 << 16
	maxReqHashes = 64
	reqAdvice    = "generate it with hashes (pip-compile --generate-hashes, or uv pip compile --generate-hashes)"
)

// ParseRequirements reads a requirements.txt in pip's hash-checking form:
// each requirement "name==version" (extras and markers allowed) with one
// or more --hash=sha256:<hex>. Comments, blank lines, "\" continuations
// and global options such as --index-url (which only configure the
// client) are accepted; a requirement without an exact == pin or a
// sha256 hash, a URL or editable requirement and an included file
// (-r, -c) refuse the whole file; name is used in messages.
func ParseRequirements(name string, data []byte) ([]PyPIPin, error) {
	if len(data) > MaxLockfileBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes", name, MaxLockfileBytes)
	}
	text := strings.ReplaceAll(string(data), "\r\n", "\n")
	text = strings.ReplaceAll(text, "\\\n", " ")
	lines := strings.Split(text, "\n")
	if len(lines) > maxReqLines {
		return nil, fmt.Errorf("%s: more than %d lines", name, maxReqLines)
	}
	idx := map[string]int{}
	var out []PyPIPin
	for i, line := range lines {
		if j := strings.Index(line, "#"); j >= 0 && (j == 0 || line[j-1] == ' ' || line[j-1] == '\t') {
			line = line[:j]
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if strings.HasPrefix(f[0], "-") {
			if opt := includeOption(f[0]); opt != "" {
				return nil, fmt.Errorf("%s:%d: %s is not supported (pip reads it as %s): moat reads one file with every requirement pinned; %s", name, i+1, wire.Bound(f[0]), opt, reqAdvice)
			}
			continue
		}
		req := f[0]
		var hashes []string
		for k := 1; k < len(f); k++ {
			a := f[k]
			if a == "--hash" && k+1 < len(f) {
				k++
				a = "--hash=" + f[k]
			}
			h, ok := strings.CutPrefix(a, "--hash=")
			if !ok {
				if strings.HasPrefix(a, "--") {
					return nil, fmt.Errorf("%s:%d: option %s on a requirement is not supported", name, i+1, a)
				}
				req += a // markers or spaces inside the requirement: kept, then cut below
				continue
			}
			hex64, ok := strings.CutPrefix(h, "sha256:")
			if b, err := hex.DecodeString(hex64); !ok || err != nil || len(b) != 32 {
				return nil, fmt.Errorf("%s:%d: --hash=%s is not sha256:<64 hex digits>", name, i+1, h)
			}
			if len(hashes) < maxReqHashes {
				hashes = append(hashes, strings.ToLower(hex64))
			}
		}
		req, _, _ = strings.Cut(req, ";") // environment markers
		if strings.Contains(req, "@") || strings.Contains(req, "://") {
			return nil, fmt.Errorf("%s:%d: %q is a URL requirement; moat serves index packages only", name, i+1, req)
		}
		pkg, ver, ok := strings.Cut(req, "==")
		if !ok || strings.HasPrefix(ver, "=") || strings.ContainsAny(ver, "<>~*,=") {
			return nil, fmt.Errorf("%s:%d: %q is not pinned with ==; %s", name, i+1, req, reqAdvice)
		}
		if b := strings.IndexByte(pkg, '['); b >= 0 {
			if !strings.HasSuffix(pkg, "]") {
				return nil, fmt.Errorf("%s:%d: %q has malformed extras", name, i+1, req)
			}
			pkg = pkg[:b]
		}
		norm, msg := normalizePyPIName(pkg)
		if msg != "" {
			return nil, fmt.Errorf("%s:%d: %s", name, i+1, msg)
		}
		if msg := checkPyPIVersion(ver); msg != "" {
			return nil, fmt.Errorf("%s:%d: %s", name, i+1, msg)
		}
		if len(hashes) == 0 {
			return nil, fmt.Errorf("%s:%d: %s==%s has no --hash=sha256:…: moat cannot check what it admits; %s", name, i+1, pkg, ver, reqAdvice)
		}
		id := norm + "==" + ver
		if j, dup := idx[id]; dup {
			out[j].SHA256 = append(out[j].SHA256, hashes...)
			continue
		}
		idx[id] = len(out)
		out = append(out, PyPIPin{Name: norm, Version: ver, SHA256: hashes, Lockfile: name})
	}
	return out, nil
}

// includeOption returns the option pip reads a in a requirements file as
// when it names another file or an editable install (--requirement,
// --constraint, --editable), else "". pip parses option lines with
// optparse: a short option may carry its value ("-rother.txt") and a long
// one may be abbreviated ("--requirem x", "--constr=c.txt").
func includeOption(a string) string {
	opt, _, _ := strings.Cut(a, "=")
	for _, o := range []struct{ short, long string }{{"-r", "--requirement"}, {"-c", "--constraint"}, {"-e", "--editable"}} {
		if strings.HasPrefix(opt, o.short) && !strings.HasPrefix(opt, "--") ||
			len(opt) > 2 && strings.HasPrefix(o.long, opt) {
			return o.long
		}
	}
	return ""
}

// normalizePyPIName is PEP 503's normalization (lower case, runs of
// "-", "_" and "." as one "-") of a PEP 508 name.
func normalizePyPIName(n string) (string, string) {
	if n == "" || len(n) > 200 {
		return "", fmt.Sprintf("package name %q is empty or too long", n)
	}
	var b strings.Builder
	sep := false
	for i := 0; i < len(n); i++ {
		c := n[i]
		switch {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9':
		case 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		case c == '-' || c == '_' || c == '.':
			if i == 0 || i == len(n)-1 {
				return "", fmt.Sprintf("package name %q starts or ends with a separator", n)
			}
			sep = true
			continue
		default:
			return "", fmt.Sprintf("package name %q holds byte 0x%02x", n, c)
		}
		if sep {
			b.WriteByte('-')
			sep = false
		}
		b.WriteByte(c)
	}
	return b.String(), ""
}

// checkPyPIVersion: a PEP 440-shaped version of [0-9A-Za-z.+!-].
func checkPyPIVersion(v string) string {
	if v == "" || len(v) > 128 {
		return fmt.Sprintf("version %q is empty or too long", v)
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte(".+!-_", c) >= 0) {
			return fmt.Sprintf("version %q holds byte 0x%02x", v, c)
		}
	}
	return ""
}
