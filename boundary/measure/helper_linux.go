package measure

import (
	"fmt"
	"io"
	"net/netip"
	"os"
	"sync"

	"github.com/go-json-experiment/json"
	"golang.org/x/sys/unix"
)

// Helper sub-modes, used by the helper on itself.
const (
	argNoop    = "--noop" // print noopMarker, exit 0: the exec control
	argIDs     = "--ids"  // print "ruid euid suid": the setuid probe
	noopMarker = "moat-measure-noop\n"
)

// probeWorkers bounds how many probes run at once.
const probeWorkers = 8

// Main is the in-sandbox side of the measurement (reexec helper
// "__moat-measure"). args[0] is the JSON plan; the report goes to stdout,
// diagnostics to stderr. It exits 0 with a report, or 125 without one.
func Main(args []string) int {
	if len(args) != 1 {
		fmt.Fprintf(os.Stderr, "moat: %s: want exactly one argument (the plan), got %d\n", Helper, len(args))
		return 125
	}
	switch args[0] {
	case argNoop:
		os.Stdout.WriteString(noopMarker)
		return 0
	case argIDs:
		r, e, s := unix.Getresuid()
		fmt.Fprintf(os.Stdout, "%d %d %d\n", r, e, s)
		return 0
	}
	// Before anything else opens a file: what did the helper inherit?
	fds := inheritedFDs()
	pl, err := decodePlan(args[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "moat: %s: %v\n", Helper, err)
		return 125
	}
	if pl.Host != "" {
		// decodePlan checked that it is an address.
		planHost = netip.MustParseAddr(pl.Host).Unmap()
	}
	results := make([]result, len(pl.Probes))
	// The exec control's child is started before the broker connection
	// exists (its fork cannot hold a copy of that socket), so that its
	// start-up, a Go runtime's, overlaps everything else; it is judged
	// when it has answered.
	started := map[int]func() (string, string){}
	for i, p := range pl.Probes {
		if p.Op == opExec {
			started[i] = startExecSelf()
		}
	}
	run := func(i int, p probe) {
		var outcome, detail string
		if p.Op == opInheritedFDs {
			outcome, detail = fds()
		} else if finish, ok := started[i]; ok {
			outcome, detail = finish()
		} else {
			outcome, detail = runProbe(pl.Nonce, i, p)
		}
		results[i] = result{ID: p.ID, Outcome: outcome, Detail: truncate(detail)}
	}
	schedule(pl.Probes, func(i int) bool { _, ok := started[i]; return ok }, func(i int) { run(i, pl.Probes[i]) })
	b, err := json.Marshal(report{V: 1, Results: results})
	if err != nil {
		fmt.Fprintf(os.Stderr, "moat: %s: BUG: encoding report: %v\n", Helper, err)
		return 125
	}
	if _, err := os.Stdout.Write(append(b, '\n')); err != nil {
		fmt.Fprintf(os.Stderr, "moat: %s: writing report: %v\n", Helper, err)
		return 125
	}
	// Stay until the host has seen this process (it closes stdin once it
	// has the helper's host pid): a helper that exited and was reaped
	// first would leave the attribution control nothing to compare with.
	io.Copy(io.Discard, io.LimitReader(os.Stdin, maxStdinBytes))
	return 0
}

// schedule runs run(i) once for every probe i and returns when all have
// returned. The broker connection is made while no probe that forks runs:
// while the host attributes it, no child may be mid-fork holding a copy
// of the socket (that would make the attribution ambiguous, and rightly
// refused). The probes that fork start after it, together (a child that
// cannot be made for want of a process says error, never failed: see
// outOfProcesses). The other probes neither fork nor share a limit that
// one of them could exhaust for another (a handful of fds each, against
// RLIMIT_NOFILE), and run beside them, probeWorkers at a time; a probe whose child is already running
// (waiting reports whether i is one) is waited for without a worker.
func schedule(probes []probe, waiting func(i int) bool, run func(i int)) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i, p := range probes {
			if p.Op == opTCPBroker {
				run(i)
			}
		}
		for i, p := range probes {
			if forks(p.Op) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					run(i)
				}()
			}
		}
	}()
	sem := make(chan struct{}, probeWorkers)
	for i, p := range probes {
		if p.Op == opTCPBroker || forks(p.Op) {
			continue
		}
		wg.Add(1)
		if waiting(i) {
			go func() {
				defer wg.Done()
				run(i)
			}()
			continue
		}
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			run(i)
		}()
	}
	wg.Wait()
}

// forks reports whether a probe of operation op starts a child process
// (the exec control's child was started before any probe).
func forks(op string) bool {
	switch op {
	case opUnshare, opCloneUser, opSetuid:
		return true
	}
	return false
}

// maxStdinBytes bounds what the helper reads of stdin while it waits.
const maxStdinBytes = 1 << 10

// runProbe performs one probe and says what happened.
func runProbe(nonce string, i int, p probe) (outcome, detail string) {
	switch p.Op {
	case opRead:
		return probeRead(p.Path)
	case opWrite:
		return probeWrite(p.Path, probeFileName(nonce, i))
	case opTCP:
		return probeTCP(p.Addr)
	case opUnix:
		return probeUnix(p.Addr)
	case opTCPBroker:
		return probeBroker(p.Addr, nonce)
	case opDNSUDP:
		return probeDNS(p.Addr)
	case opDNSResolv:
		return probeResolvConf()
	case opInterfaces:
		return probeInterfaces()
	case opRoutes:
		return probeRoutes()
	case opIPv6:
		return probeIPv6Usable()
	case opNoNewPrivs:
		return probeNoNewPrivs()
	case opCaps:
		return probeCaps()
	case opAmbient:
		return probeAmbient()
	case opBounding:
		return probeBounding()
	case opUID:
		return probeIDs("uid", unix.Getresuid)
	case opGID:
		return probeIDs("gid", unix.Getresgid)
	case opUnshare:
		return probeNewUserNS(false)
	case opCloneUser:
		return probeNewUserNS(true)
	case opExec:
		return probeExecSelf()
	case opSetuid:
		return probeSetuid(p.Path)
	case opSetIDChmod:
		name := probeFileName(nonce, i)
		if o, d := probeSetIDChmod(p.Path, name, 0o4755); o != OutcomeFailed {
			return o, d
		}
		return probeSetIDChmod(p.Path, name, 0o2755)
	case opSetIDCreate:
		return probeSetIDCreate(p.Path, probeFileName(nonce, i))
	case opChmodPlain:
		return probeSetIDChmod(p.Path, probeFileName(nonce, i), 0o755)
	case opUnixDgram:
		return probeUnixDgram(p.Addr)
	case opStreamPair:
		return probeSocketpair(unix.SOCK_STREAM)
	case opFIFO:
		return probeFIFO(p.Path, probeFileName(nonce, i))
	case opStatList:
		return probeStatList(p.Path)
	}
	return OutcomeError, fmt.Sprintf("unknown probe operation %q", p.Op)
}
