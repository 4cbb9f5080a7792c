package sandbox

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/boundary"
)

// readyState writes a Ready sandbox named name whose supervisor is this
// test process (alive), and returns its directory.
func readyState(t *testing.T, name string) string {
	t.Helper()
	t.Setenv("MOAT_STATE_DIR", t.TempDir())
	st, err := openStore()
	if err != nil {
		t.Fatal(err)
	}
	dir := st.sandboxDir(name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := writeState(dir, &State{Name: name, Phase: boundary.PhaseReady, Backend: "native",
		SupervisorPID: os.Getpid(), SupervisorStart: procStart(os.Getpid()), Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Exec asks the supervisor nothing before its exec request; a supervisor
// that does not answer it is refused as not ready, as get reports it.
// Control: one that answers gets exactly one request, the exec, and its
// exit code is returned.
func TestExecOneRoundTrip(t *testing.T) {
	dir := readyState(t, "w")
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	code, err := Exec(context.Background(), "w", []string{"/bin/true"}, false, devnull, devnull, devnull)
	if code != ExitRefused || err == nil || !strings.Contains(err.Error(), "sandbox w is not ready: the supervisor does not answer") {
		t.Fatalf("no control socket: got %d, %v; want %d and the supervisor named as not answering", code, err, ExitRefused)
	}

	ln, err := net.Listen("unix", filepath.Join(dir, controlSock))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ops := make(chan string, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			var req controlRequest
			line, _ := bufio.NewReader(c).ReadBytes('\n')
			json.Unmarshal(line, &req)
			ops <- req.Op
			if req.Op == "exec" {
				json.NewEncoder(c).Encode(execReply{Started: "p1"})
				json.NewEncoder(c).Encode(execReply{Exited: true, Code: 7})
			}
			c.Close()
		}
	}()
	code, err = Exec(context.Background(), "w", []string{"/bin/true"}, false, devnull, devnull, devnull)
	if code != 7 || err != nil {
		t.Fatalf("with an answering supervisor: got %d, %v; want 7, nil", code, err)
	}
	ln.Close()
	close(ops)
	var got []string
	for op := range ops {
		got = append(got, op)
	}
	if strings.Join(got, ",") != "exec" {
		t.Errorf("requests to the supervisor: %v, want just [exec]", got)
	}
}
