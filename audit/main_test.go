package audit

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"

	"github.com/moat-sandbox/moat/internal/reexec"
	"github.com/moat-sandbox/moat/internal/reexec/reexectest"

	"github.com/moat-sandbox/moat/confirmation"
)

// The test binary re-runs itself as a writer subprocess (role "writer",
// "writer-nosync" or "writer-nokeysync", arguments DIR RECORDS) or as the fault scenario (role
// "fault", argument DIR); helperName is a role's helper.
func helperName(role string) string { return reexec.Prefix + "test-audit-" + role }

func TestMain(m *testing.M) {
	reexectest.Main(m,
		reexec.Helper{Name: helperName("writer"), Main: func(args []string) int { return helperWriter(false, args) }},
		reexec.Helper{Name: helperName("writer-nosync"), Main: func(args []string) int { return helperWriter(true, args) }},
		reexec.Helper{Name: helperName("writer-nokeysync"), Main: func(args []string) int {
			// The journal synced, its key and directory never: the strace
			// test's negative control for checkCreatedBeforeAck.
			syncCreated = func(kf *os.File, dir string) error { return kf.Close() }
			return helperWriter(false, args)
		}},
		reexec.Helper{Name: helperName("fault"), Main: helperFault})
}

// helperWriter appends records from several goroutines into the run
// directory args[0], printing "ACK <sha256 of line>" to stdout after each
// Append returns. With args[1] = n > 0 it stops after n records and
// appends run.terminated; otherwise it runs until killed. noSync disables
// the fsync (the strace test's negative control).
func helperWriter(noSync bool, args []string) int {
	if len(args) != 2 {
		fmt.Fprintln(os.Stderr, "want DIR RECORDS")
		return 3
	}
	w, err := Create(args[0], "crash-test")
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
	n, _ := strconv.Atoi(args[1])
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
