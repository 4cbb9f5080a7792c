package audit

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"

	"github.com/moat-sandbox/moat/confirmation"
)

// helperEnv selects a helper role when the test binary is re-run as a
// writer subprocess; helperDir is the run directory it writes.
const (
	helperEnv = "MOAT_AUDIT_TEST_HELPER"
	helperDir = "MOAT_AUDIT_TEST_DIR"
	helperN   = "MOAT_AUDIT_TEST_RECORDS"
)

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		os.Exit(m.Run())
	case "writer":
		os.Exit(helperWriter(false))
	case "writer-nosync":
		os.Exit(helperWriter(true))
	case "fault":
		os.Exit(helperFault())
	default:
		fmt.Fprintf(os.Stderr, "unknown %s=%q\n", helperEnv, os.Getenv(helperEnv))
		os.Exit(3)
	}
}

// helperWriter appends records from several goroutines into the run
// directory named by helperDir, printing "ACK <sha256 of line>" to stdout
// after each Append returns. With helperN=n>0 it stops after n records and
// appends run.terminated; otherwise it runs until killed. noSync disables
// the fsync (the strace test's negative control).
func helperWriter(noSync bool) int {
	w, err := Create(os.Getenv(helperDir), "crash-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	w.skipSync = noSync
	out := bufio.NewWriter(os.Stdout)
	var mu sync.Mutex
	ack := func(line []byte) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, "ACK %s\n", LineHash(line))
		out.Flush() // one write(2) per ACK, after Append returned
	}
	must := func(r Record) {
		line, err := w.Append(r)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		ack(line)
	}
	must(RunStarted{PolicySHA256: "p", Backend: "native", BinarySHA256: "b", PublicKey: string(w.PublicKeyPEM())})
	must(BoundaryConfirmed{Ready: true})
	n, _ := strconv.Atoi(os.Getenv(helperN))
	const workers = 4
	var wg sync.WaitGroup
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; n <= 0 || i < n/workers; i++ {
				must(InferenceRequested{RequestID: fmt.Sprintf("g%d-%d", g, i), Provider: "anthropic", Model: "m",
					Attribution: Attribution{Status: confirmation.AttributionUnavailable, Reason: "test"}})
			}
		}()
	}
	wg.Wait()
	must(RunTerminated{Reason: ReasonCompleted})
	if err := w.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}
