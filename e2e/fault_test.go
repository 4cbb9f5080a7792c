//go:build linux

package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/internal/testenv"
)

// The journal's storage fails during a run (a real, full tmpfs): the
// faulted request never reaches the provider and none does afterwards,
// moat run exits 125, and the journal verifies as an intact prefix (exit 2).
func TestRootAuditFault(t *testing.T) {
	testenv.NeedRoot(t)
	e := newEnv(t)
	if err := os.MkdirAll(e.auditDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", e.auditDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=256k,mode=0700"); err != nil {
		t.Fatalf("mounting a small tmpfs: %v", err)
	}
	defer unix.Unmount(e.auditDir, unix.MNT_DETACH)
	p, ptls := newProvider(t, false), newProvider(t, true)
	pol := e.brokerPolicy(p, ptls)

	ri := filepath.Join(e.dir, "run.json")
	go1 := filepath.Join(e.workspace, "go1")
	go2 := filepath.Join(e.workspace, "go2")
	args := []string{"run", "--policy", pol, "--run-info", ri, "--", e.probe, helperArg,
		"wait-file=" + go1, "sdk-anthropic=claude-e2e", "wait-file=" + go2}
	cmd := e.command(append(args, repeat("sdk-anthropic=claude-e2e", 12)...)...)
	cmd.Env = append(cmd.Env, "E2E_ANTHROPIC_KEY="+anthropicCred, "E2E_OPENAI_KEY="+openaiCred) // every provider's credential is checked at start
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "run info", 60*e2eSecond, func() bool { _, err := os.Stat(ri); return err == nil })
	var info struct {
		Journal      string `json:"journal"`
		PublicKeyPEM string `json:"public_key_pem"`
	}
	b, _ := os.ReadFile(ri)
	json.Unmarshal(b, &info)
	p.PinPEM(info.PublicKeyPEM)
	// Control: with storage that works, a request goes through.
	os.WriteFile(go1, nil, 0o644)
	waitFor(t, "the control request", 20*e2eSecond, func() bool { return len(p.Requests()) == 1 })
	// Now fill the journal's filesystem.
	filler, err := os.Create(filepath.Join(e.auditDir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 4096)
	for {
		if _, err := filler.Write(chunk); err != nil {
			break
		}
	}
	filler.Sync()
	filler.Close()
	os.WriteFile(go2, nil, 0o644)
	cmd.Wait()
	r := result{so.String(), se.String(), cmd.ProcessState.ExitCode()}
	if r.code != 125 {
		t.Errorf("moat run: got exit %d, want 125\n%s", r.code, r)
	}
	// The filesystem is full, but the journal's last page may still hold a
	// record or two: the fault hits one of the later requests. Every
	// request the provider saw has its durable pre-effect record, the
	// faulted one and everything after it never arrived.
	seen := len(p.Requests())
	if seen >= 13 {
		t.Errorf("the provider saw all %d requests: the fault never stopped anything", seen)
	}
	if !strings.Contains(r.stderr, "journal") && !strings.Contains(r.stderr, "audit") {
		t.Errorf("moat does not say the journal failed:\n%s", r.stderr)
	}
	// Free space so that verification can read; the journal stays as the
	// fault left it.
	os.Remove(filepath.Join(e.auditDir, "filler"))
	pub := filepath.Join(e.dir, "pub.pem")
	os.WriteFile(pub, []byte(info.PublicKeyPEM), 0o644)
	v := e.moat("audit", "verify", info.Journal, "--pubkey", pub)
	if v.code != 2 {
		t.Errorf("journal after the fault: got exit %d, want 2 (an intact prefix, never complete)\n%s", v.code, v)
	}
	jb, _ := os.ReadFile(info.Journal)
	requested := 0
	for _, l := range bytes.Split(jb, []byte("\n")) {
		if e, err := audit.ParseLine(l); err == nil && e.Header.Type == audit.TypeInferenceRequested {
			requested++
		}
	}
	if requested != seen {
		t.Errorf("the provider saw %d requests but the journal holds %d pre-effect records", seen, requested)
	}
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}
