package broker

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// syncBuf is a bytes.Buffer safe for the broker's goroutines.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLogLevels: at the handler's level Warn (moat's default, "refusals")
// a completed request prints nothing and a refused one prints one line; Info
// adds one line per completed request, Debug one per admission, and Error
// ("quiet") prints neither. The journal has both requests at every level.
func TestLogLevels(t *testing.T) {
	for _, tt := range []struct {
		level                        slog.Level
		admitted, completed, refused int
	}{
		{slog.LevelError, 0, 0, 0},
		{slog.LevelWarn, 0, 0, 1},
		{slog.LevelInfo, 0, 1, 1},
		{slog.LevelDebug, 1, 1, 1},
	} {
		t.Run(tt.level.String(), func(t *testing.T) {
			var buf syncBuf
			h := newHarness(t, 10, func(c *Config) {
				c.Log = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: tt.level}))
			})
			h.mustSucceed()
			bad := post("/v1/messages", strings.Replace(anthropicBody, "claude-test", "not-allowed", 1))
			if r := h.raw(bad); r.status != 400 {
				t.Fatalf("refusal: status %d, want 400", r.status)
			}
			out := buf.String()
			for msg, want := range map[string]int{"moat.broker admitted": tt.admitted, "moat.broker completed": tt.completed, "moat.broker refused": tt.refused} {
				if got := strings.Count(out, `msg="`+msg+`"`); got != want {
					t.Errorf("%d %q lines, want %d:\n%s", got, msg, want, out)
				}
			}
			if n := len(h.records("inference.completed")) + len(h.records("inference.refused")); n != 2 {
				t.Errorf("journal holds %d completed and refused records, want 2 at every level", n)
			}
		})
	}
}
