//go:build !moat_lying_backend

package cli

import "github.com/moat-sandbox/moat/boundary"

// Release builds have no test backend (see lying.go).
func testBackends() []boundary.Backend { return nil }
