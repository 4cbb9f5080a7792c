package examples

import _ "embed"

// Minimal is minimal.yaml, for tests that run the shipped example from a
// test binary copied away from the source tree (the e2e tests).
//
//go:embed minimal.yaml
var Minimal []byte
