package policy

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/moat-sandbox/moat/internal/fsutil"
)

// kindName names a node's kind and tag for "want X, got Y" messages.
func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!str":
			return fmt.Sprintf("the string %q", n.Value)
		case "!!int":
			return "the integer " + n.Value
		case "!!bool":
			return "the boolean " + n.Value
		case "!!float":
			return "the number " + n.Value
		case "!!null":
			return "null"
		}
		return fmt.Sprintf("a %s value", n.ShortTag())
	}
	return "something else"
}

// plain refuses aliases, anchors and nulls; every other check builds on it.
func (d *decoder) plain(n *yaml.Node, path string) bool {
	switch {
	case n.Kind == yaml.AliasNode || n.Anchor != "":
		d.add(n, CodeAlias, path, "YAML anchors and aliases are not supported; write the value out")
		return false
	case n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null":
		d.add(n, CodeNull, path, "null value; give a value or remove the key to get the default")
		return false
	}
	return true
}

func (d *decoder) kind(n *yaml.Node, path string, k yaml.Kind, want string) bool {
	if !d.plain(n, path) {
		return false
	}
	if n.Kind != k {
		d.add(n, CodeWrongType, path, "want %s, got %s", want, kindName(n))
		return false
	}
	return true
}

func (d *decoder) scalar(n *yaml.Node, path, tag, want string) bool {
	if !d.kind(n, path, yaml.ScalarNode, want) {
		return false
	}
	if n.ShortTag() != tag {
		hint := ""
		if tag == "!!str" {
			hint = " (quote it to make it a string)"
		}
		d.add(n, CodeWrongType, path, "want %s, got %s%s", want, kindName(n), hint)
		return false
	}
	return true
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// mapping checks that n is a mapping whose keys are all in known, each at
// most once, and returns the value node of each key present.
func (d *decoder) mapping(n *yaml.Node, path string, known ...string) map[string]*yaml.Node {
	out := map[string]*yaml.Node{}
	want := "a mapping with keys " + strings.Join(known, ", ")
	if path == "" {
		want = "a mapping (version, backend, landlock, filesystem, process, inference, audit, tools, egress, approvals)"
	}
	if !d.kind(n, path, yaml.MappingNode, want) {
		return out
	}
	keyNodes := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if !d.scalar(k, path, "!!str", "a string key") {
			continue
		}
		kp := join(path, k.Value)
		if prev, dup := keyNodes[k.Value]; dup {
			d.add(k, CodeDuplicate, kp, "duplicate key (first at line %d)", prev.Line)
			continue
		}
		keyNodes[k.Value] = k
		if !slices.Contains(known, k.Value) {
			d.add(k, CodeUnknownKey, kp, "unknown key %q (known here: %s)", k.Value, strings.Join(known, ", "))
			continue
		}
		out[k.Value] = v
	}
	return out
}

// seq checks that n is a list of at most max items and returns them.
func (d *decoder) seq(n *yaml.Node, path string, max int) []*yaml.Node {
	if !d.kind(n, path, yaml.SequenceNode, "a list") {
		return nil
	}
	if len(n.Content) > max {
		d.add(n, CodeTooLarge, path, "%d items; at most %d are allowed", len(n.Content), max)
		return nil
	}
	return n.Content
}

func (d *decoder) str(n *yaml.Node, path string) (string, bool) {
	if !d.scalar(n, path, "!!str", "a string") {
		return "", false
	}
	return n.Value, true
}

func (d *decoder) bool(n *yaml.Node, path string) (bool, bool) {
	if !d.scalar(n, path, "!!bool", "true or false") {
		return false, false
	}
	var b bool
	if err := n.Decode(&b); err != nil {
		d.add(n, CodeWrongType, path, "want true or false, got %q", n.Value)
		return false, false
	}
	return b, true
}

func (d *decoder) int(n *yaml.Node, path string) (int, bool) {
	if !d.scalar(n, path, "!!int", "an integer") {
		return 0, false
	}
	var v int64
	if err := n.Decode(&v); err != nil || v > 1<<40 || v < -(1<<40) {
		d.add(n, CodeBadValue, path, "integer %s is out of range", n.Value)
		return 0, false
	}
	return int(v), true
}

// limit decodes a non-negative count in [min, max].
func (d *decoder) limit(n *yaml.Node, path string, min, max int) (int, bool) {
	v, ok := d.int(n, path)
	if !ok {
		return 0, false
	}
	switch {
	case v < 0:
		d.add(n, CodeNegative, path, "negative limit %d; limits are counts in [%d, %d]", v, min, max)
		return 0, false
	case v < min || v > max:
		d.add(n, CodeBadValue, path, "%d is out of range [%d, %d]", v, min, max)
		return 0, false
	}
	return v, true
}

// size decodes an integer number of bytes or a string such as 64Mi, at
// least min.
func (d *decoder) size(n *yaml.Node, path string, min Size) (Size, bool) {
	if !d.kind(n, path, yaml.ScalarNode, "a size such as 64Mi") {
		return 0, false
	}
	var s Size
	switch n.ShortTag() {
	case "!!int":
		v, ok := d.int(n, path)
		if !ok {
			return 0, false
		}
		if v < 0 {
			d.add(n, CodeNegative, path, "negative size %d", v)
			return 0, false
		}
		s = Size(v)
	case "!!str":
		v, err := ParseSize(n.Value)
		if err != nil {
			code := CodeBadSize
			if strings.HasPrefix(n.Value, "-") {
				code = CodeNegative
			}
			d.add(n, code, path, "%v", err)
			return 0, false
		}
		s = v
	default:
		d.add(n, CodeBadSize, path, "want a size such as 64Mi, 1Gi or a number of bytes, got %s", kindName(n))
		return 0, false
	}
	if s < min || s > MaxSize {
		d.add(n, CodeBadValue, path, "size %s is out of range [%s, %s]", s, min, MaxSize)
		return 0, false
	}
	return s, true
}

// path decodes a path and makes it absolute: a relative path resolves
// against the policy's directory and must stay inside it.
func (d *decoder) path(n *yaml.Node, path string) (string, bool) {
	raw, ok := d.str(n, path)
	if !ok {
		return "", false
	}
	switch {
	case raw == "":
		d.add(n, CodeBadPath, path, "empty path")
		return "", false
	case strings.IndexByte(raw, 0) >= 0:
		d.add(n, CodeBadPath, path, "path %q contains NUL", raw)
		return "", false
	case len(raw) > maxPathLen:
		d.add(n, CodeBadPath, path, "path is longer than %d bytes", maxPathLen)
		return "", false
	case strings.HasPrefix(raw, "~"):
		d.add(n, CodeBadPath, path, "path %q starts with ~, which moat does not expand; write it out in full", raw)
		return "", false
	case filepath.IsAbs(raw):
		d.pos(path, n)
		return filepath.Clean(raw), true
	case d.baseDir == "":
		d.add(n, CodeBadPath, path, "relative path %q needs a policy file to resolve against; use an absolute path", raw)
		return "", false
	}
	abs := filepath.Join(d.baseDir, raw)
	if !fsutil.Within(abs, d.baseDir) {
		d.add(n, CodeEscapes, path, "path %q escapes the policy's directory %s; use an absolute path if you mean %s", raw, d.baseDir, abs)
		return "", false
	}
	// A relative path must not leave the directory through a symlink either.
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		if base, err := filepath.EvalSymlinks(d.baseDir); err == nil && !fsutil.Within(real, base) {
			d.add(n, CodeEscapes, path, "path %q escapes the policy's directory %s through a symlink (it resolves to %s); use an absolute path if you mean it", raw, d.baseDir, real)
			return "", false
		}
	}
	d.pos(path, n)
	return abs, true
}

func (d *decoder) paths(n *yaml.Node, path string) []string {
	items := d.seq(n, path, MaxGrants)
	out := []string{}
	for i, item := range items {
		ip := fmt.Sprintf("%s[%d]", path, i)
		if s, ok := d.path(item, ip); ok {
			out = append(out, s)
			d.grants = append(d.grants, grant{key: ip, path: s})
		}
	}
	return out
}

// pos remembers where a key path was written, for problems found later by
// validate.
func (d *decoder) pos(path string, n *yaml.Node) {
	if d.nodes == nil {
		d.nodes = map[string]*yaml.Node{}
	}
	d.nodes[path] = n
}

const (
	maxNameLen  = 64
	maxModelLen = 256
	maxPathLen  = 4095
)

func validName(s string) bool {
	if s == "" || len(s) > maxNameLen || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

func validEnvName(s string) bool {
	if s == "" || len(s) > maxNameLen*4 || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// checkBaseURL returns "" when s is an https URL, or an http URL whose host
// is a loopback address (127.0.0.0/8, ::1, localhost); otherwise why not.
func checkBaseURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Sprintf("base_url %q is not a URL: %v", s, errors.Unwrap(err))
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Sprintf("base_url %q must start with https:// (or http:// for a loopback address)", s)
	case u.Host == "" || u.Hostname() == "":
		return fmt.Sprintf("base_url %q has no host", s)
	case u.User != nil:
		return fmt.Sprintf("base_url %q carries credentials; put the key in the variable named by credential_env", s)
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return fmt.Sprintf("base_url %q must not have a query or fragment", s)
	case u.Opaque != "":
		return fmt.Sprintf("base_url %q is not a hierarchical URL", s)
	}
	if port := u.Port(); port != "" {
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return fmt.Sprintf("base_url %q has a bad port", s)
		}
	}
	if u.Scheme == "http" && !isLoopbackHost(u.Hostname()) {
		return fmt.Sprintf("base_url %q uses plain http to a non-loopback host; use https:// (http:// is allowed only for 127.0.0.0/8, ::1 and localhost)", s)
	}
	return ""
}

func isLoopbackHost(h string) bool {
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// errText is a short reason for a file system error.
func errText(err error) string {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "does not exist"
	case errors.Is(err, fs.ErrPermission):
		return "permission denied"
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}
