package audit

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The per-road record tests (egress, package, service, tool, approval)
// share one shape: a journal of run.started, boundary.confirmed, the
// road's records and run.terminated is written, verifies complete with
// the counts the road makes, and each record decodes back to what was
// written with exactly the members the package doc lists. recordsCase is
// a road's row; checkRecords runs it and hands back the journal for the
// road's own assertions (timeline, Describe, re-signed lines).

// recordsCase is one road's records and what their journal must show.
type recordsCase struct {
	// records are written after run.started and boundary.confirmed.
	records []Record
	// members gives, by index in records, the exact members of that
	// record's payload (sorted, comma-joined, without the envelope's v,
	// run, seq, prev, time and type); an index not here is not checked.
	members map[int]string
	// counts are run.terminated's counts, as the writer keeps them and as
	// the verifier finds them.
	counts Counts
	// end is the last record; zero means {Reason: ReasonCompleted}.
	end RunTerminated
}

// writtenRecords is the journal checkRecords wrote.
type writtenRecords struct {
	lines   [][]byte // every line: run.started, boundary.confirmed, the records, run.terminated
	journal []byte   // the journal file as the writer left it
	priv    ed25519.PrivateKey
	pub     ed25519.PublicKey
}

// checkRecords writes c's journal and checks it: the file is the lines
// the writer returned, it verifies complete with c.counts (the writer's
// too), each record parses back to what was written, and the records
// named in c.members carry exactly those members.
func checkRecords(t *testing.T, c recordsCase) writtenRecords {
	t.Helper()
	w, priv := newTestWriter(t)
	end := c.end
	if reflect.DeepEqual(end, RunTerminated{}) {
		end = RunTerminated{Reason: ReasonCompleted}
	}
	all := append([]Record{runStarted(w), sampleRecords()[0]}, c.records...)
	lines := appendAll(t, w, append(all, end)...)
	if got := w.Counts(); got != c.counts {
		t.Errorf("writer counts %+v, want %+v", got, c.counts)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	journal, err := os.ReadFile(w.JournalPath())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(journal, joinLines(lines)) {
		t.Fatalf("journal file is not the lines appended:\n%s", journal)
	}
	pub := w.PublicKey()
	res := Verify(journal, pub)
	if res.Status != Complete {
		t.Fatalf("got %v (%v), want complete", res.Status, res.Err)
	}
	if res.Terminal == nil || res.Terminal.Counts != c.counts {
		t.Errorf("run.terminated %+v, want counts %+v", res.Terminal, c.counts)
	}
	for i := range c.members {
		if i < 0 || i >= len(c.records) {
			t.Fatalf("members names record %d of %d", i, len(c.records))
		}
	}
	for i, want := range c.records {
		e, err := ParseLine(lines[i+2])
		if err != nil {
			t.Fatalf("line %d: %v", i+3, err)
		}
		if !reflect.DeepEqual(e.Record, want) {
			t.Errorf("line %d: got %#v, want %#v", i+3, e.Record, want)
		}
		if m, ok := c.members[i]; ok {
			if got := payloadMembers(t, e.Payload); got != m {
				t.Errorf("line %d: %s members %s, want %s", i+3, want.RecordType(), got, m)
			}
		}
	}
	return writtenRecords{lines: lines, journal: journal, priv: priv, pub: pub}
}

// appendAll appends recs to w, each of which must be accepted, and
// returns their lines.
func appendAll(t testing.TB, w *Writer, recs ...Record) [][]byte {
	t.Helper()
	var lines [][]byte
	for _, r := range recs {
		line, err := w.Append(r)
		if err != nil {
			t.Fatalf("Append %s: %v", r.RecordType(), err)
		}
		lines = append(lines, line)
	}
	return lines
}

// payloadMembers is a payload's record members, sorted and comma-joined,
// without the envelope's.
func payloadMembers(t *testing.T, payload []byte) string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(payload, &m); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range m {
		switch k {
		case "v", "run", "seq", "prev", "time", "type":
			continue
		}
		keys = append(keys, k)
	}
	return strings.Join(sortedStrings(keys), ",")
}

func sortedStrings(s []string) []string {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	return s
}

// printPayloads is the body of the per-road examples: it writes recs
// after run.started and boundary.confirmed with the key and clock pinned
// (the all-zero seed, 2026-12-01T02:00:00Z) and prints each one's payload
// as the writer made it.
func printPayloads(recs ...Record) {
	tmp, _ := os.MkdirTemp("", "audit-example-")
	defer os.RemoveAll(tmp)
	dir := filepath.Join(tmp, "run")
	os.Mkdir(dir, 0o700)
	priv := ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize)) // example only
	clock := time.Date(2026, 12, 1, 2, 0, 0, 0, time.UTC)
	w, err := create(dir, "run-1", priv, func() time.Time { return clock })
	if err != nil {
		fmt.Println(err)
		return
	}
	defer w.Close()
	w.Append(RunStarted{PolicySHA256: strings.Repeat("a", 64), Backend: "native", BinarySHA256: strings.Repeat("b", 64), PublicKey: string(w.PublicKeyPEM())})
	w.Append(sampleRecords()[0])
	for _, r := range recs {
		line, err := w.Append(r)
		if err != nil {
			fmt.Println(err)
			return
		}
		b64 := strings.TrimPrefix(string(line), `{"payloadType":"application/vnd.moat.audit.v1+json","payload":"`)
		b64, _, _ = strings.Cut(b64, `"`)
		p, _ := base64.StdEncoding.DecodeString(b64)
		fmt.Println(string(p))
	}
}
