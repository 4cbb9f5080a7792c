package probekit

import (
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestLinuxKinds(t *testing.T) {
	for _, k := range []string{"unshare-user", "ids", "caps", "plant", "chmod", "setid", "dgram", "fifo", "io_uring", "keyctl", "ptrace", "ptrace-child", "socket", "kill0", "fds", "pids"} {
		if !slices.Contains(Kinds(), k) {
			t.Errorf("kit lacks %q", k)
		}
	}
}

// Every datagram way delivers to a pathname socket outside a sandbox (the
// control for the sandbox's refusals); a missing socket is an error.
func TestSendDatagramWays(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "recv.dgram")
	pc, err := net.ListenPacket("unixgram", path)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	buf := make([]byte, 256)
	for _, how := range DatagramWays {
		if err := SendDatagram(how, path, []byte("hello "+how)); err != nil {
			t.Errorf("%s: %v", how, err)
			continue
		}
		pc.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, _, err := pc.ReadFrom(buf)
		if err != nil || string(buf[:n]) != "hello "+how {
			t.Errorf("%s: received %q, %v", how, buf[:n], err)
		}
	}
	if err := SendDatagram("socket-sendto", filepath.Join(dir, "none"), []byte("x")); err == nil {
		t.Error("a datagram to no socket was sent")
	}
	if err := SendDatagram("carrier-pigeon", path, []byte("x")); err == nil || !strings.Contains(err.Error(), "unknown datagram way") {
		t.Errorf("unknown way: %v", err)
	}
	out, _ := run(t, nil, "dgram="+path)
	if got := lineOf(t, out, "dgram="+path); got != "ok sent by "+DatagramWays[0] {
		t.Errorf("dgram action: %q", got)
	}
}

// Outside a sandbox the owner of a file may make it set-uid: the control
// for the sandbox's refusals.
func TestSetIDOutsideASandbox(t *testing.T) {
	dir := t.TempDir()
	for name, want := range map[string]string{
		"setid-chmod-4755": "mode 04755", "setid-fchmod-4755": "mode 04755", "setid-fchmodat-4755": "mode 04755",
		"setid-open-4755": "mode 04755", "setid-mknod-4755": "mode 04755",
	} {
		got, err := SetID(filepath.Join(dir, name))
		if err != nil || got != want {
			t.Errorf("%s: %q, %v; want %q", name, got, err, want)
		}
	}
	if _, err := SetID(filepath.Join(dir, "setid-chmod-x")); err == nil {
		t.Error("a name without a mode was tried")
	}
	out, _ := run(t, nil, "chmod="+filepath.Join(dir, "plain")+":755", "chmod="+filepath.Join(dir, "p")+":99")
	if got := lineOf(t, out, "chmod="+filepath.Join(dir, "plain")+":755"); got != "ok mode 0755" {
		t.Errorf("chmod action: %q", got)
	}
	if got := lineOf(t, out, "chmod="+filepath.Join(dir, "p")+":99"); !strings.HasPrefix(got, "err chmod wants") {
		t.Errorf("bad mode: %q", got)
	}
}

func TestProcessActions(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "sub")
	os.Mkdir(sub, 0o755)
	out, _ := run(t, nil, "ids=", "fds=", "pids=", "socket=inet,stream,0", "socket=inet,bogus,0", "kill0=x",
		"plant="+sub+">/etc", "fifo="+filepath.Join(dir, "fifo"), "env=")
	for action, prefix := range map[string]string{
		"ids=": "ok uid=", "fds=": "ok 0 1", "pids=": "ok ", "socket=inet,stream,0": "ok",
		"socket=inet,bogus,0": "err socket: \"bogus\"", "kill0=x": "err kill0 wants a pid",
		"plant=" + sub + ">/etc": "ok", "fifo=" + filepath.Join(dir, "fifo"): "ok", "env=": "ok ",
	} {
		if got := lineOf(t, out, action); !strings.HasPrefix(got, prefix) {
			t.Errorf("%s: %q, want a line starting %q", action, got, prefix)
		}
	}
	if l, err := os.Readlink(sub); err != nil || l != "/etc" {
		t.Errorf("plant: %q %v", l, err)
	}
	if st, err := os.Lstat(filepath.Join(dir, "fifo")); err != nil || st.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("fifo: %v %v", st, err)
	}
}
