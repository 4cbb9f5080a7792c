package measure

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/go-json-experiment/json"

	"github.com/moat-sandbox/moat/confirmation"
	"github.com/moat-sandbox/moat/internal/fsutil"
	"github.com/moat-sandbox/moat/internal/reaper"
	"github.com/moat-sandbox/moat/internal/reexec"
)

// Helper is the hidden helper of the moat binary that runs Main, the
// in-sandbox side; internal/cli/hidden.go lists it.
const Helper = reexec.Prefix + "measure"

// Limits.
const (
	// MaxPlanBytes bounds the plan, which travels as one argv element
	// (Linux caps one at 128 KiB).
	MaxPlanBytes = 64 << 10
	// MaxReportBytes bounds the helper's stdout.
	MaxReportBytes = 1 << 20
	// MaxProbes bounds the number of probes in a plan.
	MaxProbes = 512
	// MaxDetailBytes bounds each check's detail text.
	MaxDetailBytes = 512
	// maxSecretEntries bounds how many entries of a secret directory that
	// holds a grant are probed one by one.
	maxSecretEntries = 16
	// maxExtraPorts bounds Config.ExtraTCPPorts and ExtraUDPPorts.
	maxExtraPorts = 32
)

// Config is what Confirm needs to know about the sandbox. Paths are
// absolute and name the same file inside and outside the sandbox.
type Config struct {
	// BrokerPort is the broker's port on 127.0.0.1 inside the sandbox; 0
	// means the port that Sandbox.Listener reports.
	BrokerPort int
	// BrokerHost, when set and not loopback, is the host address at which
	// the sandbox reaches the broker (boundary.ListenerInfo.Host: the
	// Kubernetes backend's broker, off the Pod). Such a sandbox has a
	// network interface and routes by design, and its egress is confined
	// by a filter (the Pod's NetworkPolicy) that only connections show:
	// the interface and route checks give way to connections from inside
	// to BrokerHost itself, at host receivers (TCP and UDP) that Confirm
	// opens there, the ports next to the broker's, the fixed ports and the
	// kubelet's, all of which only that filter keeps the sandbox from.
	BrokerHost string
	// EgressPort, when > 0, is the broker's egress port on 127.0.0.1
	// inside the sandbox (the policy's egress hosts): a door of the
	// broker's like BrokerPort, so it is not probed as a violation.
	EgressPort int
	// ReadWrite and ReadOnly are the filesystem grants.
	ReadWrite, ReadOnly []string
	// HostSecrets are host paths that must be unreadable inside: e.g. a
	// sentinel file moat creates outside the grants, /etc/shadow, $HOME,
	// the working directory.
	HostSecrets []string
	// RequireAttribution is the policy's inference.require_attribution;
	// it only shapes the detail of an unavailable attribution (readiness
	// is boundary.Ready's decision).
	RequireAttribution bool
	// ExtraTCPPorts and ExtraUDPPorts are loopback ports, besides a fixed
	// list, that the sandbox must not reach (e.g. receivers that a test
	// or the conformance suite listens on, on the host's loopback).
	ExtraTCPPorts, ExtraUDPPorts []int
	// ExtraUnixSockets are Unix sockets outside the sandbox ("@name" for
	// the abstract namespace, else an absolute path) that it must not
	// reach. Confirm adds its own receivers to all three lists.
	ExtraUnixSockets []string
	// Reaper, when not nil, is told of the receivers' sockets in the
	// grants, so that they are removed even if moat dies mid-measurement.
	Reaper *reaper.Reaper
	// ExtraUnixDgram are pathname datagram sockets outside the sandbox
	// that it must not send to. Confirm adds one per read-write grant.
	ExtraUnixDgram []string
	// SetuidProbes are setuid-root copies of the moat binary inside the
	// grants; executing one must not change the euid. Optional.
	SetuidProbes []string

	// hostTCPPorts and hostUDPPorts are the receivers that Confirm opens
	// on BrokerHost (podNetwork only).
	hostTCPPorts, hostUDPPorts []int
}

// podNetwork reports whether the broker is reached at a non-loopback
// host address (BrokerHost), i.e. the sandbox has a network of its own
// whose egress a filter confines; validate checked the address.
func (cfg *Config) podNetwork() (netip.Addr, bool) {
	if cfg.BrokerHost == "" {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(cfg.BrokerHost)
	if err != nil || a.Unmap().IsLoopback() {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

// Property names, as in boundary.Properties.
const (
	PropFilesystem  = "filesystem_confinement"
	PropEgress      = "egress_interception"
	PropAttribution = "request_attribution"
	PropPrivilege   = "privilege_floor"
)

// Check kinds.
const (
	KindViolation = "violation" // OK when the attempted action failed
	KindControl   = "control"   // OK when the allowed action succeeded
)

// Report is the full measurement, recorded in the journal.
type Report struct {
	Checks []Check `json:"checks"`
}

// Check is one attempted action and what came of it: the type the
// journal records (package confirmation holds it, below both).
type Check = confirmation.Check

// Outcomes.
const (
	OutcomeSucceeded = "succeeded"
	OutcomeFailed    = "failed"
	OutcomeError     = "error"
	OutcomeMissing   = "missing" // not in the helper's report
)

// Probe operations understood by the helper.
const (
	opRead         = "read"          // path: read a file, or list a directory
	opWrite        = "write"         // path: create+remove a file in a directory, or open a file for writing
	opInheritedFDs = "inherited-fds" // an fd beyond stdio was open when the helper started
	opTCP          = "tcp"           // addr: connect
	opTCPBroker    = "tcp-broker"    // addr: connect, present the nonce, read the answer
	opUnix         = "unix"          // addr: connect to a Unix socket ("@name": abstract)
	opDNSUDP       = "dns-udp"       // addr: one DNS query over UDP, wait for any answer
	opDNSResolv    = "dns-resolv"    // DNS query to each loopback nameserver of /etc/resolv.conf
	opInterfaces   = "interfaces"    // a non-loopback interface exists
	opRoutes       = "routes"        // a route leaves through a non-loopback interface, or a default route exists
	opIPv6         = "ipv6-usable"   // a non-loopback interface has an IPv6 address a socket can bind (podNetwork)
	opNoNewPrivs   = "no-new-privs-unset"
	opCaps         = "capabilities"     // effective, permitted or inheritable set non-empty
	opAmbient      = "ambient"          // ambient set non-empty
	opBounding     = "bounding"         // bounding set non-empty and usable
	opUID          = "uid-root"         // a uid is 0
	opGID          = "gid-root"         // a gid is 0
	opUnshare      = "unshare-userns"   // unshare(CLONE_NEWUSER) in a child
	opCloneUser    = "clone-userns"     // clone(CLONE_NEWUSER)
	opExec         = "exec-self"        // fork+exec of the helper itself
	opSetuid       = "setuid"           // path: exec a setuid copy of the helper, compare euid
	opSetIDChmod   = "setid-chmod"      // path (a directory): chmod a new file 04755 and 02755
	opSetIDCreate  = "setid-create"     // path: open(O_CREAT) a new file with mode 04755
	opChmodPlain   = "chmod-plain"      // path: chmod a new file 0755 (control)
	opUnixDgram    = "unix-dgram"       // addr: sendto a pathname datagram socket, from socket(2) or a socketpair
	opStreamPair   = "unix-stream-pair" // control: the pairs the workload may have
	opFIFO         = "fifo"             // path: mknod a FIFO
	opStatList     = "stat-list"        // path: statx it as ls -la does; a directory: list it and statx each entry
)

// probeFileName is the name of the file that probe i of a plan with nonce
// creates (and removes) in a directory; the host registers those in the
// read-write grants with the reaper, so that a kill mid-measurement
// leaves none.
func probeFileName(nonce string, i int) string {
	return fmt.Sprintf(".moat-measure-%.16s-%d", nonce, i)
}

// plan is the helper's input.
type plan struct {
	V     int    `json:"v"`
	Nonce string `json:"nonce"`
	// Host is Config.BrokerHost when it is not loopback: the one other
	// address the helper's network probes may target.
	Host   string  `json:"host,omitempty"`
	Probes []probe `json:"probes"`
}

// probe is one attempted action. Property and Kind stay on the host.
type probe struct {
	ID   string `json:"id"`
	Op   string `json:"op"`
	Path string `json:"path,omitempty"`
	Addr string `json:"addr,omitempty"`

	property, kind string
}

// result is the helper's answer to one probe.
type result struct {
	ID      string `json:"id"`
	Outcome string `json:"outcome"`
	Detail  string `json:"detail,omitempty"`
}

type report struct {
	V       int      `json:"v"`
	Results []result `json:"results"`
}

// sandboxTmp is the sandbox's private tmpfs: writable inside, and never
// the host's /tmp (Confirm plants a sentinel in the host's /tmp to show it).
const sandboxTmp = "/tmp"

// fixedPorts are loopback TCP ports that must not be reachable: common
// services, proxies and resolvers a workload might try.
var fixedPorts = []int{22, 53, 80, 443, 1080, 3128, 8080}

// kubeletPort is the kubelet's API port, probed on the broker's host
// address when the sandbox is a Pod (Config.BrokerHost).
const kubeletPort = 10250

// validate checks cfg and fills BrokerPort from the listener's port.
func (cfg *Config) validate(listenerPort int) error {
	if cfg.BrokerPort == 0 {
		cfg.BrokerPort = listenerPort
	}
	if cfg.BrokerPort != listenerPort {
		return fmt.Errorf("measure: broker port %d differs from the sandbox listener's port %d", cfg.BrokerPort, listenerPort)
	}
	if cfg.BrokerPort <= 0 || cfg.BrokerPort > 65535 {
		return fmt.Errorf("measure: broker port %d out of range", cfg.BrokerPort)
	}
	if cfg.BrokerHost != "" {
		a, err := netip.ParseAddr(cfg.BrokerHost)
		if err != nil || a.Zone() != "" || a.IsUnspecified() || a.IsMulticast() {
			return fmt.Errorf("measure: broker host %q is not a unicast IP address", cfg.BrokerHost)
		}
	}
	for _, l := range [][]string{cfg.ReadWrite, cfg.ReadOnly, cfg.HostSecrets, cfg.SetuidProbes} {
		for _, p := range l {
			if !filepath.IsAbs(p) || filepath.Clean(p) != p {
				return fmt.Errorf("measure: path %q is not absolute and clean", p)
			}
		}
	}
	if len(cfg.ExtraUnixSockets) > maxExtraPorts {
		return fmt.Errorf("measure: %d extra Unix sockets, at most %d", len(cfg.ExtraUnixSockets), maxExtraPorts)
	}
	for _, s := range cfg.ExtraUnixSockets {
		if !strings.HasPrefix(s, "@") && (!filepath.IsAbs(s) || filepath.Clean(s) != s) {
			return fmt.Errorf("measure: Unix socket %q is neither @abstract nor an absolute clean path", s)
		}
	}
	for _, l := range [][]int{cfg.ExtraTCPPorts, cfg.ExtraUDPPorts} {
		if len(l) > maxExtraPorts {
			return fmt.Errorf("measure: %d extra ports, at most %d", len(l), maxExtraPorts)
		}
		for _, p := range l {
			if p <= 0 || p > 65535 {
				return fmt.Errorf("measure: port %d out of range", p)
			}
		}
	}
	return nil
}

// buildPlan turns a validated Config into probes. Directory secrets are
// listed here, on the host.
func buildPlan(cfg Config, nonce string) (plan, error) {
	pl := plan{V: 1, Nonce: nonce}
	seen := map[string]bool{}
	add := func(prop, kind, id, op, path, addr string) {
		if seen[id] {
			return
		}
		seen[id] = true
		pl.Probes = append(pl.Probes, probe{ID: id, Op: op, Path: path, Addr: addr, property: prop, kind: kind})
	}
	grants := slices.Concat(cfg.ReadWrite, cfg.ReadOnly)
	// Writable by design: the read-write grants and the sandbox's private
	// /tmp (a tmpfs of its own, see the policy's tmp_size).
	writable := append([]string{sandboxTmp}, cfg.ReadWrite...)
	inRW := func(p string) bool {
		return slices.ContainsFunc(writable, func(g string) bool { return fsutil.Within(p, g) })
	}

	// Filesystem.
	for _, s := range cfg.HostSecrets {
		for _, p := range expandSecret(s, grants) {
			add(PropFilesystem, KindViolation, "fs/read-secret:"+p, opRead, p, "")
		}
	}
	for _, g := range grants {
		if parent := filepath.Dir(g); !inRW(parent) {
			add(PropFilesystem, KindViolation, "fs/write-outside:"+parent, opWrite, parent, "")
		}
	}
	if !inRW("/") {
		add(PropFilesystem, KindViolation, "fs/write-outside:/", opWrite, "/", "")
	}
	for _, g := range cfg.ReadOnly {
		// Read-only even inside a read-write grant or /tmp: it is its own
		// read-only mount.
		add(PropFilesystem, KindViolation, "fs/write-ro:"+g, opWrite, g, "")
		add(PropFilesystem, KindControl, "fs/read-ro:"+g, opRead, g, "")
	}
	// An inherited file or directory fd would reach past every wall.
	add(PropFilesystem, KindViolation, "fs/"+opInheritedFDs, opInheritedFDs, "", "")
	for _, g := range cfg.ReadWrite {
		add(PropFilesystem, KindControl, "fs/write-rw:"+g, opWrite, g, "")
	}
	// Useful work: stat and ls -la of each read-write grant and of "/"
	// succeed (a sandbox whose statx fails, as an old runsc's does with
	// EINVAL, confines well and still breaks every agent).
	for _, g := range append([]string{"/"}, cfg.ReadWrite...) {
		add(PropFilesystem, KindControl, "fs/stat-list:"+g, opStatList, g, "")
	}
	// The private /tmp takes writes, next to the host /tmp sentinel that
	// Confirm adds to the secrets.
	add(PropFilesystem, KindControl, "fs/write-tmp:"+sandboxTmp, opWrite, sandboxTmp, "")

	// Egress.
	bp := cfg.BrokerPort
	host, pod := cfg.podNetwork()
	if pod {
		pl.Host = host.String()
		ba := joinHostPort(pl.Host, bp)
		add(PropEgress, KindControl, "net/tcp-broker:"+ba, opTCPBroker, "", ba)
		// What only the filter keeps the sandbox from: the broker's host
		// at other ports (the receivers Confirm opened there, the
		// broker's neighbours, the fixed ports, the kubelet's 10250).
		for _, p := range slices.Concat(cfg.hostTCPPorts, []int{bp - 1, bp + 1, kubeletPort}, fixedPorts) {
			if p <= 0 || p > 65535 || p == bp || p == cfg.EgressPort {
				continue
			}
			a := joinHostPort(pl.Host, p)
			add(PropEgress, KindViolation, "net/tcp:"+a, opTCP, "", a)
		}
		for _, p := range append([]int{53}, cfg.hostUDPPorts...) {
			a := joinHostPort(pl.Host, p)
			add(PropEgress, KindViolation, "net/dns-udp:"+a, opDNSUDP, "", a)
		}
		// A Pod's interface has an IPv6 link-local address: a filter
		// enforced for IPv4 alone leaves it reaching the node's services
		// bound to [::] and the Pods on its bridge, and none of the
		// probes above would see that.
		add(PropEgress, KindViolation, "net/ipv6-usable", opIPv6, "", "")
	} else {
		add(PropEgress, KindControl, "net/tcp-broker:127.0.0.1:"+strconv.Itoa(bp), opTCPBroker, "", "127.0.0.1:"+strconv.Itoa(bp))
	}
	ports := slices.Concat(fixedPorts, []int{bp - 1, bp + 1}, cfg.ExtraTCPPorts)
	for _, p := range ports {
		if p <= 0 || p > 65535 || p == bp || p == cfg.EgressPort {
			continue
		}
		for _, host := range []string{"127.0.0.1", "::1"} {
			a := joinHostPort(host, p)
			add(PropEgress, KindViolation, "net/tcp:"+a, opTCP, "", a)
		}
	}
	for _, a := range []string{"127.0.0.1:53", "[::1]:53"} {
		add(PropEgress, KindViolation, "net/dns-udp:"+a, opDNSUDP, "", a)
	}
	for _, p := range cfg.ExtraUDPPorts {
		a := joinHostPort("127.0.0.1", p)
		add(PropEgress, KindViolation, "net/dns-udp:"+a, opDNSUDP, "", a)
	}
	for _, u := range cfg.ExtraUnixSockets {
		add(PropEgress, KindViolation, "net/unix:"+u, opUnix, "", u)
	}
	add(PropEgress, KindViolation, "net/dns-resolv.conf", opDNSResolv, "", "")
	if !pod {
		// A Pod has its interface and routes by design (podNetwork).
		add(PropEgress, KindViolation, "net/non-loopback-interface", opInterfaces, "", "")
		add(PropEgress, KindViolation, "net/route-out", opRoutes, "", "")
	}

	// Privilege.
	for _, op := range []string{opNoNewPrivs, opCaps, opAmbient, opBounding, opUID, opGID, opUnshare, opCloneUser} {
		add(PropPrivilege, KindViolation, "priv/"+op, op, "", "")
	}
	for _, p := range cfg.SetuidProbes {
		add(PropPrivilege, KindViolation, "priv/setuid:"+p, opSetuid, p, "")
	}
	add(PropPrivilege, KindControl, "priv/"+opExec, opExec, "", "")
	// No set-id file can be made (it would keep its bit on the host,
	// where a host user could run it as the workspace's owner).
	add(PropPrivilege, KindViolation, "priv/"+opSetIDChmod, opSetIDChmod, sandboxTmp, "")
	add(PropPrivilege, KindViolation, "priv/"+opSetIDCreate, opSetIDCreate, sandboxTmp, "")
	add(PropPrivilege, KindControl, "priv/"+opChmodPlain, opChmodPlain, sandboxTmp, "")
	// No datagram reaches a host datagram socket (a socketpair's can
	// sendto one without socket(2)) and no FIFO can be made (a channel
	// through a shared directory); a stream pair, connected at birth,
	// stays allowed.
	for _, u := range cfg.ExtraUnixDgram {
		add(PropEgress, KindViolation, "net/unix-dgram:"+u, opUnixDgram, "", u)
	}
	add(PropEgress, KindViolation, "net/"+opFIFO, opFIFO, sandboxTmp, "")
	add(PropEgress, KindControl, "net/"+opStreamPair, opStreamPair, "", "")

	if len(pl.Probes) > MaxProbes {
		return plan{}, fmt.Errorf("measure: %d probes, at most %d (too many grants or secrets)", len(pl.Probes), MaxProbes)
	}
	return pl, nil
}

func joinHostPort(host string, port int) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]:" + strconv.Itoa(port)
	}
	return host + ":" + strconv.Itoa(port)
}

// expandSecret returns the paths to probe for one host secret. A directory
// that holds a grant cannot be unreadable as a whole (the grant's mount
// point is inside it), and neither can /tmp or a directory above it (the
// sandbox has a /tmp of its own), so their other entries on the host are
// probed instead.
func expandSecret(s string, grants []string) []string {
	holdsGrant := fsutil.Within(sandboxTmp, s) ||
		slices.ContainsFunc(grants, func(g string) bool { return g != s && fsutil.Within(g, s) })
	if !holdsGrant {
		return []string{s}
	}
	d, err := os.Open(s)
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	slices.Sort(names)
	var out []string
	for _, n := range names {
		p := filepath.Join(s, n)
		if fsutil.Within(sandboxTmp, p) || slices.ContainsFunc(grants, func(g string) bool { return fsutil.Within(g, p) || fsutil.Within(p, g) }) {
			continue // a grant, inside one, or on the way to one or to /tmp
		}
		out = append(out, p)
		if len(out) == maxSecretEntries {
			break
		}
	}
	return out
}

func encodePlan(pl plan) (string, error) {
	b, err := json.Marshal(pl)
	if err != nil {
		return "", fmt.Errorf("measure: encoding plan: %w", err)
	}
	if len(b) > MaxPlanBytes {
		return "", fmt.Errorf("measure: plan is %d bytes, at most %d (too many grants or secrets)", len(b), MaxPlanBytes)
	}
	return string(b), nil
}

// decodePlan parses the helper's argument strictly.
func decodePlan(s string) (plan, error) {
	var pl plan
	if len(s) > MaxPlanBytes {
		return plan{}, fmt.Errorf("plan is %d bytes, at most %d", len(s), MaxPlanBytes)
	}
	if err := json.Unmarshal([]byte(s), &pl, json.RejectUnknownMembers(true)); err != nil {
		return plan{}, fmt.Errorf("plan: %w", err)
	}
	if pl.V != 1 {
		return plan{}, fmt.Errorf("plan version %d, want 1", pl.V)
	}
	if pl.Host != "" {
		if a, err := netip.ParseAddr(pl.Host); err != nil || a.Zone() != "" || a.Unmap().IsLoopback() {
			return plan{}, fmt.Errorf("plan: host %q is not a non-loopback IP address", pl.Host)
		}
	}
	if len(pl.Probes) > MaxProbes {
		return plan{}, fmt.Errorf("plan has %d probes, at most %d", len(pl.Probes), MaxProbes)
	}
	ids := map[string]bool{}
	for _, p := range pl.Probes {
		if ids[p.ID] {
			return plan{}, fmt.Errorf("plan: duplicate probe id %q", p.ID)
		}
		ids[p.ID] = true
	}
	return pl, nil
}

// decodeReport parses the helper's stdout strictly against the plan. Any
// defect invalidates the whole report.
func decodeReport(b []byte, pl plan) (map[string]result, error) {
	if len(b) == 0 {
		return nil, errors.New("the helper wrote no report")
	}
	if len(b) > MaxReportBytes {
		return nil, fmt.Errorf("report larger than %d bytes", MaxReportBytes)
	}
	var r report
	if err := json.Unmarshal(b, &r, json.RejectUnknownMembers(true)); err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	if r.V != 1 {
		return nil, fmt.Errorf("report version %d, want 1", r.V)
	}
	want := map[string]bool{}
	for _, p := range pl.Probes {
		want[p.ID] = true
	}
	out := map[string]result{}
	for _, res := range r.Results {
		if !want[res.ID] {
			return nil, fmt.Errorf("report: unknown probe id %q", res.ID)
		}
		if _, dup := out[res.ID]; dup {
			return nil, fmt.Errorf("report: duplicate probe id %q", res.ID)
		}
		switch res.Outcome {
		case OutcomeSucceeded, OutcomeFailed, OutcomeError:
		default:
			return nil, fmt.Errorf("report: probe %q has outcome %q", res.ID, res.Outcome)
		}
		res.Detail = truncate(res.Detail)
		out[res.ID] = res
	}
	return out, nil
}

// judge turns an outcome into OK for a kind.
func judge(kind, outcome string) bool {
	switch kind {
	case KindViolation:
		return outcome == OutcomeFailed
	case KindControl:
		return outcome == OutcomeSucceeded
	}
	return false
}

// truncate bounds s to MaxDetailBytes on a rune boundary, as valid UTF-8.
func truncate(s string) string {
	if len(s) > MaxDetailBytes {
		i := MaxDetailBytes
		for i > 0 && !utf8.RuneStart(s[i]) {
			i--
		}
		s = s[:i] + "…"
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
