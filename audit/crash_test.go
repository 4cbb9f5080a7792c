package audit

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// crashRuns is how many writer processes the crash test kills.
const crashRuns = 220

// crashParallel is how many writers run (and are killed) at once.
const crashParallel = 4

// startWriter re-runs the test binary as a writer subprocess of role into
// dir, and returns it with a reader of its ACK lines.
func startWriter(role, dir string, records int) (*exec.Cmd, io.ReadCloser, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(exe, helperName(role), dir, strconv.Itoa(records))
	cmd.Stderr = new(bytes.Buffer)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	return cmd, out, nil
}

type crashOutcome int

const (
	crashNoJournal crashOutcome = iota
	crashIncomplete
	crashTorn
	crashComplete
)

// crashOnce runs one writer into dir, SIGKILLs it at a random moment
// (unless finish), and checks what it left. It returns the outcome and the
// number of acknowledged records.
func crashOnce(dir string, finish bool, early bool, rng *rand.Rand) (crashOutcome, int, error) {
	records := 0
	if finish {
		records = 40
	}
	cmd, out, err := startWriter("writer", dir, records)
	if err != nil {
		return 0, 0, err
	}
	acks := make(chan []string, 1)
	first := make(chan struct{})
	go func() {
		var got []string
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			// A line cut short by the kill has no full hash; it was never an ACK.
			if h, ok := strings.CutPrefix(sc.Text(), "ACK "); ok && len(h) == 64 {
				if got = append(got, h); len(got) == 1 {
					close(first)
				}
			}
		}
		acks <- got
	}()
	switch {
	case finish:
	case early:
		// Any moment from the start: before Create, during it, or during
		// the first records.
		time.Sleep(time.Duration(rng.IntN(40000)) * time.Microsecond)
		cmd.Process.Signal(syscall.SIGKILL)
	default:
		// A random moment while records are being appended.
		select {
		case <-first:
		case <-time.After(30 * time.Second):
		}
		time.Sleep(time.Duration(rng.IntN(15000)) * time.Microsecond)
		cmd.Process.Signal(syscall.SIGKILL)
	}
	acked := <-acks
	if err := cmd.Wait(); finish && err != nil {
		return 0, 0, fmt.Errorf("writer failed: %v: %s", err, cmd.Stderr)
	}
	journal, err := os.ReadFile(filepath.Join(dir, JournalFile))
	if errors.Is(err, os.ErrNotExist) {
		if len(acked) != 0 {
			return 0, 0, fmt.Errorf("%d acknowledged records but no journal", len(acked))
		}
		return crashNoJournal, 0, nil
	}
	if err != nil {
		return 0, 0, err
	}
	pemBytes, err := os.ReadFile(filepath.Join(dir, PublicKeyFile))
	if err != nil {
		return 0, 0, fmt.Errorf("journal exists but pubkey.pem does not: %w", err)
	}
	pub, err := ParsePublicKeyPEM(pemBytes)
	if err != nil {
		return 0, 0, err
	}
	r := Verify(journal, pub)
	var oc crashOutcome
	switch {
	case r.Status == Invalid:
		return 0, 0, fmt.Errorf("killed journal verifies as invalid: %s", r.Reason)
	case finish && r.Status != Complete:
		return 0, 0, fmt.Errorf("finished writer left %v: %s", r.Status, r.Reason)
	case r.Status == Complete:
		oc = crashComplete
	case errors.Is(r.Err, ErrTornTail):
		oc = crashTorn
	default:
		oc = crashIncomplete
	}
	present := map[string]bool{}
	for _, l := range bytes.Split(journal, []byte("\n")) {
		present[LineHash(l)] = true
	}
	for _, h := range acked {
		if !present[h] {
			return 0, 0, fmt.Errorf("an acknowledged record (line sha256 %s) is missing from the journal", h)
		}
	}
	return oc, len(acked), nil
}

// TestCrashKill SIGKILLs writer processes at random moments. Each journal
// left behind is never invalid, and every line whose Append had returned
// (acknowledged on the writer's stdout) is in it. Writers that are let
// finish leave a complete journal.
func TestCrashKill(t *testing.T) {
	base := t.TempDir()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	var (
		mu      sync.Mutex
		counts  [4]int
		acked   int
		next    int
		wg      sync.WaitGroup
		failure error
	)
	for g := range crashParallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(g)))
			for {
				mu.Lock()
				i := next
				next++
				stop := i >= crashRuns || failure != nil
				mu.Unlock()
				if stop {
					return
				}
				oc, n, err := crashOnce(filepath.Join(base, "run"+strconv.Itoa(i)), i%20 == 19, i%10 == 0, rng)
				mu.Lock()
				if err != nil && failure == nil {
					failure = fmt.Errorf("run %d: %w", i, err)
				}
				counts[oc]++
				acked += n
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if failure != nil {
		t.Fatal(failure)
	}
	t.Logf("%d runs: %d complete, %d incomplete, %d torn tails, %d killed before the journal existed; %d acknowledged records all present",
		crashRuns, counts[crashComplete], counts[crashIncomplete], counts[crashTorn], counts[crashNoJournal], acked)
	if killed := counts[crashIncomplete] + counts[crashTorn]; killed < crashRuns*3/4 {
		t.Errorf("only %d runs were killed mid-journal; the test did not exercise crashes", killed)
	}
	if counts[crashComplete] != crashRuns/20 {
		t.Errorf("%d complete journals, want %d", counts[crashComplete], crashRuns/20)
	}
}
