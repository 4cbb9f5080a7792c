package policy

import (
	"fmt"
	"strings"
)

// Problem codes: one per kind of mistake, stable for tests and tools.
const (
	CodeSyntax      = "syntax"       // not YAML, or more than one document
	CodeTooLarge    = "too_large"    // file or list above its named limit
	CodeUnknownKey  = "unknown_key"  // a key the schema does not have
	CodeDuplicate   = "duplicate"    // a key, grant, provider or model given twice
	CodeWrongType   = "wrong_type"   // e.g. a string where a number is wanted
	CodeAlias       = "alias"        // YAML anchors and aliases are not supported
	CodeNull        = "null"         // an explicit null: remove the key instead
	CodeBadValue    = "bad_value"    // a value outside its allowed set or range
	CodeRootID      = "root_id"      // uid, gid, host_uid or host_gid 0
	CodeNegative    = "negative"     // a negative limit
	CodeBadSize     = "bad_size"     // a size that is not an integer or NNKi/Mi/Gi/Ti
	CodeBadPath     = "bad_path"     // empty, NUL, "~", not absolute after resolution
	CodeEscapes     = "escapes"      // a relative path that leaves the policy's directory
	CodeNotFound    = "not_found"    // a grant or file that does not exist
	CodeSymlink     = "symlink"      // a grant through a symlink others can plant
	CodeBadType     = "bad_type"     // a grant that is neither a directory nor a regular file
	CodeForbidden   = "forbidden"    // a grant of /, /proc, /sys or /dev
	CodeAuditInside = "audit_inside" // the audit directory overlaps a grant
	CodeURL         = "bad_url"      // a base_url that is not https or loopback http
	CodeMissing     = "missing"      // a required key is absent
)

// Problem is one thing wrong with a policy.
type Problem struct {
	Code    string `json:"code"`
	Path    string `json:"path"`           // key path, e.g. filesystem.read_write[1]; "" for the document
	Line    int    `json:"line,omitempty"` // 1-based; 0 when not from a file position
	Column  int    `json:"column,omitempty"`
	Message string `json:"message"`
}

// String formats p as "line L: path: message".
func (p Problem) String() string {
	var b strings.Builder
	if p.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", p.Line)
	}
	if p.Path != "" {
		b.WriteString(p.Path)
		b.WriteString(": ")
	}
	b.WriteString(p.Message)
	return b.String()
}

// MaxProblems caps how many problems one load reports.
const MaxProblems = 100

// Error holds every problem found in a policy. Load and Parse return it
// (as error) whenever the policy is not valid.
type Error struct {
	File     string    `json:"file,omitempty"` // absolute path, "" for Parse
	Problems []Problem `json:"problems"`
}

// Error lists all problems, one per line, each prefixed with the file name
// when known.
func (e *Error) Error() string {
	var b strings.Builder
	if len(e.Problems) > 1 {
		fmt.Fprintf(&b, "%d problems:", len(e.Problems))
	}
	for i, p := range e.Problems {
		if len(e.Problems) > 1 {
			b.WriteString("\n  ")
		} else if i > 0 {
			b.WriteString("\n")
		}
		if e.File != "" {
			b.WriteString(e.File)
			if p.Line > 0 {
				fmt.Fprintf(&b, ":%d: ", p.Line)
				p.Line = 0
			} else {
				b.WriteString(": ")
			}
		}
		b.WriteString(p.String())
	}
	if len(e.Problems) == 0 {
		b.WriteString("BUG: policy error without problems")
	}
	return b.String()
}

// Has reports whether e holds a problem with code at key path (path "" matches any path).
func (e *Error) Has(code, path string) bool {
	for _, p := range e.Problems {
		if p.Code == code && (path == "" || p.Path == path) {
			return true
		}
	}
	return false
}
