package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"
)

// Output formats for -o. A command's default (no -o) is its text form;
// -o names one of the machine forms that command supports.
const (
	formatJSON = "json"
	formatYAML = "yaml"
)

// outputFlag is the value of -o/--output. Set refuses a format the command
// does not support, so that cobra rejects it while parsing flags: before
// any work, with exit 125 and the allowed values named.
type outputFlag struct {
	value   string
	allowed []string
}

func (o *outputFlag) String() string { return o.value }
func (o *outputFlag) Type() string   { return "format" }

func (o *outputFlag) Set(s string) error {
	if !slices.Contains(o.allowed, s) {
		return fmt.Errorf("unsupported output format %q (allowed: %s)", s, strings.Join(o.allowed, ", "))
	}
	o.value = s
	return nil
}

// addOutput registers -o/--output on cmd with the formats it supports
// (json and yaml when none are named) and returns the flag; its value is
// "" when -o was not given.
func addOutput(cmd *cobra.Command, allowed ...string) *outputFlag {
	if len(allowed) == 0 {
		allowed = []string{formatJSON, formatYAML}
	}
	o := &outputFlag{allowed: allowed}
	usage := "output format: " + strings.Join(allowed, " or ")
	if allowed[0] != formatYAML {
		usage += " (without -o: text for people)"
	}
	cmd.Flags().VarP(o, "output", "o", usage)
	return o
}

// machine reports whether a machine format (json or yaml) was asked for.
func (o *outputFlag) machine() bool { return o.value != "" }

// write prints v in the chosen machine format. YAML is made from the JSON
// encoding (so both forms have the same field names and the same order),
// with every scalar style left to the encoder: a string that would read
// back as another type ("true", "0123", "") stays quoted.
func (o *outputFlag) write(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return exitf(ExitRefused, "BUG: encoding the output: %v", err)
	}
	if o.value != formatYAML {
		_, err = w.Write(append(b, '\n'))
		return err
	}
	y, err := jsonToYAML(b)
	if err != nil {
		return exitf(ExitRefused, "BUG: encoding the output as YAML: %v", err)
	}
	_, err = w.Write(y)
	return err
}

// jsonToYAML re-encodes a JSON document as block-style YAML, keeping the
// member order.
func jsonToYAML(b []byte) ([]byte, error) {
	var n yaml.Node
	if err := yaml.Unmarshal(b, &n); err != nil {
		return nil, err
	}
	plain(&n)
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&n); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// plain drops the flow and quoting styles that the JSON source gave each
// node, so the encoder writes block YAML and quotes only where needed.
func plain(n *yaml.Node) {
	n.Style = 0
	for _, c := range n.Content {
		plain(c)
	}
}
