package evidence

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// MaxProviderBody caps a request body the synthetic provider reads.
const MaxProviderBody = 4 << 20

// opensslTimeout bounds one openssl verification.
const opensslTimeout = 10 * time.Second

// Provider is the synthetic inference provider (Anthropic- and
// OpenAI-style) on the host's 127.0.0.1. Before answering a request it
// verifies the Moat-Pre-Effect record against the pinned run key, natively
// and with openssl, checks body_sha256 against the bytes received, and
// persists a ProviderEvent. Requests that fail verification are answered
// with 500 and still recorded.
type Provider struct {
	// Credentials maps API family ("anthropic", "openai") to the
	// synthetic credential the broker must present.
	Credentials map[string]string
	// Mode is how the request labelled "trigger" is answered.
	Mode ProviderMode
	// RedirectURL is the Location of a redirect answer.
	RedirectURL string
	// OpenSSL is the openssl binary ("" skips the openssl check, which
	// then never counts as verified).
	OpenSSL string

	mu      sync.Mutex
	pub     ed25519.PublicKey
	runID   string
	n       int
	log     *eventLog
	tmp     string
	ln      net.Listener
	srv     *http.Server
	pubPath string
}

// Start listens on 127.0.0.1:0 and persists events to eventsPath. scratch
// is a private directory for openssl's input files.
func (p *Provider) Start(eventsPath, scratch string) error {
	l, err := openEventLog(eventsPath)
	if err != nil {
		return fmt.Errorf("provider events: %w", err)
	}
	tmp, err := os.MkdirTemp(scratch, "openssl-")
	if err != nil {
		l.close()
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		l.close()
		return fmt.Errorf("provider listen: %w", err)
	}
	p.log, p.tmp, p.ln = l, tmp, ln
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go p.srv.Serve(ln)
	return nil
}

// URL is the provider's base URL.
func (p *Provider) URL() string { return "http://" + p.ln.Addr().String() }

// Pin sets the run key that every pre-effect record must verify against.
func (p *Provider) Pin(runID string, pub ed25519.PublicKey) error {
	path := filepath.Join(p.tmp, "pub.pem")
	if err := os.WriteFile(path, publicKeyPEM(pub), 0o600); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pub, p.runID, p.pubPath = pub, runID, path
	return nil
}

// Count is the number of requests received so far.
func (p *Provider) Count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// Close stops the provider and closes its event log.
func (p *Provider) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	p.srv.Shutdown(ctx)
	os.RemoveAll(p.tmp)
	return p.log.close()
}

func (p *Provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxProviderBody+1))
	if err != nil || len(body) > MaxProviderBody {
		http.Error(w, "body unreadable or too large", http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	p.n++
	n, pub, runID, pubPath := p.n, p.pub, p.runID, p.pubPath
	p.mu.Unlock()
	sum := sha256.Sum256(body)
	ev := ProviderEvent{
		N: n, Time: time.Now().UTC().Format(time.RFC3339Nano), Method: r.Method,
		Path: r.URL.Path, Query: r.URL.RawQuery, Headers: map[string]string{},
		Body: body, BodySHA256: hex.EncodeToString(sum[:]),
	}
	api := "anthropic"
	if strings.HasPrefix(r.URL.Path, "/v1/chat/") || strings.HasPrefix(r.URL.Path, "/v1/responses") {
		api = "openai"
	}
	for name, vals := range r.Header {
		v := strings.Join(vals, "\x00")
		for _, c := range p.Credentials {
			if c != "" {
				v = strings.ReplaceAll(v, c, RedactedCredential)
			}
		}
		ev.Headers[strings.ToLower(name)] = v
	}
	if len(r.TransferEncoding) > 0 {
		ev.Headers["transfer-encoding"] = strings.Join(r.TransferEncoding, ",")
	}
	ev.CredentialOK = p.credentialOK(api, r.Header)
	ev.PreEffect, ev.NativeVerified, ev.OpenSSLVerified, ev.Detail = p.verify(r.Header.Values("Moat-Pre-Effect"), body, runID, pub, pubPath)

	verified := ev.NativeVerified && ev.OpenSSLVerified
	label := controlLabel(body)
	switch {
	case !verified:
		ev.Response = "refused"
	case label == "trigger" && p.Mode == ProviderRedirect:
		ev.Response = "redirect"
	case label == "trigger" && p.Mode == ProviderReflect:
		ev.Response = "reflect"
	default:
		ev.Response = "normal"
	}
	if err := p.log.append(ev); err != nil {
		http.Error(w, "provider could not persist its event", http.StatusInternalServerError)
		return
	}
	switch ev.Response {
	case "refused":
		http.Error(w, "synthetic provider: pre-effect record not verified: "+ev.Detail, http.StatusInternalServerError)
	case "redirect":
		w.Header().Set("Location", p.RedirectURL)
		w.WriteHeader(http.StatusTemporaryRedirect)
	case "reflect":
		writeReply(w, api, r.URL.Path, "your key is "+p.Credentials[api])
	default:
		writeReply(w, api, r.URL.Path, "ok "+label)
	}
}

func (p *Provider) credentialOK(api string, h http.Header) bool {
	want := p.Credentials[api]
	if want == "" {
		return false
	}
	if api == "anthropic" {
		return len(h.Values("X-Api-Key")) == 1 && h.Get("X-Api-Key") == want && h.Get("Authorization") == ""
	}
	return len(h.Values("Authorization")) == 1 && h.Get("Authorization") == "Bearer "+want && h.Get("X-Api-Key") == ""
}

// verify checks the Moat-Pre-Effect header natively and with openssl.
func (p *Provider) verify(hdr []string, body []byte, runID string, pub ed25519.PublicKey, pubPath string) (line string, native, ossl bool, detail string) {
	if pub == nil {
		return "", false, false, errNoKey.Error()
	}
	if len(hdr) != 1 {
		return "", false, false, fmt.Sprintf("%d Moat-Pre-Effect headers, want 1", len(hdr))
	}
	raw, err := base64.StdEncoding.Strict().DecodeString(hdr[0])
	if err != nil {
		return "", false, false, "Moat-Pre-Effect is not base64: " + err.Error()
	}
	line = string(raw)
	if err := checkPreEffect(raw, body, runID, pub); err != nil {
		return line, false, false, err.Error()
	}
	if p.OpenSSL == "" {
		return line, true, false, "openssl not available"
	}
	if err := p.opensslVerify(raw, pubPath); err != nil {
		return line, true, false, err.Error()
	}
	return line, true, true, ""
}

// checkPreEffect verifies a pre-effect line natively: signature, record
// type, run, and body_sha256 against the bytes received.
func checkPreEffect(line, body []byte, runID string, pub ed25519.PublicKey) error {
	payload, _, _, err := verifyEnvelope(line, auditPayloadType, pub)
	if err != nil {
		return err
	}
	var rec struct {
		Run        string `json:"run"`
		Type       string `json:"type"`
		BodySHA256 string `json:"body_sha256"`
	}
	if err := json.Unmarshal(payload, &rec); err != nil {
		return fmt.Errorf("pre-effect payload: %w", err)
	}
	if rec.Type != "inference.requested" {
		return fmt.Errorf("pre-effect record type %q, want inference.requested", rec.Type)
	}
	if runID != "" && rec.Run != runID {
		return fmt.Errorf("pre-effect record of run %q, want %q", rec.Run, runID)
	}
	sum := sha256.Sum256(body)
	if rec.BodySHA256 != hex.EncodeToString(sum[:]) {
		return fmt.Errorf("body_sha256 %s does not match the %d bytes received (%x)", rec.BodySHA256, len(body), sum)
	}
	return nil
}

var opensslMu sync.Mutex

// opensslVerify runs `openssl pkeyutl -verify -pubin -rawin` over the PAE bytes.
func (p *Provider) opensslVerify(line []byte, pubPath string) error {
	var env envelope
	if err := json.Unmarshal(line, &env); err != nil || len(env.Signatures) != 1 {
		return errors.New("openssl: envelope unreadable")
	}
	payload, err1 := base64.StdEncoding.DecodeString(env.Payload)
	sig, err2 := base64.StdEncoding.DecodeString(env.Signatures[0].Sig)
	if err1 != nil || err2 != nil {
		return errors.New("openssl: envelope not base64")
	}
	opensslMu.Lock()
	defer opensslMu.Unlock()
	paePath, sigPath := filepath.Join(p.tmp, "pae.bin"), filepath.Join(p.tmp, "sig.bin")
	if err := os.WriteFile(paePath, dssePAE(env.PayloadType, payload), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(sigPath, sig, 0o600); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), opensslTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, p.OpenSSL, "pkeyutl", "-verify", "-pubin", "-inkey", pubPath,
		"-rawin", "-in", paePath, "-sigfile", sigPath).CombinedOutput()
	if err != nil {
		return fmt.Errorf("openssl pkeyutl -verify: %v: %s", err, bytes.TrimSpace(out))
	}
	if !bytes.Contains(out, []byte("Signature Verified Successfully")) {
		return fmt.Errorf("openssl pkeyutl -verify: unexpected output %q", out)
	}
	return nil
}

// controlLabel returns the first control label in a body, or "".
func controlLabel(body []byte) string {
	ls := controlLabels(body)
	if len(ls) == 0 {
		return ""
	}
	return ls[0]
}

// controlLabels returns every ControlPrefix label in a body.
func controlLabels(body []byte) []string {
	var out []string
	s := string(body)
	for {
		i := strings.Index(s, ControlPrefix)
		if i < 0 {
			return out
		}
		s = s[i+len(ControlPrefix):]
		j := 0
		for j < len(s) && (s[j] == '-' || s[j] >= 'a' && s[j] <= 'z' || s[j] >= '0' && s[j] <= '9') {
			j++
		}
		if j > 0 {
			out = append(out, s[:j])
		}
		s = s[j:]
	}
}

func writeReply(w http.ResponseWriter, api, path, text string) {
	var v any
	switch {
	case api == "anthropic":
		v = map[string]any{"id": "msg_synthetic", "type": "message", "role": "assistant", "model": "synthetic",
			"content":     []any{map[string]any{"type": "text", "text": text}},
			"stop_reason": "end_turn", "usage": map[string]any{"input_tokens": 8, "output_tokens": 4}}
	case strings.HasPrefix(path, "/v1/responses"):
		v = map[string]any{"id": "resp_synthetic", "object": "response", "status": "completed", "model": "synthetic",
			"output": []any{map[string]any{"type": "message", "role": "assistant",
				"content": []any{map[string]any{"type": "output_text", "text": text}}}},
			"usage": map[string]any{"input_tokens": 8, "output_tokens": 4, "total_tokens": 12}}
	default:
		v = map[string]any{"id": "chatcmpl-synthetic", "object": "chat.completion", "created": 0, "model": "synthetic",
			"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": text}, "finish_reason": "stop"}},
			"usage":   map[string]any{"prompt_tokens": 8, "completion_tokens": 4, "total_tokens": 12}}
	}
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}
