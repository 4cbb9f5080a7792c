package probe

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/probekit"
)

// Outside a sandbox every datagram way reaches a pathname datagram socket:
// the attacks of host-datagram-socket are real, so their failure inside
// is the boundary's doing.
func TestDgramWaysDeliverUnconfined(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "recv.dgram")
	pc, err := net.ListenPacket("unixgram", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	var out bytes.Buffer
	p := &runner{out: &out}
	for _, how := range probekit.DatagramWays {
		p.dgram(how, sock)
		pc.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 256)
		n, _, err := pc.ReadFrom(buf)
		if err != nil || !strings.Contains(string(buf[:n]), AttackMarker) {
			t.Errorf("%s: got %q, %v; want the attack marker (probe said %s)", how, buf[:n], err, out.String())
		}
	}
}

// Outside a sandbox each set-id attack sets its bit (mkdir excepted: the
// kernel drops set-id bits from mkdir's mode), and the plain chmod works.
func TestSetIDAttacksWorkUnconfined(t *testing.T) {
	dir := t.TempDir()
	for _, name := range SetIDAttacks {
		p := filepath.Join(dir, name)
		detail, err := probekit.SetID(p)
		if err != nil {
			if name == "setid-openat2-4755" && err == unix.ENOSYS {
				continue
			}
			t.Errorf("%s: %v (%s)", name, err, detail)
			continue
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		mode, err := strconv.ParseUint(name[strings.LastIndexByte(name, '-')+1:], 8, 32)
		if err != nil {
			t.Fatalf("%s: no octal mode at the end of the name", name)
		}
		want := uint32(mode) & 0o6000
		if name == "setid-mkdir-2755" {
			want = 0
		}
		if got := st.Mode & 0o6000; got != want {
			t.Errorf("%s: set-id bits %#o, want %#o", name, got, want)
		}
	}
	if _, err := probekit.ChmodNew(filepath.Join(dir, SetIDPlain), 0o755); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(dir, SetIDPlain)); err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("plain chmod: %v %v", st, err)
	}
}

// The probe holds inotify instances until the kernel refuses one (or its
// cap), and lets them go afterwards.
func TestHoldInotify(t *testing.T) {
	var during int
	n, _ := holdInotify(func(n int, why error) {
		during = countInotify(t)
	})
	if n < 1 || during < n {
		t.Fatalf("held %d, counted %d while held", n, during)
	}
	if after := countInotify(t); after != 0 {
		t.Fatalf("%d inotify descriptors left after release", after)
	}
}

func countInotify(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if l, _ := os.Readlink("/proc/self/fd/" + e.Name()); l == "anon_inode:inotify" {
			n++
		}
	}
	return n
}
