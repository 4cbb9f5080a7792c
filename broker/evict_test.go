package broker

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// phaseCount counts the broker's connections in phase.
func (h *harness) phaseCount(phase int32) int {
	h.b.mu.Lock()
	defer h.b.mu.Unlock()
	n := 0
	for _, s := range h.b.conns {
		if s.phase.Load() == phase {
			n++
		}
	}
	return n
}

// waitPhase waits until n connections are in phase.
func (h *harness) waitPhase(phase int32, n int) {
	h.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for h.phaseCount(phase) < n {
		if time.Now().After(deadline) {
			h.t.Fatalf("%d connections in phase %d, want %d", h.phaseCount(phase), phase, n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// dial opens a connection and writes in on it.
func (h *harness) dial(in string) net.Conn {
	h.t.Helper()
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { c.Close() })
	if in != "" {
		if _, err := io.WriteString(c, in); err != nil {
			h.t.Fatal(err)
		}
	}
	return c
}

// closedByPeer reports whether the broker closed c (within wait).
func closedByPeer(c net.Conn, wait time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(wait))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

func bodyWith(text string) string {
	return strings.Replace(anthropicBody, `"content":"hi"`, `"content":"`+text+`"`, 1)
}

// TestEvictIdleAtMaxConns: with MaxConns idle connections held, a new
// request is served instead of reset, and the connection idle longest is
// the one closed. (Before, the new connection was closed at once.)
func TestEvictIdleAtMaxConns(t *testing.T) {
	h := newHarness(t, 10)
	idle := make([]net.Conn, MaxConns)
	for i := range idle {
		idle[i] = h.dial("")
		h.waitPhase(phaseIdle, i+1) // accepted in order, so idle[0] is idle longest
	}
	r := h.raw(post("/v1/messages", anthropicBody))
	if r.status != 200 || h.fp.count() != 1 {
		t.Fatalf("request at MaxConns: status %d, provider saw %d; want 200 and 1", r.status, h.fp.count())
	}
	if !closedByPeer(idle[0], 5*time.Second) {
		t.Errorf("the connection idle longest is still open, want it evicted")
	}
	if closedByPeer(idle[MaxConns-1], 200*time.Millisecond) {
		t.Errorf("the newest idle connection was closed, want only the oldest evicted")
	}
	if got := len(h.records("inference.refused")); got != 0 {
		t.Errorf("%d refusals journaled for evicted idle connections, want 0", got)
	}
}

// TestEvictSlowUploadOrder: with MaxConns connections each uploading a
// request slowly, a new legitimate request is admitted and reaches the
// provider before any slow upload completes; the slowest (oldest) upload
// is evicted and journaled as refused; the others complete afterwards.
func TestEvictSlowUploadOrder(t *testing.T) {
	h := newHarness(t, 1000)
	slow := make([]net.Conn, MaxConns)
	rest := make([]string, MaxConns)
	for i := range slow {
		req := post("/v1/messages", bodyWith(fmt.Sprintf("slow-%d", i)))
		half := len(req) - 20
		slow[i] = h.dial(req[:half])
		rest[i] = req[half:]
		h.waitPhase(phaseReading, i+1)
	}
	r := h.raw(post("/v1/messages", bodyWith("legit")))
	if r.status != 200 {
		t.Fatalf("legitimate request under a slow-upload flood: status %d: %s", r.status, r.body)
	}
	if n := h.fp.count(); n != 1 || !strings.Contains(string(h.fp.last().body), "legit") {
		t.Fatalf("provider saw %d requests (last %q), want exactly the legitimate one", n, h.fp.last().body)
	}
	refused := h.records("inference.refused")
	if len(refused) != 1 || refused[0]["reason"] != string(ReasonEvicted) {
		t.Errorf("refusals %v, want one %s", refused, ReasonEvicted)
	}
	if !closedByPeer(slow[0], 5*time.Second) {
		t.Errorf("the slowest upload was not evicted")
	}
	// The others complete after it (a sample, to keep the test short).
	var wg sync.WaitGroup
	for i := MaxConns - 8; i < MaxConns; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			slow[i].SetDeadline(time.Now().Add(20 * time.Second))
			if _, err := io.WriteString(slow[i], rest[i]); err != nil {
				t.Errorf("slow upload %d: %v", i, err)
				return
			}
			if r := readResult(t, bufio.NewReader(slow[i]), slow[i]); r.status != 200 {
				t.Errorf("slow upload %d completed with status %d, want 200", i, r.status)
			}
		}()
	}
	wg.Wait()
	reqs := h.fp.requests()
	first, n := string(reqs[0].body), len(reqs)
	if !strings.Contains(first, "legit") || n != 9 {
		t.Errorf("provider order: first %q of %d, want the legitimate request first of 9", first, n)
	}
	h.j.verifyAll(t)
}

// TestEvictSlowUploadForMemory: slow uploads that hold the whole memory
// budget do not make a new request wait for the read timeout: the oldest
// is evicted and the new request is admitted. (Before, it waited
// RequestReadTimeout and was refused broker_busy.)
func TestEvictSlowUploadForMemory(t *testing.T) {
	const declared = 64 << 10
	h := newHarness(t, 10, func(b *Broker) { b.setMemLimit(4 * bodyCopies * declared) })
	head := fmt.Sprintf("POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{\"model\"", declared)
	slow := make([]net.Conn, 4)
	for i := range slow {
		slow[i] = h.dial(head)
		h.waitPhase(phaseReading, i+1)
	}
	for h.b.mem.TryAcquire(1) { // wait until the four hold the whole budget
		h.b.mem.Release(1)
		time.Sleep(2 * time.Millisecond)
	}
	done := make(chan result, 1)
	go func() { done <- h.raw(post("/v1/messages", anthropicBody)) }()
	select {
	case r := <-done:
		if r.status != 200 || h.fp.count() != 1 {
			t.Fatalf("request with the budget held by slow uploads: status %d (%s), provider saw %d; want 200 and 1", r.status, r.header.Get("Moat-Reason"), h.fp.count())
		}
	case <-time.After(RequestReadTimeout - 5*time.Second):
		t.Fatalf("the request waited for the slow uploads' read timeout")
	}
	if !closedByPeer(slow[0], 5*time.Second) {
		t.Errorf("the oldest slow upload was not evicted")
	}
	if closedByPeer(slow[3], 200*time.Millisecond) {
		t.Errorf("the newest slow upload was evicted too, want only as many as needed")
	}
}

// BenchmarkLatencyUnderSlowloris: the latency of a legitimate request on a
// fresh connection while MaxConns connections are held by slow uploads
// that reconnect as soon as they are evicted. Run with
//
//	go test -run x -bench LatencyUnderSlowloris ./broker/
func BenchmarkLatencyUnderSlowloris(b *testing.B) {
	fp := newBareProvider(b)
	h := startBroker(b, fp, benchPolicy(fp.srv.URL), nil)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	partial := "POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{"
	for i := 0; i < MaxConns; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := net.Dial("tcp", h.addr)
				if err != nil {
					time.Sleep(time.Millisecond)
					continue
				}
				io.WriteString(c, partial)
				go func() { <-stop; c.Close() }()
				io.Copy(io.Discard, c) // until evicted
				c.Close()
			}
		}()
	}
	h.waitPhase(phaseReading, MaxConns)
	var d []time.Duration
	for b.Loop() {
		t0 := time.Now()
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			b.Fatal(err)
		}
		io.WriteString(c, post("/v1/messages", anthropicBody, "Connection: close"))
		resp, err := io.ReadAll(c)
		c.Close()
		if err != nil || !strings.HasPrefix(string(resp), "HTTP/1.1 200") {
			b.Fatalf("legitimate request under attack: %v %.200q (fatal: %v)", err, resp, h.b.Failed())
		}
		d = append(d, time.Since(t0))
	}
	close(stop)
	reportPercentiles(b, d)
	b.ReportMetric(float64(h.b.evictions.Load())/float64(len(d)), "evictions/op")
	wg.Wait()
}
