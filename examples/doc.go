// Package examples holds moat's example policies (minimal.yaml,
// agent-workspace.yaml) and the workspace directory they grant. Its only
// code embeds minimal.yaml for the e2e tests; its test checks that every
// example passes `moat policy check`.
package examples
