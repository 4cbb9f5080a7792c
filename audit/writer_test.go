package audit

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

func TestCreateFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "runs", "r1")
	w, err := Create(dir, "r1")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, c := range []struct {
		path string
		mode os.FileMode
	}{{dir, 0o700 | os.ModeDir}, {w.JournalPath(), 0o600}, {filepath.Join(dir, PublicKeyFile), 0o644}} {
		fi, err := os.Stat(c.path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != c.mode {
			t.Errorf("%s: mode %v, want %v", c.path, fi.Mode(), c.mode)
		}
	}
	pemBytes, err := os.ReadFile(filepath.Join(dir, PublicKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(pemBytes, w.PublicKeyPEM()) {
		t.Errorf("pubkey.pem differs from PublicKeyPEM()")
	}
	pub, err := ParsePublicKeyPEM(pemBytes)
	if err != nil || !pub.Equal(w.PublicKey()) {
		t.Fatalf("ParsePublicKeyPEM: %v, equal=%v", err, pub.Equal(w.PublicKey()))
	}
	if len(w.KeyID()) != 64 || w.KeyID() != KeyID(pub) {
		t.Errorf("KeyID %q", w.KeyID())
	}
	if _, err := w.Append(runStarted(w)); err != nil {
		t.Fatal(err)
	}
	// The private key is nowhere on disk: neither its seed nor its
	// 64-byte form appears in any file of the run directory.
	seed := w.priv.Seed()
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
		if bytes.Contains(b, seed) || bytes.Contains(b, []byte(b64.EncodeToString(seed))) {
			t.Errorf("%s holds the private key", e.Name())
		}
	}
	// Two runs never share a key.
	w2, err := Create(filepath.Join(t.TempDir(), "r2"), "r2")
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	if w2.KeyID() == w.KeyID() {
		t.Error("two writers have the same key")
	}
}

func TestCreateRefuses(t *testing.T) {
	base := t.TempDir()
	full := filepath.Join(base, "full")
	os.Mkdir(full, 0o755)
	os.WriteFile(filepath.Join(full, "x"), nil, 0o600)
	file := filepath.Join(base, "file")
	os.WriteFile(file, nil, 0o600)
	empty := filepath.Join(base, "empty")
	os.Mkdir(empty, 0o755)
	for _, c := range []struct {
		name, dir, run string
		ok             bool
	}{
		{"non-empty dir", full, "r", false},
		{"a file", file, "r", false},
		{"bad run id", filepath.Join(base, "n1"), "a b", false},
		{"empty run id", filepath.Join(base, "n2"), "", false},
		{"empty dir", empty, "r", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			w, err := Create(c.dir, c.run)
			if (err == nil) != c.ok {
				t.Fatalf("Create: err %v, want ok=%v", err, c.ok)
			}
			if w != nil {
				w.Close()
				fi, _ := os.Stat(c.dir)
				if fi.Mode().Perm() != 0o700 {
					t.Errorf("mode %v, want 0700", fi.Mode().Perm())
				}
			}
		})
	}
}

func TestAppendAllTypesVerifies(t *testing.T) {
	j := buildJournal(t)
	if !bytes.Equal(j.raw, joinLines(j.lines)) {
		t.Fatal("file bytes differ from the lines Append returned")
	}
	r := Verify(j.raw, j.pub)
	if r.Status != Complete || r.Records != 10 || r.Err != nil {
		t.Fatalf("Verify: %+v, want complete with 10 records", r)
	}
	want := Counts{Requested: 2, Completed: 1, Refused: 1, Failed: 1, Processes: 1}
	if r.Terminal == nil || r.Terminal.Counts != want || j.w.Counts() != want {
		t.Errorf("counts: terminal %+v, writer %+v, want %+v", r.Terminal, j.w.Counts(), want)
	}
	for i, l := range j.lines {
		e, err := VerifyLine(l, j.pub)
		if err != nil {
			t.Fatalf("VerifyLine(line %d): %v", i+1, err)
		}
		if e.Header.Seq != int64(i+1) {
			t.Errorf("line %d: seq %d", i+1, e.Header.Seq)
		}
	}
	// The typed records come back as written.
	e, _ := VerifyLine(j.lines[2], j.pub)
	if ps, ok := e.Record.(ProcessStarted); !ok || ps.Argv[3] != "ünïcode <&>" {
		t.Errorf("line 3 record %#v", e.Record)
	}
}

func TestAppendRefusesOutOfPlace(t *testing.T) {
	w, _ := newTestWriter(t)
	if _, err := w.Append(ProcessStarted{ProcessID: "p"}); err == nil {
		t.Fatal("first record process.started accepted")
	}
	rs := runStarted(w)
	rs.PublicKey = "other"
	if _, err := w.Append(rs); err == nil {
		t.Fatal("run.started with a foreign public key accepted")
	}
	if _, err := w.Append(runStarted(w)); err != nil {
		t.Fatalf("run.started refused: %v", err)
	}
	if _, err := w.Append(runStarted(w)); err == nil {
		t.Fatal("second run.started accepted")
	}
	if _, err := w.Append(ProcessStarted{ProcessID: "p"}); err == nil {
		t.Fatal("process.started on line 2 accepted")
	}
	if _, err := w.Append(BoundaryConfirmed{Ready: true}); err != nil {
		t.Fatalf("boundary.confirmed on line 2 refused: %v", err)
	}
	if _, err := w.Append(ProcessStarted{ProcessID: "p"}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Append(BoundaryConfirmed{Ready: true}); err == nil {
		t.Fatal("boundary.confirmed on line 4 accepted")
	}
	if _, err := w.Append(nil); err == nil {
		t.Fatal("nil record accepted")
	}
	if _, err := w.Append(&ProcessExited{ProcessID: "p"}); err == nil {
		t.Fatal("pointer record accepted")
	}
	if _, err := w.Append(foreignRecord{}); err == nil {
		t.Fatal("foreign record type accepted")
	}
	if _, err := w.Append(RunTerminated{Reason: ReasonCompleted, Counts: Counts{Requested: 99}}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Append(ProcessExited{ProcessID: "p"}); !errors.Is(err, ErrTerminated) {
		t.Fatalf("Append after run.terminated: %v, want ErrTerminated", err)
	}
	w.Close()
	if _, err := w.Append(ProcessExited{ProcessID: "p"}); err == nil {
		t.Fatal("Append after Close accepted")
	}
	j, _ := os.ReadFile(w.JournalPath())
	r := Verify(j, w.PublicKey())
	if r.Status != Complete || r.Records != 4 || r.Terminal.Counts != (Counts{Processes: 1}) {
		t.Fatalf("Verify %+v, want complete, 4 records, counts set by the writer", r)
	}
}

type foreignRecord struct{}

func (foreignRecord) RecordType() string { return TypeProcessExited }

// Concurrent appenders: every returned line is in the journal exactly once,
// in one total order that verifies.
func TestAppendConcurrent(t *testing.T) {
	w, _ := newTestWriter(t)
	for _, r := range []Record{runStarted(w), BoundaryConfirmed{Ready: true}} {
		if _, err := w.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	const workers, each = 8, 40
	var mu sync.Mutex
	got := map[string]bool{}
	var wg sync.WaitGroup
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				l, err := w.Append(ProcessStarted{ProcessID: fmt.Sprintf("g%d-%d", g, i), Argv: []string{"x"}})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				got[string(l)] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if _, err := w.Append(RunTerminated{Reason: ReasonCompleted}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	raw, _ := os.ReadFile(w.JournalPath())
	r := Verify(raw, w.PublicKey())
	if r.Status != Complete || r.Records != workers*each+3 {
		t.Fatalf("Verify: %+v", r)
	}
	lines := bytes.Split(bytes.TrimSuffix(raw, []byte("\n")), []byte("\n"))
	n := 0
	for _, l := range lines {
		if got[string(l)] {
			n++
		}
	}
	if n != workers*each || len(got) != workers*each {
		t.Fatalf("%d of %d returned lines found in the journal", n, len(got))
	}
}

func TestParsePublicKeyPEM(t *testing.T) {
	w, _ := newTestWriter(t)
	good := w.PublicKeyPEM()
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ecDER, _ := x509.MarshalPKIXPublicKey(&ecKey.PublicKey)
	ecPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: ecDER})
	for _, c := range []struct {
		name string
		in   []byte
		ok   bool
	}{
		{"pubkey.pem", good, true},
		{"surrounding blank lines", append(append([]byte("\n"), good...), '\n'), true},
		{"text before", append([]byte("key:\n"), good...), false},
		{"a begin line before (found by fuzzing)", append([]byte("-----BEGIN \n"), good...), false},
		{"a broken block before", append([]byte("-----BEGIN PUBLIC KEY-----\n!!\n-----END PUBLIC KEY-----\n"), good...), false},
		{"text after", append(bytes.Clone(good), "more"...), false},
		{"two blocks", append(bytes.Clone(good), good...), false},
		{"private key type", bytes.ReplaceAll(good, []byte("PUBLIC KEY"), []byte("PRIVATE KEY")), false},
		{"an EC key", ecPEM, false},
		{"empty", nil, false},
		{"too large", bytes.Repeat([]byte("A"), MaxPublicKeyPEM+1), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			k, err := ParsePublicKeyPEM(c.in)
			if (err == nil) != c.ok {
				t.Fatalf("err %v, want ok=%v", err, c.ok)
			}
			if c.ok && !k.Equal(w.PublicKey()) {
				t.Fatal("parsed a different key")
			}
		})
	}
}
