package policy

import _ "embed"

//go:embed schema.json
var schema []byte

// Schema returns the JSON Schema (draft 2020-12) of the policy file, for
// editors and linters. It describes keys, types and ranges; the checks
// that need the file system or the whole policy are made only by Load.
func Schema() []byte { return append([]byte(nil), schema...) }
