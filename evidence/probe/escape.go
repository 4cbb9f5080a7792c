package probe

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/probekit"
)

// Names shared with the controller for the cases of the escape classes
// that issue 11's attack found. Paths are relative to the workspace.
const (
	// SetIDPlain is the setid-file control: made 0755 with chmod.
	SetIDPlain = "setid-plain"
	// NestedGrantParent is the directory planted-grant-symlink renames
	// aside and replaces with a symlink; NestedGrantDir (below it) is the
	// nested read-only grant and NestedGrantFile the file read there.
	NestedGrantParent = "sysroot"
	NestedGrantDir    = "sysroot/etc"
	NestedGrantFile   = "sysroot/etc/conf"
	// PlantedRunInfo is the symlink run-info-symlink's run 1 plants; run 2
	// is started with --run-info at it.
	PlantedRunInfo = "run-info.json"
	// InotifyHeld appears once the probe holds its inotify instances (it
	// holds the count and the error that stopped it); the probe lets them
	// go when InotifyRelease appears, or after markerWait.
	InotifyHeld    = ".moat-evidence-inotify-held"
	InotifyRelease = ".moat-evidence-inotify-release"
	// MaxInotify bounds the instances the probe tries to hold.
	MaxInotify = 1024
)

// SetIDAttacks are the files (one directory among them) that setid-file
// tries to make set-id, each through a different system call; the name
// says how.
var SetIDAttacks = []string{
	"setid-chmod-4755", "setid-chmod-2755", "setid-fchmod-6755", "setid-fchmodat-4755",
	"setid-fchmodat2-4755", "setid-open-4755", "setid-openat2-4755", "setid-mknod-4755",
	"setid-mkdir-2755", "setid-dir-chmod-2755",
}

func init() {
	caseSteps["host-datagram-socket"] = func(p *runner) {
		p.control("before")
		for _, how := range probekit.DatagramWays {
			p.dgram(how, p.Unixgram)
		}
		p.control("after")
	}
	caseSteps["setid-file"] = func(p *runner) {
		p.control("before")
		ws := p.Workspace
		for _, name := range SetIDAttacks {
			detail, err := probekit.SetID(filepath.Join(ws, name))
			p.step(name, 0, err, detail)
		}
		detail, err := probekit.ChmodNew(filepath.Join(ws, SetIDPlain), 0o755)
		p.step(SetIDPlain, 0, err, detail)
		p.control("after")
	}
	caseSteps["planted-grant-symlink"] = func(p *runner) {
		if p.Run > 1 {
			// The run must have been refused; if it starts, it shows what
			// the nested grant now holds.
			b, err := os.ReadFile(filepath.Join(p.Workspace, NestedGrantFile))
			p.step("read-nested-grant", 0, err, string(b))
			p.post("nested-read-later", "/v1/messages", p.message(p.Model, AttackMarker+" nested data="+string(b), nil), nil)
			return
		}
		p.control("before")
		b, err := os.ReadFile(filepath.Join(p.Workspace, NestedGrantFile))
		p.step("read-nested-grant", 0, err, "")
		if err == nil {
			p.post("control:nested-read", "/v1/messages", p.message(p.Model, ControlPrefix+"nested-read data="+strings.TrimSpace(string(b)), nil), nil)
		}
		parent := filepath.Join(p.Workspace, NestedGrantParent)
		err = os.Rename(parent, parent+".old")
		if err == nil {
			err = os.Symlink(p.Target, parent)
		}
		p.step("plant-symlink", 0, err, "")
		p.control("after")
	}
	caseSteps["run-info-symlink"] = func(p *runner) {
		if p.Run > 1 {
			return
		}
		p.control("before")
		p.step("plant-run-info-symlink", 0, os.Symlink(p.Target, filepath.Join(p.Workspace, PlantedRunInfo)), "")
		p.control("after")
	}
	caseSteps["inotify-counter"] = func(p *runner) {
		p.control("before")
		n, err := holdInotify(func(n int, why error) {
			msg := fmt.Sprintf("%d %v\n", n, why)
			p.step("inotify-held", n, why, "")
			os.WriteFile(filepath.Join(p.Workspace, InotifyHeld), []byte(msg), 0o644)
			if err := waitFile(filepath.Join(p.Workspace, InotifyRelease), markerWait); err != nil {
				p.step("wait-release", 0, err, "")
			}
		})
		p.step("inotify-released", n, err, "")
		time.Sleep(10 * time.Millisecond)
		p.control("after")
	}
}

// dgram sends the attack marker to the datagram socket at addr one way
// (one of probekit.DatagramWays).
func (p *runner) dgram(how, addr string) {
	p.step("dgram-"+how, 0, probekit.SendDatagram(how, addr, []byte("escape "+AttackMarker)), "")
}
