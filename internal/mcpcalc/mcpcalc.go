// Package mcpcalc is a small MCP server on stdio, built on the official
// Go SDK: the example tool server that ships with moat
// (examples/mcp-calc is its command) and the one that `moat demo` and
// `moat evidence run` start as the hidden helper __moat-demo-calc of the
// moat binary itself, so that they need no second binary. Its tools:
//
//	add   {"a": number, "b": number}  the sum
//	mul   {"a": number, "b": number}  the product
//	env   {"name": string}            whether the variable is set in the
//	                                  server's environment (to show what
//	                                  moat gives a server, never its value)
//
// With --log FILE it appends one JSON line per call it receives: the tool
// and the exact bytes of its arguments, as they arrived. Tests and the
// evidence suite read that log as the server's own observation of what
// reached it.
package mcpcalc

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/internal/reexec"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

type pair struct {
	A float64 `json:"a" jsonschema:"the first operand"`
	B float64 `json:"b" jsonschema:"the second operand"`
}

type envIn struct {
	Name string `json:"name" jsonschema:"an environment variable name"`
}

// callLog appends one line per call: {"tool":…,"arguments":<raw>}.
type callLog struct {
	mu sync.Mutex
	f  *os.File
}

func (l *callLog) record(tool string, raw json.RawMessage) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	line, _ := json.Marshal(struct {
		Tool      string `json:"tool"`
		Arguments string `json:"arguments"`
	}{tool, string(raw)})
	l.f.Write(append(line, '\n'))
	l.f.Sync()
}

func text(s string) *sdk.CallToolResult {
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: s}}}
}

// Helper is the hidden helper name under which the moat binary runs the
// server (internal/cli/hidden.go).
const Helper = reexec.Prefix + "demo-calc"

// HelperMain is the hidden helper's entry: the server, whose detached
// child (--detach-child) is the moat binary's helper again.
func HelperMain(args []string) int { return Main(args, []string{Helper}) }

// Main runs the server with args (without the program name) and returns
// its exit code. self are the arguments that make this executable the
// server again (none for the example command, the helper name for moat),
// for the detached child.
func Main(args []string, self []string) int {
	fs := flag.NewFlagSet("mcp-calc", flag.ContinueOnError)
	logPath := fs.String("log", "", "append a line per call received to this file")
	detach := fs.Bool("detach-child", false, "start a detached child (setsid) that outlives this server: tests use it to show that moat reaps a server's descendants")
	sleep := fs.Bool("sleep", false, "sleep for ever (the detached child)")
	var dials []string
	fs.Func("dial", "NETWORK:ADDRESS (tcp or udp) to try to send to when starting, the result on stderr: tests use it to show that a server's sandbox has no network", func(v string) error {
		dials = append(dials, v)
		return nil
	})
	if err := fs.Parse(args); err != nil || fs.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: mcp-calc [--log FILE] [--detach-child]")
		return 2
	}
	if *sleep {
		for {
			time.Sleep(time.Hour)
		}
	}
	// Servers log to stderr; moat keeps it from the workload.
	fmt.Fprintf(os.Stderr, "mcp-calc: serving on stdio (pid %d)\n", os.Getpid())
	for _, d := range dials {
		network, addr, _ := strings.Cut(d, ":")
		c, err := net.DialTimeout(network, addr, 2*time.Second)
		if err == nil {
			_, err = c.Write([]byte("mcp-calc escape\n"))
			c.Close()
		}
		fmt.Fprintf(os.Stderr, "mcp-calc: dial %s: %v\n", d, err)
	}
	if *detach {
		if err := detachChild(self); err != nil {
			fmt.Fprintln(os.Stderr, "mcp-calc:", err)
			return 1
		}
	}
	var log *callLog
	if *logPath != "" {
		f, err := os.OpenFile(*logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			fmt.Fprintln(os.Stderr, "mcp-calc:", err)
			return 1
		}
		log = &callLog{f: f}
	}
	s := sdk.NewServer(&sdk.Implementation{Name: "mcp-calc", Version: "1"}, nil)
	// Each handler logs the raw arguments before anything else, so that
	// the log shows every call that reached the server.
	s.AddReceivingMiddleware(func(next sdk.MethodHandler) sdk.MethodHandler {
		return func(ctx context.Context, method string, req sdk.Request) (sdk.Result, error) {
			if ct, ok := req.(*sdk.CallToolRequest); ok && method == "tools/call" {
				log.record(ct.Params.Name, ct.Params.Arguments)
			}
			return next(ctx, method, req)
		}
	})
	sdk.AddTool(s, &sdk.Tool{Name: "add", Description: "Add two numbers."}, func(_ context.Context, _ *sdk.CallToolRequest, in pair) (*sdk.CallToolResult, any, error) {
		return text(fmt.Sprint(in.A + in.B)), nil, nil
	})
	sdk.AddTool(s, &sdk.Tool{Name: "mul", Description: "Multiply two numbers."}, func(_ context.Context, _ *sdk.CallToolRequest, in pair) (*sdk.CallToolResult, any, error) {
		return text(fmt.Sprint(in.A * in.B)), nil, nil
	})
	sdk.AddTool(s, &sdk.Tool{Name: "env", Description: "Say whether an environment variable is set in this server."}, func(_ context.Context, _ *sdk.CallToolRequest, in envIn) (*sdk.CallToolResult, any, error) {
		_, set := os.LookupEnv(in.Name)
		return text(fmt.Sprintf("%s set: %t", in.Name, set)), nil, nil
	})
	if err := s.Run(context.Background(), &sdk.StdioTransport{}); err != nil {
		fmt.Fprintln(os.Stderr, "mcp-calc:", err)
		return 1
	}
	return 0
}

// detachChild starts this binary again with --sleep in a new session,
// stdio closed, and does not wait for it.
func detachChild(self []string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(exe, append(append([]string{}, self...), "--sleep")...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	return cmd.Process.Release()
}
