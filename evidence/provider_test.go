package evidence

import (
	"bytes"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/testenv"
)

func startTestProvider(t *testing.T, mode ProviderMode) (*Provider, string) {
	t.Helper()
	ossl, err := exec.LookPath("openssl")
	testenv.Need(t, err == nil, "openssl is needed to check pre-effect records as an outsider would")
	dir := t.TempDir()
	p := &Provider{Credentials: map[string]string{"anthropic": "sk-ant-synthetic-test", "openai": "sk-synthetic-test"}, Mode: mode, OpenSSL: ossl, RedirectURL: "http://127.0.0.1:1/"}
	if err := p.Start(filepath.Join(dir, FileProviderEvents), dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, filepath.Join(dir, FileProviderEvents)
}

func send(t *testing.T, p *Provider, body []byte, preEffect string, key string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", p.URL()+"/v1/messages", bytes.NewReader(body))
	if preEffect != "" {
		req.Header.Set("Moat-Pre-Effect", base64.StdEncoding.EncodeToString([]byte(preEffect)))
	}
	req.Header.Set("X-Api-Key", key)
	resp, err := (&http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestProviderVerifiesPreEffect(t *testing.T) {
	p, events := startTestProvider(t, ProviderNormal)
	j := newFakeJournal(t, "run-1")
	j.add("run.started", nil)
	body := []byte(`{"messages":[{"content":"` + ControlPrefix + `before"}]}`)
	good := j.add("inference.requested", map[string]any{"body_sha256": sha(body)})
	other := j.add("inference.requested", map[string]any{"body_sha256": sha([]byte("other"))})

	// Before the key is pinned, nothing verifies.
	if st, _ := send(t, p, body, good, "sk-ant-synthetic-test"); st != 500 {
		t.Fatalf("unpinned: got %d, want 500", st)
	}
	if err := p.Pin("run-1", j.pub()); err != nil {
		t.Fatal(err)
	}
	if st, reply := send(t, p, body, good, "sk-ant-synthetic-test"); st != 200 || !strings.Contains(reply, "ok before") {
		t.Fatalf("verified request: got %d %q, want 200 ok", st, reply)
	}
	if st, _ := send(t, p, body, other, "sk-ant-synthetic-test"); st != 500 {
		t.Fatalf("body hash mismatch: got %d, want 500", st)
	}
	if st, _ := send(t, p, body, "", "sk-ant-synthetic-test"); st != 500 {
		t.Fatalf("no pre-effect: got %d, want 500", st)
	}
	forged := strings.Replace(good, `"sig":"`, `"sig":"A`, 1)
	if st, _ := send(t, p, body, forged, "sk-ant-synthetic-test"); st != 500 {
		t.Fatalf("forged signature: got %d, want 500", st)
	}
	if st, _ := send(t, p, body, good, "worker-key"); st != 200 {
		t.Fatalf("wrong credential still answered: got %d", st)
	}
	evs, err := readJSONLines[ProviderEvent](events)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ native, ossl, cred bool }{{false, false, true}, {true, true, true}, {false, false, true}, {false, false, true}, {false, false, true}, {true, true, false}}
	if len(evs) != len(want) {
		t.Fatalf("got %d events, want %d", len(evs), len(want))
	}
	for i, w := range want {
		e := evs[i]
		if e.NativeVerified != w.native || e.OpenSSLVerified != w.ossl || e.CredentialOK != w.cred {
			t.Errorf("event %d: got native=%v openssl=%v cred=%v, want %+v (%s)", i+1, e.NativeVerified, e.OpenSSLVerified, e.CredentialOK, w, e.Detail)
		}
		if strings.Contains(e.Headers["x-api-key"], "sk-ant-synthetic-test") {
			t.Errorf("event %d holds the synthetic credential", i+1)
		}
	}
}

func TestProviderModes(t *testing.T) {
	for _, mode := range []ProviderMode{ProviderRedirect, ProviderReflect} {
		t.Run(string(mode), func(t *testing.T) {
			p, _ := startTestProvider(t, mode)
			j := newFakeJournal(t, "run-2")
			j.add("run.started", nil)
			trig := []byte(`{"c":"` + ControlPrefix + `trigger"}`)
			plain := []byte(`{"c":"` + ControlPrefix + `before"}`)
			lt := j.add("inference.requested", map[string]any{"body_sha256": sha(trig)})
			lp := j.add("inference.requested", map[string]any{"body_sha256": sha(plain)})
			p.Pin("run-2", j.pub())
			st, reply := send(t, p, trig, lt, "sk-ant-synthetic-test")
			switch mode {
			case ProviderRedirect:
				if st != 307 {
					t.Fatalf("got %d, want 307", st)
				}
			case ProviderReflect:
				if st != 200 || !strings.Contains(reply, "sk-ant-synthetic-test") {
					t.Fatalf("got %d %q, want the credential reflected", st, reply)
				}
			}
			if st, reply := send(t, p, plain, lp, "sk-ant-synthetic-test"); st != 200 || strings.Contains(reply, "sk-ant") {
				t.Fatalf("non-trigger request: got %d %q", st, reply)
			}
		})
	}
}

func TestReceiversControlAndHit(t *testing.T) {
	dir := t.TempDir()
	r, err := StartReceivers(filepath.Join(dir, FileReceiverEvents))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.PlaceUnix(dir); err != nil {
		t.Fatal(err)
	}
	if err := r.Control(DirectReceivers...); err != nil {
		t.Fatal(err)
	}
	// A delivery that is not the control is a hit.
	c, err := net.Dial("udp", r.UDPAddr)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("escape"))
	c.Close()
	c, err = net.Dial("unix", r.UnixPath)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("escape"))
	c.Close()
	time.Sleep(200 * time.Millisecond)
	r.Close()
	evs, err := readJSONLines[ReceiverEvent](filepath.Join(dir, FileReceiverEvents))
	if err != nil {
		t.Fatal(err)
	}
	controls, hits := map[string]bool{}, map[string]int{}
	for _, e := range evs {
		if e.Kind == "control" {
			controls[e.Receiver] = true
		} else {
			hits[e.Receiver]++
		}
	}
	for _, n := range DirectReceivers {
		if !controls[n] {
			t.Errorf("%s: control not recorded", n)
		}
	}
	if hits[RecvUDP] != 1 || hits[RecvUnix] != 1 || len(hits) != 2 {
		t.Errorf("got hits %v, want one udp and one unix", hits)
	}
}
