package conformance

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/confirmation"
	"github.com/moat-sandbox/moat/internal/fsutil"
	"github.com/moat-sandbox/moat/internal/probekit"
	"github.com/moat-sandbox/moat/internal/receiver"
)

var scenarios = []scenario{
	{"egress-confinement", egressConfinement},
	{"filesystem-confinement", filesystemConfinement},
	{"privilege-floor", privilegeFloor},
	{"grant-symlink", grantSymlink},
	{"setid-and-sockets", setidAndSockets},
	{"attribution", attribution},
	{"supervisor-loss", supervisorLoss},
	{"smoke", smoke},
}

// hostReceiver listens on the host's loopback (TCP and UDP) and reports
// arrivals (internal/receiver).
type hostReceiver struct{ *receiver.Receiver }

func newHostReceiver() (hostReceiver, error) {
	r, err := receiver.Start(receiver.Options{})
	return hostReceiver{r}, err
}

// newSandboxHostReceiver is a host receiver where the sandbox would reach
// the host: loopback for the backends whose sandboxes share the host's
// view of it, and for kubernetes the address by which the Pod reaches the
// host (its loopback is the Pod's own).
func (h *harness) newSandboxHostReceiver(ctx context.Context) (hostReceiver, error) {
	if h.k8s == nil {
		return newHostReceiver()
	}
	c, err := h.cluster()
	if err != nil {
		return hostReceiver{}, err
	}
	a, err := hostAddress(ctx, c, h.k8s.BrokerAddress)
	if err != nil {
		return hostReceiver{}, err
	}
	addr := net.JoinHostPort(a.String(), "0")
	r, err := receiver.Start(receiver.Options{TCPAddr: addr, UDPAddr: addr})
	return hostReceiver{r}, err
}

// drain returns what arrived within d.
func (r hostReceiver) drain(d time.Duration) []string {
	var got []string
	t := time.After(d)
	for {
		select {
		case e := <-r.Events:
			got = append(got, e.String())
		case <-t:
			return got
		}
	}
}

// controlDelivery proves a receiver works before it is trusted to observe
// nothing.
func (r hostReceiver) controlDelivery(v *verdict) {
	c, err := net.Dial("tcp", r.TCP.Addr().String())
	if err == nil {
		c.Close()
	}
	u, err2 := net.Dial("udp", r.UDP.LocalAddr().String())
	if err2 == nil {
		u.Write([]byte("control"))
		u.Close()
	}
	got := r.drain(500 * time.Millisecond)
	v.control(err == nil && err2 == nil && len(got) == 2, "host receivers on %s and udp %s observe the controller's delivery (%d events)", r.TCP.Addr(), r.UDP.LocalAddr(), len(got))
}

func egressConfinement(ctx context.Context, h *harness) Result {
	v := &verdict{}
	rcv, err := h.newSandboxHostReceiver(ctx)
	if err != nil {
		return Result{Outcome: Invalid, Reason: err.Error()}
	}
	defer rcv.Close()
	rcv.controlDelivery(v)

	actions := []string{"tcp=" + rcv.TCP.Addr().String(), "udp=" + rcv.UDP.LocalAddr().String(), "infer=" + providerModel}
	th, terr := newTestHost(h)
	if terr == nil {
		defer th.close()
		th.controlDelivery(v)
		actions = append(actions, "tcp="+th.addr(80), "dns-udp="+th.addr(53), "tcp="+th.addr(53))
	} else if errors.Is(terr, errNeedsRoot) {
		v.needsRoot("raw-IP and alternate-resolver checks need a test host in a network namespace of the suite's own")
	} else {
		v.invalid("raw-IP and alternate-resolver checks need a test host in a network namespace of the suite's own: %v", terr)
	}
	before := h.provider.Count()
	out, err := h.probeRun(ctx, actions...)
	if err != nil || out.code != 0 {
		return runFailed(v, out, err)
	}
	for _, a := range actions {
		ok, detail, found := out.result(a)
		switch {
		case !found:
			v.invalid("the probe did not report %s", a)
		case a == "infer="+providerModel:
			v.control(ok, "an allowed request through the broker (%s)", detail)
		case strings.HasPrefix(a, "udp="):
			// A UDP send "succeeds" locally whether or not anything can
			// receive it: the receivers' observation decides, below.
			v.observe("probe: %s -> ok=%v (%s); judged by the receiver", a, ok, detail)
		default:
			v.violation(!ok, "%s from inside the sandbox (%s)", a, detail)
		}
	}
	if got := rcv.drain(300 * time.Millisecond); len(got) > 0 {
		v.violation(false, "host receivers observed traffic from the sandbox: %v", got)
	} else {
		v.violation(true, "host receivers observed nothing from the sandbox")
	}
	if th != nil && terr == nil {
		if got := th.events(); len(got) > th.controls {
			v.violation(false, "the test host observed traffic from the sandbox: %v", got[th.controls:])
		} else {
			v.violation(true, "the test host (raw IP, resolver on UDP and TCP 53) observed nothing from the sandbox")
		}
	}
	v.control(h.provider.Count() == before+1, "the provider observed exactly the one allowed request")
	return v.result()
}

func filesystemConfinement(ctx context.Context, h *harness) Result {
	v := &verdict{}
	outside := filepath.Join(h.dir, "outside")
	os.Mkdir(outside, 0o755)
	sentinel := filepath.Join(outside, "sentinel")
	secret := filepath.Join(outside, "secret")
	const sentinelText = "host sentinel: must not change\n"
	os.WriteFile(sentinel, []byte(sentinelText), 0o666)
	os.WriteFile(secret, []byte("host secret\n"), 0o644)
	inside := filepath.Join(h.workspace, "written-inside")
	// A write into a read-only grant (/usr). Should a broken backend let it
	// through, the file is removed again and reported.
	roTarget := fmt.Sprintf("/usr/moat-conformance-%d", time.Now().UnixNano())
	h.cleanup = append(h.cleanup, func() { os.Remove(roTarget) })
	actions := []string{"read=" + secret, "write=" + sentinel, "write=" + filepath.Join(outside, "new"),
		"read=/etc/shadow", "write=" + roTarget, "write=" + inside, "read=" + inside}
	out, err := h.probeRun(ctx, actions...)
	if err != nil || out.code != 0 {
		return runFailed(v, out, err)
	}
	for _, a := range actions {
		ok, detail, found := out.result(a)
		if !found {
			v.invalid("the probe did not report %s", a)
			continue
		}
		if strings.HasSuffix(a, inside) {
			v.control(ok, "%s inside the workspace (%s)", a, detail)
		} else {
			v.violation(!ok, "%s outside the grants (%s)", a, detail)
		}
	}
	b, err := os.ReadFile(sentinel)
	v.violation(err == nil && string(b) == sentinelText, "the host sentinel is unchanged")
	_, err = os.Stat(filepath.Join(outside, "new"))
	_, err2 := os.Stat(roTarget)
	v.violation(err != nil && err2 != nil, "no new file appeared outside the grants on the host")
	b, err = os.ReadFile(inside)
	v.control(err == nil && string(b) == probekit.Written, "the workspace write landed on the host")
	return v.result()
}

func privilegeFloor(ctx context.Context, h *harness) Result {
	v := &verdict{}
	actions := []string{"ids=", "caps=", "unshare-user=", "fork="}
	suid := filepath.Join(h.workspace, "suid-moat")
	root := os.Geteuid() == 0
	if root {
		if err := fsutil.CopyFile(h.bin, suid, 0o755); err == nil {
			os.Chown(suid, 0, 0)
			os.Chmod(suid, os.ModeSetuid|0o755)
			// Control: outside the sandbox, the same file raises an
			// ordinary user's euid to 0.
			out, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", suid, probekit.EUIDHelper).Output()
			v.control(err == nil && strings.TrimSpace(string(out)) == "euid=0", "outside the sandbox the setuid-root file gives uid 65534 euid 0 (%q, %v)", strings.TrimSpace(string(out)), err)
			actions = append(actions, "exec-euid="+suid)
		} else {
			v.invalid("cannot place a setuid file: %v", err)
		}
	} else {
		v.needsRoot("the setuid-root check needs root to make a setuid-root file and its control")
	}
	out, err := h.probeRun(ctx, actions...)
	if err != nil || out.code != 0 {
		return runFailed(v, out, err)
	}
	ok, detail, found := out.result("ids=")
	if !found || !ok {
		v.invalid("the probe did not report its ids")
	} else {
		v.violation(!strings.Contains(detail, "uid=0 ") && !strings.Contains(detail, "euid=0 "), "uid inside is not 0 (%s)", detail)
	}
	ok, detail, found = out.result("caps=")
	if !found || !ok {
		v.invalid("the probe did not report its capabilities")
	} else {
		v.violation(detail == "eff=0 prm=0 inh=0 amb=0", "every capability set is empty (%s)", detail)
	}
	ok, detail, _ = out.result("unshare-user=")
	v.violation(!ok, "a new user namespace cannot be made (%s)", detail)
	ok, detail, _ = out.result("fork=")
	v.control(ok, "normal execution: the probe forks and executes itself (%s)", detail)
	if root {
		ok, detail, found = out.result("exec-euid=" + suid)
		if !found {
			v.invalid("the probe did not report the setuid exec")
		} else {
			v.violation(!ok || detail != "euid=0", "the setuid-root file gains nothing inside (%s)", detail)
		}
	}
	return v.result()
}

func attribution(ctx context.Context, h *harness) Result {
	v := &verdict{}
	out, err := h.probeRun(ctx, "infer="+providerModel)
	if err != nil || out.code != 0 {
		return runFailed(v, out, err)
	}
	ok, detail, _ := out.result("infer=" + providerModel)
	v.control(ok, "an allowed request through the broker (%s)", detail)
	ents, res, err := out.journal()
	if err != nil {
		v.invalid("journal: %v", err)
		return v.result()
	}
	v.control(res.Status == audit.Complete, "the journal verifies complete against the key pinned from run-info (%s)", res.Status)
	want, _ := fsutil.SHA256File(h.probe)
	var req *audit.InferenceRequested
	for _, e := range ents {
		if r, ok := e.Record.(audit.InferenceRequested); ok {
			req = &r
		}
	}
	if req == nil {
		v.invalid("no inference.requested record in the journal")
		return v.result()
	}
	a := req.Attribution
	if a.Status == confirmation.AttributionUnavailable {
		if out.runInfo != nil && out.runInfo.Properties.RequestAttribution.Unavailable {
			return Result{Outcome: Unavailable, Reason: "the backend declares attribution unavailable (endpoint-only): " + a.Reason,
				Observations: append(v.obs, "record says unavailable: "+a.Reason)}
		}
		v.violation(false, "attribution unavailable (%s) on a backend that did not declare it", a.Reason)
		return v.result()
	}
	v.violation(a.Status == confirmation.AttributionResolved && a.SHA256 == want && a.PID > 0,
		"the decision record names the connecting binary: pid %d, %s, sha256 %s (want %s)", a.PID, a.Executable, a.SHA256, want)
	return v.result()
}

func supervisorLoss(ctx context.Context, h *harness) Result {
	if h.k8s != nil {
		return supervisorLossKubernetes(ctx, h)
	}
	v := &verdict{}
	pol, err := h.policyFile()
	if err != nil {
		return Result{Outcome: Invalid, Reason: err.Error()}
	}
	ri := filepath.Join(h.dir, "run-info.json")
	cmd := h.command(ctx, "run", "--backend", h.backend, "--policy", pol, "--run-info", ri, "--",
		"sh", "-c", "setsid sh -c 'sleep 300 & exit 0'; sleep 300")
	if err := cmd.Start(); err != nil {
		return Result{Outcome: Invalid, Reason: err.Error()}
	}
	defer cmd.Process.Kill()
	deadline := time.Now().Add(runTimeout)
	for {
		if _, err := os.Stat(ri); err == nil {
			break
		}
		if time.Now().After(deadline) {
			v.invalid("no run info within %v", runTimeout)
			return v.result()
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // the detached grandchild
	procs := descendants(cmd.Process.Pid)
	v.control(len(procs) >= 2, "the sandbox's processes are on the host before the kill (%d)", len(procs))
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	var left []int
	for i := 0; i < 200; i++ {
		left = left[:0]
		for pid, start := range procs {
			if fsutil.ProcStart(pid) == start {
				left = append(left, pid)
			}
		}
		if len(left) == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	v.violation(len(left) == 0, "after SIGKILL to moat no sandbox process is left (left: %v)", left)
	return v.result()
}

func smoke(ctx context.Context, h *harness) Result {
	v := &verdict{}
	pol, err := h.policyFile()
	if err != nil {
		return Result{Outcome: Invalid, Reason: err.Error()}
	}
	name := "conformance-smoke"
	run := func(args ...string) (string, string, int) {
		cmd := h.command(ctx, args...)
		var so, se strings.Builder
		cmd.Stdout, cmd.Stderr = &so, &se
		cmd.Run()
		return so.String(), se.String(), cmd.ProcessState.ExitCode()
	}
	_, se, code := run("sandbox", "create", "--name", name, "--policy", pol, "--backend", h.backend)
	v.control(code == 0, "create (%s)", strings.TrimSpace(se))
	defer run("sandbox", "delete", name)
	so, _, _ := run("sandbox", "get", name, "-o", "json")
	v.control(strings.Contains(so, `"phase": "Ready"`), "get says Ready")
	marker := fmt.Sprintf("smoke-%d", time.Now().UnixNano())
	so, se, code = run("sandbox", "exec", name, "--", "echo", marker)
	v.control(code == 0 && so == marker+"\n", "exec prints exactly the marker (got %q, %s)", so, strings.TrimSpace(se))
	_, se, code = run("sandbox", "delete", name)
	v.control(code == 0, "delete (%s)", strings.TrimSpace(se))
	_, se, code = run("sandbox", "get", name)
	v.control(code != 0 && strings.Contains(se, "not found"), "get after delete says not found")
	return v.result()
}

func runFailed(v *verdict, out *runOut, err error) Result {
	if err != nil {
		v.invalid("running moat: %v", err)
		return v.result()
	}
	v.control(false, "moat run exited %d: %s", out.code, strings.TrimSpace(lastLines(out.stderr, 3)))
	return v.result()
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, " | ")
}

// descendants maps every host process below pid (children, their
// children, …) to its start time.
func descendants(root int) map[int]uint64 {
	parent := map[int]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pp := ppid(pid); pp > 0 {
			parent[pid] = pp
		}
	}
	out := map[int]uint64{}
	for pid := range parent {
		for p := parent[pid]; p > 0; p = parent[p] {
			if p == root {
				out[pid] = fsutil.ProcStart(pid)
				break
			}
		}
	}
	return out
}

func ppid(pid int) int {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "PPid:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

// grantSymlink is the nested-grant attack across two runs: with
// read_write [ws] and read_only [ws/sysroot/etc], run 1's workload renames
// ws/sysroot and plants a symlink to a host directory outside the grants.
// Run 2 must be refused before its workload starts, and must not show the
// host file. Run 1's read of the nested grant is the control.
func grantSymlink(ctx context.Context, h *harness) Result {
	v := &verdict{}
	nested := true
	if h.k8s != nil {
		// The kubelet resolves a hostPath grant on the node, following
		// symlinks, so the kubernetes backend refuses a grant below a
		// directory the workload can write at every run, run 1
		// included: run 1 has the read_write grant alone, and its read
		// of ws/sysroot/etc/conf through it is the control.
		nested = false
	}
	sysroot := filepath.Join(h.workspace, "sysroot")
	etc := filepath.Join(sysroot, "etc")
	outside := filepath.Join(h.dir, "outside-sysroot")
	for _, d := range []string{etc, filepath.Join(outside, "etc")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return Result{Outcome: Invalid, Reason: err.Error()}
		}
	}
	os.WriteFile(filepath.Join(etc, "conf"), []byte("granted\n"), 0o644)
	os.WriteFile(filepath.Join(outside, "etc", "conf"), []byte("host secret, outside every grant\n"), 0o644)
	if os.Geteuid() == 0 {
		for _, p := range []string{sysroot, etc, filepath.Join(etc, "conf")} {
			os.Chown(p, 65534, 65534)
		}
		os.Chmod(sysroot, 0o777)
	}
	pol, err := h.policyWith(etc)
	if err != nil {
		return Result{Outcome: Invalid, Reason: err.Error()}
	}
	pol1 := pol
	if !nested {
		if pol1, err = h.policyAt("policy-run1.yaml"); err != nil {
			return Result{Outcome: Invalid, Reason: err.Error()}
		}
	}
	read := "read=" + filepath.Join(etc, "conf")
	plant := "plant=" + sysroot + ">" + outside
	out, err := h.probeRunPolicy(ctx, pol1, read, plant)
	if err != nil || out.code != 0 {
		return runFailed(v, out, err)
	}
	ok, detail, _ := out.result(read)
	v.control(ok && detail == "8 bytes", "run 1 reads the nested grant's file (%s)", detail)
	ok, detail, _ = out.result(plant)
	v.control(ok, "run 1's workload renames the nested grant's parent and plants a symlink (%s)", detail)
	out, err = h.probeRunPolicy(ctx, pol, read)
	if err != nil {
		v.invalid("running moat: %v", err)
		return v.result()
	}
	ok, detail, found := out.result(read)
	v.violation(out.code == 125 && !found, "run 2 is refused before its workload starts (exit %d, %s)", out.code, strings.TrimSpace(lastLines(out.stderr, 1)))
	v.violation(!(found && ok), "run 2's workload does not read the host file through the planted link (%s)", detail)
	return v.result()
}

// setidAndSockets: nothing the workload writes reaches the host with a
// set-id bit; a datagram socket that a host process binds in the
// workspace hears nothing (a socketpair's datagram socket can sendto it
// without socket(2)); no FIFO can be made there. Controls: a plain chmod
// works, and the host socket does receive the host's own datagram.
func setidAndSockets(ctx context.Context, h *harness) Result {
	v := &verdict{}
	sock := filepath.Join(h.workspace, "host.dgram")
	pc, err := net.ListenPacket("unixgram", sock)
	if err != nil {
		return Result{Outcome: Invalid, Reason: err.Error()}
	}
	defer pc.Close()
	defer os.Remove(sock)
	os.Chmod(sock, 0o777)
	got := make(chan string, 8)
	go func() {
		buf := make([]byte, 256)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			got <- string(buf[:n])
		}
	}()
	if c, err := net.Dial("unixgram", sock); err == nil {
		c.Write([]byte("control"))
		c.Close()
	}
	select {
	case m := <-got:
		v.control(m == "control", "the host datagram socket in the workspace receives the host's datagram")
	case <-time.After(2 * time.Second):
		v.control(false, "the host datagram socket in the workspace receives the host's datagram")
	}
	suid, sgid, plain := filepath.Join(h.workspace, "suid"), filepath.Join(h.workspace, "sgid"), filepath.Join(h.workspace, "plain")
	fifo := filepath.Join(h.workspace, "fifo")
	actions := []string{"chmod=" + suid + ":4755", "chmod=" + sgid + ":2755", "chmod=" + plain + ":755", "dgram=" + sock, "fifo=" + fifo}
	out, err := h.probeRun(ctx, actions...)
	if err != nil || out.code != 0 {
		return runFailed(v, out, err)
	}
	for _, a := range actions {
		ok, detail, found := out.result(a)
		switch {
		case !found:
			v.invalid("the probe did not report %s", a)
		case strings.HasSuffix(a, ":755"):
			v.control(ok, "%s inside the workspace (%s)", a, detail)
		default:
			v.violation(!ok, "%s (%s)", a, detail)
		}
	}
	for _, p := range []string{suid, sgid} {
		st, err := os.Stat(p)
		v.violation(err != nil || st.Mode()&(os.ModeSetuid|os.ModeSetgid) == 0, "the host sees no set-id bit on %s", p)
	}
	_, err = os.Lstat(fifo)
	v.violation(err != nil, "no FIFO appeared in the workspace on the host")
	select {
	case m := <-got:
		v.violation(false, "the host datagram socket received %q from the sandbox", m)
	case <-time.After(300 * time.Millisecond):
		v.violation(true, "the host datagram socket received nothing from the sandbox")
	}
	return v.result()
}
