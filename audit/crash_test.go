package audit

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// crashRuns is how many writer processes the crash test kills.
const crashRuns = 220

// startWriter re-runs the test binary as a writer subprocess of role into
// dir, and returns it with a reader of its ACK lines.
func startWriter(t *testing.T, role, dir string, records int) (*exec.Cmd, io.ReadCloser) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), helperEnv+"="+role, helperDir+"="+dir, helperN+"="+strconv.Itoa(records))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, out
}

// TestCrashKill SIGKILLs writer processes at random moments. Each journal
// left behind is never invalid, and every line whose Append had returned
// (acknowledged on the writer's stdout) is in it. Writers that are let
// finish leave a complete journal.
func TestCrashKill(t *testing.T) {
	base := t.TempDir()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	var stats struct{ complete, incomplete, torn, noJournal, acked int }
	for i := range crashRuns {
		dir := filepath.Join(base, "run"+strconv.Itoa(i))
		finish := i%20 == 19 // every 20th run is let finish
		records := 0
		if finish {
			records = 40
		}
		cmd, out := startWriter(t, "writer", dir, records)
		acks := make(chan []string, 1)
		first := make(chan struct{})
		go func() {
			var got []string
			sc := bufio.NewScanner(out)
			for sc.Scan() {
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
		case i%10 == 0:
			// Any moment from the start: before Create, during it, or
			// during the first records.
			time.Sleep(time.Duration(rng.IntN(40000)) * time.Microsecond)
			cmd.Process.Signal(syscall.SIGKILL)
		default:
			// A random moment while records are being appended.
			select {
			case <-first:
			case <-time.After(10 * time.Second):
				t.Fatalf("run %d: writer made no record in 10s", i)
			}
			time.Sleep(time.Duration(rng.IntN(15000)) * time.Microsecond)
			cmd.Process.Signal(syscall.SIGKILL)
		}
		acked := <-acks
		err := cmd.Wait()
		if finish && err != nil {
			t.Fatalf("run %d: writer failed: %v: %s", i, err, cmd.Stderr)
		}
		stats.acked += len(acked)
		journal, jerr := os.ReadFile(filepath.Join(dir, JournalFile))
		if errors.Is(jerr, os.ErrNotExist) {
			if len(acked) != 0 {
				t.Fatalf("run %d: %d acknowledged records but no journal", i, len(acked))
			}
			stats.noJournal++
			continue
		}
		if jerr != nil {
			t.Fatal(jerr)
		}
		pemBytes, err := os.ReadFile(filepath.Join(dir, PublicKeyFile))
		if err != nil {
			t.Fatalf("run %d: journal exists but pubkey.pem does not: %v", i, err)
		}
		pub, err := ParsePublicKeyPEM(pemBytes)
		if err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		r := Verify(journal, pub)
		switch {
		case r.Status == Invalid:
			t.Fatalf("run %d: killed journal verifies as invalid: %s", i, r.Reason)
		case finish && r.Status != Complete:
			t.Fatalf("run %d: finished writer left %v: %s", i, r.Status, r.Reason)
		case r.Status == Complete:
			stats.complete++
		case errors.Is(r.Err, ErrTornTail):
			stats.torn++
		default:
			stats.incomplete++
		}
		present := map[string]bool{}
		for _, l := range bytes.Split(journal, []byte("\n")) {
			present[LineHash(l)] = true
		}
		for _, h := range acked {
			if !present[h] {
				t.Fatalf("run %d: an acknowledged record (line sha256 %s) is missing from the journal", i, h)
			}
		}
	}
	t.Logf("%d runs: %d complete, %d incomplete, %d torn tails, %d killed before the journal existed; %d acknowledged records all present",
		crashRuns, stats.complete, stats.incomplete, stats.torn, stats.noJournal, stats.acked)
	if stats.incomplete+stats.torn < crashRuns*3/4 {
		t.Errorf("only %d runs were killed mid-journal; the test did not exercise crashes", stats.incomplete+stats.torn)
	}
}
