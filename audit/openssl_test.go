package audit

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/moat-sandbox/moat/internal/testenv"
)

// TestOpenSSLInterop checks journal signatures with OpenSSL alone, from
// pubkey.pem and the PAE bytes, so that the format is verifiable without
// moat: every line verifies, and a PAE with one payload byte changed does not.
func TestOpenSSLInterop(t *testing.T) {
	openssl, err := exec.LookPath("openssl")
	testenv.Need(t, err == nil, "openssl not found in PATH")
	j := buildJournal(t)
	dir := t.TempDir()
	pubPath := filepath.Join(dir, "pubkey.pem")
	if err := os.WriteFile(pubPath, j.w.PublicKeyPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	verify := func(pae, sig []byte) (bool, string) {
		paePath, sigPath := filepath.Join(dir, "pae.bin"), filepath.Join(dir, "sig.bin")
		os.WriteFile(paePath, pae, 0o644)
		os.WriteFile(sigPath, sig, 0o644)
		out, err := exec.Command(openssl, "pkeyutl", "-verify", "-pubin", "-inkey", pubPath, "-rawin",
			"-in", paePath, "-sigfile", sigPath).CombinedOutput()
		return err == nil && bytes.Contains(out, []byte("Signature Verified Successfully")), string(out)
	}
	for i, l := range [][]byte{j.lines[0], j.lines[3], j.lines[len(j.lines)-1]} {
		env, err := parseEnvelope(l)
		if err != nil {
			t.Fatal(err)
		}
		pae := PAE(PayloadType, env.payload)
		if ok, out := verify(pae, env.sig); !ok {
			t.Fatalf("line %d: openssl rejects a valid signature: %s", i, out)
		}
		bad := bytes.Clone(pae)
		bad[len(bad)-2] ^= 1
		if ok, out := verify(bad, env.sig); ok {
			t.Fatalf("line %d: openssl accepts a changed payload: %s", i, out)
		}
	}
}
