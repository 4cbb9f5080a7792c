package audit

import (
	"crypto/ed25519"
	"testing"

	"github.com/moat-sandbox/moat/confirmation"
)

func benchRecord() Record {
	return InferenceRequested{RequestID: "req_0123456789", Provider: "anthropic", API: "anthropic-messages",
		Endpoint: "/v1/messages", Model: "claude-sonnet-4-5", BodySHA256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
		ReservedTokens: 8192, Attribution: Attribution{Status: confirmation.AttributionResolved, PID: 4242, Executable: "/usr/bin/python3"}}
}

func benchWriter(b *testing.B) *Writer {
	w, _ := newTestWriter(b)
	for _, r := range []Record{runStarted(w), BoundaryConfirmed{Ready: true}} {
		if _, err := w.Append(r); err != nil {
			b.Fatal(err)
		}
	}
	return w
}

// BenchmarkAppend is one appender: build, sign, write and fsync per record.
func BenchmarkAppend(b *testing.B) {
	w := benchWriter(b)
	r := benchRecord()
	b.ResetTimer()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := w.Append(r); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	w.syncMu.Lock()
	b.ReportMetric(float64(w.nsync)/float64(b.N), "fsyncs/op")
	w.syncMu.Unlock()
}

// BenchmarkAppendParallel is many appenders sharing fsyncs (group commit);
// run with -cpu 1,2,8 or a larger -test.parallel to vary the contention.
func BenchmarkAppendParallel(b *testing.B) {
	w := benchWriter(b)
	r := benchRecord()
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := w.Append(r); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	w.syncMu.Lock()
	b.ReportMetric(float64(w.nsync)/float64(b.N), "fsyncs/op")
	w.syncMu.Unlock()
}

// BenchmarkAppendNoSync isolates the CPU cost of Append (encode, sign,
// write) from the fsync.
func BenchmarkAppendNoSync(b *testing.B) {
	w := benchWriter(b)
	w.skipSync = true
	r := benchRecord()
	b.ResetTimer()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := w.Append(r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSign is the signature alone over a typical payload's PAE.
func BenchmarkSign(b *testing.B) {
	w := benchWriter(b)
	payload, err := encodePayload(Header{V: 1, Run: "r", Seq: 2, Prev: ZeroPrev, Time: w.now(), Type: TypeInferenceRequested}, benchRecord())
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	for b.Loop() {
		ed25519.Sign(w.priv, PAE(PayloadType, payload))
	}
}

// BenchmarkVerifyLine is the per-line cost of verification.
func BenchmarkVerifyLine(b *testing.B) {
	j := buildJournal(b)
	line := j.lines[3]
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := VerifyLine(line, j.pub); err != nil {
			b.Fatal(err)
		}
	}
}
