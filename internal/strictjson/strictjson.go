// Package strictjson decodes JSON strictly (RFC 8259, with duplicate object
// names, invalid UTF-8, lone surrogates and trailing data refused) and
// encodes it canonically (RFC 8785, JCS). It wraps
// github.com/go-json-experiment/json/jsontext, whose defaults already refuse
// duplicate names and invalid UTF-8.
package strictjson

import (
	"fmt"

	"github.com/go-json-experiment/json/jsontext"
)

// MaxDepth caps nesting so that hostile input cannot exhaust the stack.
const MaxDepth = 128

// Canonicalize validates b strictly and returns its RFC 8785 canonical form.
func Canonicalize(b []byte) ([]byte, error) {
	v := jsontext.Value(append([]byte(nil), b...))
	if err := v.Canonicalize(); err != nil {
		return nil, fmt.Errorf("strictjson: %w", err)
	}
	return v, nil
}
