// Package examples holds moat's example policies (minimal.yaml,
// agent-workspace.yaml) and the workspace directory they grant. It has no
// code; its test checks that every example passes `moat policy check`.
package examples
