package grants

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/testenv"
)

// layout makes ws/sysroot/etc/passwd inside a fresh temporary directory
// (below /tmp, so in the untrusted zone) and a "secret" directory beside
// the workspace.
func layout(t *testing.T) (ws, secret string) {
	t.Helper()
	dir := t.TempDir()
	ws = filepath.Join(dir, "ws")
	secret = filepath.Join(dir, "secret")
	for _, d := range []string{filepath.Join(ws, "sysroot", "etc"), secret} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(secret, "key"), []byte("private"), 0o600); err != nil {
		t.Fatal(err)
	}
	return ws, secret
}

func problem(t *testing.T, err error, code string) Problem {
	t.Helper()
	var ge *Error
	if !errors.As(err, &ge) || len(ge.Problems) != 1 || ge.Problems[0].Code != code {
		t.Fatalf("got %v, want one %s problem", err, code)
	}
	return ge.Problems[0]
}

// TestPlantedSymlinkAcrossRuns is the attack of issue 11, class 1: a
// workload renames a parent of a nested grant and plants a symlink in one
// run; the next run must not follow it. The control is the same policy
// before the plant.
func TestPlantedSymlinkAcrossRuns(t *testing.T) {
	ws, secret := layout(t)
	nested := filepath.Join(ws, "sysroot", "etc")
	specs := []Spec{{Key: "rw", Path: ws, Write: true}, {Key: "ro", Path: nested}}
	pl, err := Resolve(specs, "")
	if err != nil {
		t.Fatalf("control: before the plant: %v", err)
	}
	if len(pl.Mounts) != 2 || pl.Mounts[1].Real != nested || len(pl.Links) != 0 {
		t.Fatalf("control: plan %+v", pl)
	}
	// "Run 1" of the workload: rename and plant.
	if err := os.Rename(filepath.Join(ws, "sysroot"), filepath.Join(ws, "old")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(ws, "sysroot")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(".", filepath.Join(secret, "etc")); err != nil {
		t.Fatal(err)
	}
	// "Run 2".
	_, err = Resolve(specs, "")
	p := problem(t, err, CodeSymlink)
	if p.Key != "ro" || !strings.Contains(p.Message, filepath.Join(ws, "sysroot")) {
		t.Errorf("problem %+v: want it on the nested grant, naming the planted link", p)
	}
}

// TestFinalSymlinkRefused: a grant whose last component is a symlink in a
// directory others can write is refused (gVisor used to follow it); the
// same grant as a directory is the control.
func TestFinalSymlinkRefused(t *testing.T) {
	ws, secret := layout(t)
	link := filepath.Join(ws, "data")
	if err := os.Mkdir(link, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Resolve([]Spec{{Key: "ro", Path: link}}, ""); err != nil {
		t.Fatalf("control: %v", err)
	}
	os.Remove(link)
	if err := os.Symlink(secret, link); err != nil {
		t.Fatal(err)
	}
	problem(t, func() error { _, err := Resolve([]Spec{{Key: "ro", Path: link}}, ""); return err }(), CodeSymlink)
}

// TestTrustedSymlinkRecreated: on a merged-/usr host, /bin is a root-owned
// symlink in a root-owned directory: it is followed once, the mount is the
// real path, and the link is recreated inside.
func TestTrustedSymlinkRecreated(t *testing.T) {
	target, err := os.Readlink("/bin")
	testenv.Need(t, err == nil && target == "usr/bin", "needs a merged-/usr host where /bin -> usr/bin")
	pl, err := Resolve([]Spec{{Key: "ro", Path: "/bin"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if m := pl.Mounts[0]; m.Real != "/usr/bin" || !m.Dir || m.Trusted != "/usr/bin" {
		t.Errorf("mount %+v, want /usr/bin, trusted all the way", m)
	}
	if len(pl.Links) != 1 || pl.Links[0] != (Link{Path: "/bin", Target: "usr/bin"}) {
		t.Errorf("links %+v, want /bin -> usr/bin", pl.Links)
	}
	// With /usr granted as well, the link is still recreated (it is not
	// inside /usr) and /usr/bin is covered.
	pl, err = Resolve([]Spec{{Key: "a", Path: "/usr"}, {Key: "b", Path: "/bin"}}, "")
	if err != nil || len(pl.Links) != 1 || !pl.Covered("/usr/bin") {
		t.Errorf("plan %+v, %v", pl, err)
	}
}

// TestSwapBetweenCheckAndOpen is the check-then-mount race of issue 11,
// class 2, driven deterministically: the grant is replaced between
// Resolve and Open. Open must refuse both a replaced directory and a
// symlink; the control opens the untouched grant.
func TestSwapBetweenCheckAndOpen(t *testing.T) {
	ws, secret := layout(t)
	nested := filepath.Join(ws, "sysroot", "etc")
	pl, err := Resolve([]Spec{{Key: "ro", Path: nested}}, "")
	if err != nil {
		t.Fatal(err)
	}
	m := pl.Mounts[0]
	fd, err := m.Open(Checks{WriteOwner: -1})
	if err != nil {
		t.Fatalf("control: %v", err)
	}
	closeFD(fd)

	// A replaced directory (same path, other inode).
	if err := os.Rename(nested, nested+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(nested, 0o755); err != nil {
		t.Fatal(err)
	}
	if fd, err := m.Open(Checks{WriteOwner: -1}); err == nil || !strings.Contains(err.Error(), "no longer") {
		closeFD(fd)
		t.Errorf("replaced directory: got %v, want refused", err)
	}
	// A symlink to a host path outside the grants, at the parent.
	os.Remove(nested)
	sys := filepath.Join(ws, "sysroot")
	if err := os.Rename(sys, sys+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, sys); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(secret, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if fd, err := m.Open(Checks{WriteOwner: -1}); err == nil {
		closeFD(fd)
		t.Errorf("symlinked parent: opened, want refused")
	}
	// Put it back exactly: the same inode opens again.
	os.Remove(sys)
	if err := os.Rename(sys+".old", sys); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(nested+".old", nested); err != nil {
		t.Fatal(err)
	}
	fd, err = m.Open(Checks{WriteOwner: -1})
	if err != nil {
		t.Errorf("control after restoring: %v", err)
	}
	closeFD(fd)
}

// TestWriteOwner: a read_write grant must be owned by the uid the checks
// name; the matching owner is the control.
func TestWriteOwner(t *testing.T) {
	ws, _ := layout(t)
	pl, err := Resolve([]Spec{{Key: "rw", Path: ws, Write: true}}, "")
	if err != nil {
		t.Fatal(err)
	}
	fd, err := pl.Mounts[0].Open(Checks{WriteOwner: os.Geteuid()})
	if err != nil {
		t.Fatalf("control: %v", err)
	}
	closeFD(fd)
	if fd, err := pl.Mounts[0].Open(Checks{WriteOwner: os.Geteuid() + 1}); err == nil {
		closeFD(fd)
		t.Errorf("foreign owner: opened, want refused")
	}
}

// TestForbiddenAndAudit: /, /proc, /sys, /dev and anything resolving into
// them are refused, and so is a grant holding the audit directory or
// inside it; a sibling audit directory is the control.
func TestForbiddenAndAudit(t *testing.T) {
	for _, p := range []string{"/", "/proc/self", "/sys", "/dev/null"} {
		if _, err := Resolve([]Spec{{Key: "k", Path: p}}, ""); err == nil {
			t.Errorf("%s: resolved, want forbidden", p)
		}
	}
	ws, secret := layout(t)
	if err := os.Symlink("/proc", filepath.Join(ws, "p")); err != nil {
		t.Fatal(err)
	}
	problem(t, func() error { _, err := Resolve([]Spec{{Key: "k", Path: filepath.Join(ws, "p")}}, ""); return err }(), CodeSymlink)

	audit := filepath.Join(ws, "runs")
	if err := os.Mkdir(audit, 0o700); err != nil {
		t.Fatal(err)
	}
	problem(t, func() error { _, err := Resolve([]Spec{{Key: "k", Path: ws}}, audit); return err }(), CodeAuditInside)
	problem(t, func() error { _, err := Resolve([]Spec{{Key: "k", Path: audit}}, ws); return err }(), CodeAuditInside)
	if _, err := Resolve([]Spec{{Key: "k", Path: ws}}, secret); err != nil {
		t.Errorf("control: sibling audit directory: %v", err)
	}
}

func closeFD(fd int) {
	if fd >= 0 {
		unix.Close(fd)
	}
}
