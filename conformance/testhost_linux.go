package conformance

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/moat-sandbox/moat/internal/probekit"
)

// testHost is a host of the suite's own, in a network namespace that the
// suite creates (root only) and joins to the host's namespace by a veth
// pair: an address that a process on the host can reach by raw IP, and a
// resolver on UDP and TCP 53. Nothing else is ever addressed.
type testHost struct {
	ns, vethHost string
	hostIP, ip   string
	log          string
	recv         *exec.Cmd
	controls     int
}

var testHostSeq atomic.Int32

func newTestHost(h *harness) (*testHost, error) {
	if os.Geteuid() != 0 {
		return nil, errNeedsRoot
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("ip (iproute2) not found")
	}
	n := int(testHostSeq.Add(1))
	id := fmt.Sprintf("%d%d", os.Getpid()%100000, n)
	// 10.213.0.0/16 inside namespaces of our own: one /30 per test host.
	k := (os.Getpid()*7 + n) % 16000
	th := &testHost{
		ns:       "moatc" + id,
		vethHost: "mch" + id,
		hostIP:   fmt.Sprintf("10.213.%d.%d", k/64, (k%64)*4+1),
		ip:       fmt.Sprintf("10.213.%d.%d", k/64, (k%64)*4+2),
		log:      filepath.Join(h.dir, "testhost.log"),
	}
	peer := "mct" + id
	steps := [][]string{
		{"netns", "add", th.ns},
		{"link", "add", th.vethHost, "type", "veth", "peer", "name", peer},
		{"link", "set", peer, "netns", th.ns},
		{"addr", "add", th.hostIP + "/30", "dev", th.vethHost},
		{"link", "set", th.vethHost, "up"},
		{"-n", th.ns, "addr", "add", th.ip + "/30", "dev", peer},
		{"-n", th.ns, "link", "set", peer, "up"},
		{"-n", th.ns, "link", "set", "lo", "up"},
	}
	for _, s := range steps {
		if out, err := exec.Command("ip", s...).CombinedOutput(); err != nil {
			th.close()
			return nil, fmt.Errorf("ip %s: %v: %s", strings.Join(s, " "), err, out)
		}
	}
	th.recv = exec.Command("ip", "netns", "exec", th.ns, h.bin, ReceiverHelper, th.log,
		"tcp:"+th.ip+":80", "tcp:"+th.ip+":53", "udp:"+th.ip+":53")
	stdout, _ := th.recv.StdoutPipe()
	th.recv.Stderr = os.Stderr
	if err := th.recv.Start(); err != nil {
		th.close()
		return nil, err
	}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		ready <- sc.Scan() && sc.Text() == "ready"
	}()
	select {
	case ok := <-ready:
		if !ok {
			th.close()
			return nil, fmt.Errorf("test host receiver did not start")
		}
	case <-time.After(10 * time.Second):
		th.close()
		return nil, fmt.Errorf("test host receiver did not start in time")
	}
	return th, nil
}

func (th *testHost) addr(port int) string { return net.JoinHostPort(th.ip, fmt.Sprint(port)) }

// controlDelivery: from the host, the test host is reachable by raw IP on
// TCP 80, and its resolver answers on UDP and TCP 53.
func (th *testHost) controlDelivery(v *verdict) {
	okTCP := dialOK("tcp", th.addr(80))
	okDNS := dialOK("tcp", th.addr(53))
	_, derr := probekit.DNSQuery(th.addr(53))
	time.Sleep(100 * time.Millisecond)
	th.controls = len(th.events())
	v.control(okTCP && okDNS && derr == nil && th.controls == 3,
		"from the host, the test host %s answers by raw IP (tcp 80) and as a resolver (udp and tcp 53); %d events logged", th.ip, th.controls)
}

func dialOK(network, addr string) bool {
	c, err := net.DialTimeout(network, addr, 2*time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func (th *testHost) events() []string {
	b, _ := os.ReadFile(th.log)
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

func (th *testHost) close() {
	if th.recv != nil && th.recv.Process != nil {
		th.recv.Process.Kill()
		th.recv.Wait()
	}
	exec.Command("ip", "link", "del", th.vethHost).Run()
	exec.Command("ip", "netns", "del", th.ns).Run()
}
