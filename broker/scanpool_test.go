package broker

import (
	"encoding/base64"
	"encoding/hex"
	"strings"
	"testing"
)

// TestScannerResetKeepsNothing: a scanner used for one body and reset
// (as scanBody's pool does) answers for the next body exactly as a new
// scanner does. The first bodies end in the middle of the credential, of
// its encodings, of an escape and of an SSE event, and carry many
// streams; the second ones hold the rest, or the whole credential.
func TestScannerResetKeepsNothing(t *testing.T) {
	const k = testCred
	h, b := hex.EncodeToString([]byte(k)), base64.StdEncoding.EncodeToString([]byte(k))
	var many strings.Builder
	for i := range 40 {
		many.WriteString(aDelta(i, "x"))
	}
	firsts := []string{
		k[:10], msg(k[:10]), msg("a") + k[:10], h[:20], b[:20], `\u00` + hex.EncodeToString([]byte(k[:5])), "%" + h[:2],
		`\\\\\\\\`, `{"text":"` + escU(k[:7]), "data: " + k[:12], aStart + "data: {\"text\":\"" + k[:9], many.String(), msg(k),
	}
	seconds := []string{
		k[10:], msg(k[10:]), h[20:], b[20:], hex.EncodeToString([]byte(k[5:])), h[2:], `u0073k` + k[2:], escU(k[7:]) + `"}`,
		k[12:] + "\n\n", "\n\n", msg("clean"), "", aDelta(0, "clean"), k, msg(k), h, b, escU(k),
	}
	p := newPattern(k)
	for _, first := range firsts {
		for _, second := range seconds {
			s := newScanner(p)
			s.scanAll([]byte(first))
			s.release()
			s.reset(p)
			gotHit, gotErr := s.scanAll([]byte(second))
			wantHit, wantErr := newScanner(p).scanAll([]byte(second))
			if gotHit != wantHit || gotErr != wantErr {
				t.Errorf("after %q, %q: %v, %v; a new scanner: %v, %v", first, second, gotHit, gotErr, wantHit, wantErr)
			}
		}
	}
	// Not vacuous: the whole credential is found after a reset.
	s := newScanner(p)
	s.scanAll([]byte(many.String()))
	s.release()
	s.reset(p)
	if hit, _ := s.scanAll([]byte(msg(k))); !hit {
		t.Fatal("credential not found by a reset scanner")
	}
}
