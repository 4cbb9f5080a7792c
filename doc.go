// Package moat is the root of the moat module. It holds no code of its own:
// the end-to-end tests here drive the real `moat` binary, as a user would.
// See README.md, and ../shared/DESIGN.md for the architecture.
package moat
