package ledger

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The helper process of TestCrossProcess and TestCrashKeepsCharge: it
// reserves (and settles) against the ledger named in its environment.
func TestMain(m *testing.M) {
	if dir := os.Getenv("LEDGER_TEST_HELPER"); dir != "" {
		os.Exit(helper(dir))
	}
	os.Exit(m.Run())
}

func helper(dir string) int {
	l, err := Open(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	acct, mode := os.Getenv("LEDGER_TEST_ACCOUNT"), os.Getenv("LEDGER_TEST_MODE")
	served := 0
	for i := 0; ; i++ {
		id := fmt.Sprintf("%s-%d-%d", acct, os.Getpid(), i)
		if _, err := l.Reserve(id, acct, 10); err != nil {
			if errors.Is(err, ErrExhausted) {
				fmt.Println(served)
				return 0
			}
			fmt.Fprintln(os.Stderr, err)
			return 3
		}
		if mode == "hang" {
			fmt.Println("reserved")
			time.Sleep(time.Hour)
		}
		served++
		if _, _, err := l.Settle(id, 7); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 3
		}
	}
}

func newLedger(t *testing.T) *Ledger {
	t.Helper()
	l, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestReserveSettleKeep(t *testing.T) {
	l := newLedger(t)
	if err := l.AddAccount("p", "", 5, 100); err != nil {
		t.Fatal(err)
	}
	if err := l.AddAccount("c", "p", 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := l.AddAccount("g", "c", 3, 0); err != nil {
		t.Fatal(err)
	}
	// Positive control: a grandchild within every cap is served, and the
	// charge lands on all three accounts.
	bal, err := l.Reserve("r1", "g", 40)
	if err != nil {
		t.Fatal(err)
	}
	if len(bal) != 3 || bal[2].Account != "p" || bal[2].Tokens != 40 || bal[0].Requests != 1 {
		t.Fatalf("balances %+v", bal)
	}
	// Settled with less than reserved: the difference is returned.
	bal, res, err := l.Settle("r1", 15)
	if err != nil || res != 40 || bal[2].Tokens != 15 || bal[1].Tokens != 15 {
		t.Fatalf("settle: %+v %d %v", bal, res, err)
	}
	// Kept: the reservation stays charged.
	if _, err := l.Reserve("r2", "c", 50); err != nil {
		t.Fatal(err)
	}
	if bal, _, err := l.Keep("r2"); err != nil || bal[1].Tokens != 65 {
		t.Fatalf("keep: %+v %v", bal, err)
	}
	// The parent's token cap refuses what would pass it, naming it.
	if _, err := l.Reserve("r3", "g", 36); !errors.Is(err, ErrExhausted) {
		t.Fatalf("over the parent's tokens: %v", err)
	}
	if _, err := l.Reserve("r3", "g", 35); err != nil {
		t.Fatalf("exactly the parent's tokens left: %v", err)
	}
	// The grandchild's own request cap (3): it has used 2.
	if _, err := l.Reserve("r4", "g", 0); err != nil {
		t.Fatalf("grandchild's third request: %v", err)
	}
	if _, err := l.Reserve("r5", "g", 0); !errors.Is(err, ErrExhausted) {
		t.Fatalf("grandchild past its own 3 requests: %v", err)
	}
	// The parent's request cap (5): 4 used, the child may take 1 more.
	for i, want := range []bool{true, false} {
		_, err := l.Reserve(fmt.Sprint("c", i), "c", 0)
		if (err == nil) != want {
			t.Fatalf("child request %d: %v", i, err)
		}
	}
	// Unknown things are refused.
	if _, err := l.Reserve("x", "nosuch", 1); !errors.Is(err, ErrUnknown) {
		t.Errorf("unknown account: %v", err)
	}
	if _, _, err := l.Settle("nosuch", 1); !errors.Is(err, ErrUnknown) {
		t.Errorf("unknown reservation: %v", err)
	}
	if _, err := l.Reserve("r3", "p", 0); err == nil {
		t.Error("a reservation id used twice was accepted")
	}
	if err := l.AddAccount("c", "p", 0, 0); err == nil {
		t.Error("duplicate account accepted")
	}
	if err := l.AddAccount("z", "nosuch", 0, 0); !errors.Is(err, ErrUnknown) {
		t.Errorf("account under a missing parent: %v", err)
	}
}

// TestConcurrentGoroutines: many goroutines on many children, each with
// its own Ledger value (so its own lock file descriptions, as separate
// processes have), never overspend the parent; the parent's caps are met
// exactly.
func TestConcurrentGoroutines(t *testing.T) {
	dir := t.TempDir()
	root, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	const children, workers, maxReq, maxTok = 8, 64, 150, 1000
	root.AddAccount("p", "", maxReq, maxTok)
	for i := range children {
		root.AddAccount(fmt.Sprint("c", i), "p", 0, 0)
	}
	var served, tokens atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, _ := Open(dir)
			acct := fmt.Sprint("c", w%children)
			for i := 0; ; i++ {
				id := fmt.Sprint(w, "-", i)
				n := int64(1 + (w+i)%9)
				if _, err := l.Reserve(id, acct, n); err != nil {
					if !errors.Is(err, ErrExhausted) {
						t.Error(err)
					}
					return
				}
				served.Add(1)
				used := n - int64(i%2) // settle at or below the reservation
				var err error
				if i%5 == 0 {
					_, _, err = l.Keep(id)
					used = n
				} else {
					_, _, err = l.Settle(id, used)
				}
				if err != nil {
					t.Error(err)
					return
				}
				tokens.Add(used)
			}
		}()
	}
	wg.Wait()
	st, err := root.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	p := st.Accounts["p"]
	if p.Requests > maxReq || p.Tokens > maxTok || served.Load() != p.Requests || tokens.Load() != p.Tokens {
		t.Fatalf("parent %+v; served %d, tokens %d", p, served.Load(), tokens.Load())
	}
	var sum int64
	for i := range children {
		sum += st.Accounts[fmt.Sprint("c", i)].Requests
	}
	if sum != p.Requests || len(st.Reservations) != 0 {
		t.Fatalf("children's requests %d, parent's %d, open %d", sum, p.Requests, len(st.Reservations))
	}
	// The run ends when a cap is met: one of the two must be (nearly)
	// used up, otherwise the workers stopped for nothing.
	if p.Requests != maxReq && p.Tokens < maxTok-9 {
		t.Fatalf("workers stopped with budget left: %+v", p)
	}
}

// TestCrossProcess: eight processes draw on one parent's request cap;
// the number served equals the cap exactly.
func TestCrossProcess(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	const procs, maxReq = 8, 97
	l.AddAccount("p", "", maxReq, 0)
	cmds := make([]*exec.Cmd, procs)
	outs := make([][]byte, procs)
	var wg sync.WaitGroup
	for i := range procs {
		l.AddAccount(fmt.Sprint("c", i), "p", 0, 0)
		cmds[i] = exec.Command(os.Args[0], "-test.run=^$")
		cmds[i].Env = append(os.Environ(), "LEDGER_TEST_HELPER="+dir, fmt.Sprint("LEDGER_TEST_ACCOUNT=c", i))
	}
	for i := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i], _ = cmds[i].Output()
		}()
	}
	wg.Wait()
	total := 0
	for i, o := range outs {
		n, err := strconv.Atoi(string(o[:max(len(o)-1, 0)]))
		if err != nil || cmds[i].ProcessState.ExitCode() != 0 {
			t.Fatalf("helper %d: %q exit %d", i, o, cmds[i].ProcessState.ExitCode())
		}
		total += n
	}
	st, _ := l.Snapshot()
	if total != maxReq || st.Accounts["p"].Requests != maxReq || st.Accounts["p"].Tokens != 7*maxReq {
		t.Fatalf("served %d, parent %+v; want %d requests", total, st.Accounts["p"], maxReq)
	}
}

// TestCrashKeepsCharge: a process killed holding a reservation leaves it
// charged (and leaves the lock free).
func TestCrashKeepsCharge(t *testing.T) {
	dir := t.TempDir()
	l, _ := Open(dir)
	l.AddAccount("p", "", 0, 100)
	l.AddAccount("c", "p", 0, 0)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "LEDGER_TEST_HELPER="+dir, "LEDGER_TEST_ACCOUNT=c", "LEDGER_TEST_MODE=hang")
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 9)
	if n, err := out.Read(buf); err != nil || string(buf[:n]) != "reserved\n" {
		t.Fatalf("helper: %q %v", buf[:n], err)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	st, err := l.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if st.Accounts["p"].Tokens != 10 || len(st.Reservations) != 1 {
		t.Fatalf("after the crash: %+v, open %d", st.Accounts["p"], len(st.Reservations))
	}
	// The charge counts: 90 tokens are left, not 100.
	if _, err := l.Reserve("a", "c", 91); !errors.Is(err, ErrExhausted) {
		t.Fatalf("reserve past the kept charge: %v", err)
	}
	if _, err := l.Reserve("b", "c", 90); err != nil {
		t.Fatalf("control: %v", err)
	}
}

// A damaged ledger refuses everything (fail closed); a stale temporary
// file from a crash mid-write is ignored.
func TestDamagedLedger(t *testing.T) {
	dir := t.TempDir()
	l, _ := Open(dir)
	l.AddAccount("p", "", 0, 100)
	os.WriteFile(filepath.Join(dir, tmpFile), []byte("{half"), 0o600)
	if _, err := l.Reserve("a", "p", 1); err != nil {
		t.Fatalf("stale temp file: %v", err)
	}
	os.WriteFile(filepath.Join(dir, File), []byte(`{"v":1,"accounts":{`), 0o600)
	if _, err := l.Reserve("b", "p", 1); err == nil {
		t.Fatal("a damaged ledger admitted a request")
	}
}

func TestRetire(t *testing.T) {
	l := newLedger(t)
	l.AddAccount("p", "", 0, 100)
	l.AddAccount("c", "p", 0, 0)
	l.AddAccount("g", "c", 0, 0)
	l.Reserve("r1", "g", 30)
	if err := l.Retire("c"); err != nil {
		t.Fatal(err)
	}
	if st, _ := l.Snapshot(); st.Accounts["c"] == nil {
		t.Fatal("a parent was retired while its child lives")
	}
	if err := l.Retire("g"); err != nil {
		t.Fatal(err)
	}
	st, _ := l.Snapshot()
	if st.Accounts["g"] != nil || st.Accounts["p"].Tokens != 30 || len(st.Reservations) != 0 {
		t.Fatalf("after retiring g: %+v %+v", st.Accounts, st.Reservations)
	}
	// The name can be used again; what g spent still counts.
	if err := l.AddAccount("g", "c", 0, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Reserve("r2", "g", 71); !errors.Is(err, ErrExhausted) {
		t.Fatalf("the retired account's charge was returned: %v", err)
	}
}
