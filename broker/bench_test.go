package broker

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/policy"
)

// Benchmarks: what the broker adds to a request, against the same request
// sent directly to the same fake provider, with the journal's fsync cost
// measured in the same run on the same file system (t.TempDir). Run with
//
//	go test -run '^$' -bench . -benchtime 2s ./broker/
//
// The parts on their own, with allocation counts: BenchmarkAdmit and
// BenchmarkCanonicalize (broker/wire), BenchmarkSign, BenchmarkAppend and
// BenchmarkAppendAsync (audit), BenchmarkJournalAppend and
// BenchmarkScanner (here). bench/README.md says how to profile the path.

const benchAllowance = 1 << 30

// benchProvider is the fake provider without per-request verification, so
// that direct and brokered requests cost the provider the same.
func benchProvider(b *testing.B) (*fakeProvider, *harness) {
	fp := newBareProvider(b)
	h := startBroker(b, fp, benchPolicy(fp.srv.URL), nil)
	return fp, h
}

// benchPolicy is testPolicy with room for the records of a long run: at
// the default audit.max_bytes (64 MiB) the run ends (journal_limit) after
// some 45,000 requests, which a few seconds at 32 connections reach.
func benchPolicy(url string) *policy.Policy {
	pol := testPolicy(url, benchAllowance)
	pol.Audit.MaxBytes = audit.MaxJournalBytes / 2
	return pol
}

func benchClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}}
}

func doPost(b *testing.B, c *http.Client, url, body string) {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Api-Key", Placeholder)
	resp, err := c.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		b.Fatalf("status %d", resp.StatusCode)
	}
}

// BenchmarkLatency: one non-streaming request at a time; reports the
// median and 99th percentile besides the mean.
func BenchmarkLatency(b *testing.B) {
	fp, h := benchProvider(b)
	for _, tc := range []struct{ name, url string }{
		{"direct", fp.srv.URL + "/v1/messages"},
		{"broker", "http://" + h.addr + "/v1/messages"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			c := benchClient()
			var d []time.Duration
			c0 := cpuTime()
			for b.Loop() {
				t0 := time.Now()
				doPost(b, c, tc.url, anthropicBody)
				d = append(d, time.Since(t0))
			}
			b.ReportMetric(float64((cpuTime()-c0).Microseconds())/float64(len(d)), "cpu-us/op")
			reportPercentiles(b, d)
		})
	}
}

// reportPercentiles adds p50-ns and p99-ns metrics.
func reportPercentiles(b *testing.B, d []time.Duration) {
	if len(d) == 0 {
		return
	}
	slices.Sort(d)
	b.ReportMetric(float64(d[len(d)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(d[(len(d)*99)/100].Nanoseconds()), "p99-ns")
}

// BenchmarkFsync: one 1 KiB append plus fsync on the file system of the
// journal (a brokered request makes two: requested and completed).
func BenchmarkFsync(b *testing.B) {
	f, err := os.Create(filepath.Join(b.TempDir(), "f"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	line := bytes.Repeat([]byte("x"), 1024)
	var d []time.Duration
	for b.Loop() {
		t0 := time.Now()
		f.Write(line)
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
		d = append(d, time.Since(t0))
	}
	reportPercentiles(b, d)
}

// BenchmarkJournalAppend: one inference.requested record through the real
// audit writer (sign, write, fsync).
func BenchmarkJournalAppend(b *testing.B) {
	j := newTestJournal(b)
	rec := audit.InferenceRequested{RequestID: newRequestID(), Provider: "anthropic", API: "anthropic-messages",
		Endpoint: "/v1/messages", Model: "claude-test", BodySHA256: strings.Repeat("ab", 32), ReservedTokens: 16,
		Attribution: audit.Attribution{Status: "unavailable", Reason: "bench"}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := j.w.Append(rec); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkJournalAppendAsync: the completion record's path: written in
// place, then synced (the sync is what the answer no longer waits for).
func BenchmarkJournalAppendAsync(b *testing.B) {
	j := newTestJournal(b)
	rec := audit.InferenceCompleted{RequestID: newRequestID(), Status: 200, ResponseSHA256: strings.Repeat("ab", 32),
		ResponseBytes: 512, Usage: audit.Usage{InputTokens: 3, OutputTokens: 5}}
	b.ReportAllocs()
	for b.Loop() {
		_, wait, err := j.w.AppendAsync(rec)
		if err != nil {
			b.Fatal(err)
		}
		if err := wait(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkThroughput: requests per second over 1, 8 and 32 concurrent
// connections, through the broker and through httputil.ReverseProxy (no
// policy, no journal) to the same provider.
func BenchmarkThroughput(b *testing.B) {
	fp, h := benchProvider(b)
	target, _ := url.Parse(fp.srv.URL)
	rp := httptest.NewServer(httputil.NewSingleHostReverseProxy(target))
	defer rp.Close()
	for _, conns := range []int{1, 8, 32} {
		for _, tc := range []struct{ name, url string }{
			{"broker", "http://" + h.addr + "/v1/messages"},
			{"reverseproxy", rp.URL + "/v1/messages"},
		} {
			b.Run(fmt.Sprintf("%s/conns=%d", tc.name, conns), func(b *testing.B) {
				b.ReportAllocs()
				var next atomic.Int64
				var wg sync.WaitGroup
				start, c0 := time.Now(), cpuTime()
				b.ResetTimer()
				for range conns {
					wg.Add(1)
					go func() {
						defer wg.Done()
						c := benchClient()
						for next.Add(1) <= int64(b.N) {
							doPost(b, c, tc.url, anthropicBody)
						}
					}()
				}
				wg.Wait()
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
				b.ReportMetric(float64((cpuTime()-c0).Microseconds())/float64(b.N), "cpu-us/op")
			})
		}
	}
}

// BenchmarkSSETTFB: time to the first byte of a streamed answer.
func BenchmarkSSETTFB(b *testing.B) {
	fp, h := benchProvider(b)
	body := strings.Replace(anthropicBody, `{"model"`, `{"stream":true,"model"`, 1)
	for _, tc := range []struct{ name, url string }{
		{"direct", fp.srv.URL + "/v1/messages"},
		{"broker", "http://" + h.addr + "/v1/messages"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			c := benchClient()
			var total time.Duration
			for b.Loop() {
				req, _ := http.NewRequest(http.MethodPost, tc.url, strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-Api-Key", Placeholder)
				t0 := time.Now()
				resp, err := c.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				var one [1]byte
				if _, err := io.ReadFull(resp.Body, one[:]); err != nil {
					b.Fatal(err)
				}
				total += time.Since(t0)
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "ttfb-ns")
		})
	}
}
