package audit

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// fuzzKey is a fixed test key, so that the seed journals (and the corpus
// in testdata/fuzz) are the same on every run.
var fuzzKey = ed25519.NewKeyFromSeed(func() []byte { s := sha256.Sum256([]byte("moat audit fuzz key")); return s[:] }())

var (
	fuzzOnce     sync.Once
	fuzzJournals [][]byte // complete journals made by the writer with fuzzKey
	fuzzErr      error
)

// fuzzSeeds builds, once, three complete journals with fuzzKey and a
// fixed clock: every record type, the shortest possible run, and a run
// with lockfile digests and reloads.
func fuzzSeeds(tb testing.TB) [][]byte {
	fuzzOnce.Do(func() {
		base, err := os.MkdirTemp("", "audit-fuzz-")
		if err != nil {
			fuzzErr = err
			return
		}
		defer os.RemoveAll(base)
		clock := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
		tick := func() time.Time { clock = clock.Add(1500 * time.Microsecond); return clock }
		// The third: lockfile digests in run.started, and reloads (one
		// applied, one refused) that the verifier follows.
		a, b := strings.Repeat("a", 64), strings.Repeat("b", 64)
		lock := []PackageLockfile{{Kind: "npm", Path: "/w/package-lock.json", SHA256: a, Pins: 2, Trust: "pinned"}}
		reloads := []Record{sampleRecords()[0],
			PackageReload{Requester: "uid 0 pid 7", Outcome: ReloadApplied, Lockfiles: []PackageLockfileChange{{Kind: "npm", Path: "/w/package-lock.json", OldSHA256: a, SHA256: b, Pins: 3, Trust: "pinned"}}},
			PackageReload{Requester: "uid 0 pid 8", Outcome: ReloadRefused, Reason: "lockfile_invalid", Detail: "bad",
				Lockfiles: []PackageLockfileChange{{Kind: "npm", Path: "/w/package-lock.json", OldSHA256: b, SHA256: a, Trust: "pinned"}}}}
		for i, recs := range [][]Record{sampleRecords(), nil, reloads} {
			dir := filepath.Join(base, string(rune('a'+i)))
			os.Mkdir(dir, 0o700)
			w, err := create(dir, "fuzz-run", fuzzKey, tick)
			if err != nil {
				fuzzErr = err
				return
			}
			rs := runStarted(w)
			if i == 2 {
				rs.Lockfiles = lock
			}
			all := append(append([]Record{rs}, recs...), RunTerminated{Reason: ReasonCompleted})
			for _, r := range all {
				if _, err := w.Append(r); err != nil {
					fuzzErr = err
					return
				}
			}
			w.Close()
			j, err := os.ReadFile(w.JournalPath())
			if err != nil {
				fuzzErr = err
				return
			}
			fuzzJournals = append(fuzzJournals, j)
		}
	})
	if fuzzErr != nil {
		tb.Fatal(fuzzErr)
	}
	return fuzzJournals
}

// FuzzVerify: Verify never panics; a journal it calls complete is byte for
// byte one the writer made; the valid prefix it reports is a prefix of one.
func FuzzVerify(f *testing.F) {
	seeds := fuzzSeeds(f)
	for _, j := range seeds {
		f.Add(j)
		f.Add(j[:len(j)/2])
		f.Add(bytes.ReplaceAll(j, []byte("\n"), []byte("\r\n")))
	}
	pub := fuzzKey.Public().(ed25519.PublicKey)
	f.Fuzz(func(t *testing.T, journal []byte) {
		r := Verify(journal, pub)
		switch r.Status {
		case Complete:
			for _, j := range seeds {
				if bytes.Equal(journal, j) {
					return
				}
			}
			t.Fatalf("a journal the writer did not make verifies as complete (%d records)", r.Records)
		case Incomplete, Invalid:
			if r.Reason == "" || r.Err == nil {
				t.Fatalf("status %v without a reason", r.Status)
			}
			if r.Status == Invalid && r.Line == 0 && len(journal) > 0 {
				t.Fatalf("invalid without a line: %s", r.Reason)
			}
			lines := bytes.SplitAfter(journal, []byte("\n"))
			prefix := bytes.Join(lines[:min(r.Records, len(lines))], nil)
			for _, j := range seeds {
				if bytes.HasPrefix(j, prefix) {
					return
				}
			}
			t.Fatalf("%d records reported valid, but they are not a prefix of a real journal", r.Records)
		default:
			t.Fatalf("status %d", r.Status)
		}
	})
}

// FuzzVerifyLine: a detached line that verifies is one the writer made.
func FuzzVerifyLine(f *testing.F) {
	seeds := fuzzSeeds(f)
	known := map[string]bool{}
	for _, j := range seeds {
		for _, l := range bytes.Split(bytes.TrimSuffix(j, []byte("\n")), []byte("\n")) {
			known[string(l)] = true
			f.Add(l)
		}
	}
	pub := fuzzKey.Public().(ed25519.PublicKey)
	f.Fuzz(func(t *testing.T, line []byte) {
		e, err := VerifyLine(line, pub)
		if err == nil && !known[string(line)] {
			t.Fatalf("a line the writer did not make verifies: %q", line)
		}
		if err == nil && (e.Record == nil || !bytes.Equal(e.Line, line)) {
			t.Fatal("verified entry without its record")
		}
		if _, err := ParseLine(line); err == nil && !known[string(line)] {
			// Parsing (no signature check) may accept forged lines; it must
			// then still be a well-formed record.
			if e2, _ := ParseLine(line); e2.Record == nil {
				t.Fatal("parsed entry without its record")
			}
		}
	})
}

// FuzzParsePublicKeyPEM: no panic; what parses is a 32-byte key.
func FuzzParsePublicKeyPEM(f *testing.F) {
	pem, _ := MarshalPublicKeyPEM(fuzzKey.Public().(ed25519.PublicKey))
	f.Add(pem)
	f.Add([]byte("-----BEGIN PUBLIC KEY-----\n-----END PUBLIC KEY-----\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := ParsePublicKeyPEM(b)
		if err == nil && len(k) != ed25519.PublicKeySize {
			t.Fatalf("parsed a %d-byte key", len(k))
		}
	})
}
