package evidence

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moat-sandbox/moat/internal/reexec"
)

// FaultsWorkerHelper is the hidden helper of the moat binary that the
// faults suite's broker cases run inside their sandboxes (a copy of the
// binary, granted read-only): FaultsWorkerMain. internal/cli/hidden.go
// lists it.
const FaultsWorkerHelper = reexec.Prefix + "faults-worker"

// faultsWorkerMaxTokens is the max_tokens of every request the worker
// sends (what the broker reserves in the budget for it).
const faultsWorkerMaxTokens = 16

// FaultsWorkerMain sends model requests to the broker
// ($ANTHROPIC_BASE_URL/v1/messages): args are CONC MAX MODEL TEXT. CONC
// goroutines each send requests one after another, each with the text
// "TEXT g.i", until one is not answered 200 (refused, failed) or MAX
// requests were sent in all; every answer is printed as one JSON line
// (supporting output only: the faults suite judges from the host). It
// returns 0, or 2 for bad arguments.
func FaultsWorkerMain(args []string) int { return faultsWorker(args, os.Stdout) }

func faultsWorker(args []string, out io.Writer) int {
	if len(args) != 4 {
		fmt.Fprintln(out, "usage: "+FaultsWorkerHelper+" CONC MAX MODEL TEXT")
		return 2
	}
	conc, err1 := strconv.Atoi(args[0])
	maxN, err2 := strconv.Atoi(args[1])
	if err1 != nil || err2 != nil || conc < 1 || conc > 64 || maxN < 1 || maxN > 4096 {
		fmt.Fprintln(out, "faults-worker: CONC (1-64) and MAX (1-4096) are counts")
		return 2
	}
	model, text := args[2], args[3]
	base := os.Getenv("ANTHROPIC_BASE_URL")
	client := &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}
	var sent atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; sent.Add(1) <= int64(maxN); i++ {
				body, _ := json.Marshal(map[string]any{"model": model, "max_tokens": faultsWorkerMaxTokens,
					"messages": []any{map[string]any{"role": "user", "content": fmt.Sprintf("%s %d.%d", text, g, i)}}})
				line := map[string]any{"worker": g, "n": i}
				status := 0
				req, err := http.NewRequest("POST", base+"/v1/messages", bytes.NewReader(body))
				if err == nil {
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("anthropic-version", "2023-06-01")
					req.Header.Set("x-api-key", os.Getenv("ANTHROPIC_API_KEY"))
					var resp *http.Response
					if resp, err = client.Do(req); err == nil {
						b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
						resp.Body.Close()
						status = resp.StatusCode
						line["reason"], line["reply"] = resp.Header.Get("Moat-Reason"), string(b)
					}
				}
				line["status"] = status
				if err != nil {
					line["error"] = err.Error()
				}
				lb, _ := json.Marshal(line)
				mu.Lock()
				fmt.Fprintln(out, string(lb))
				mu.Unlock()
				if status != 200 {
					return
				}
			}
		}()
	}
	wg.Wait()
	return 0
}
