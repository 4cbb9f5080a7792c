package broker

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/internal/gitsrv"
	"github.com/moat-sandbox/moat/internal/netguard"
	"github.com/moat-sandbox/moat/internal/testenv"
	"github.com/moat-sandbox/moat/policy"
)

const testSvcCred = "ghp_test-SVCCRED-0123456789abcdef"

// testGuard is the SSRF guard told that 127.0.0.1, the test server's
// address, counts as global (the test-only option); testGuardStrict is
// the guard as moat runs it.
func testGuard() func(ctx context.Context, network, address string) (net.Conn, error) {
	return netguard.New(netguard.WithTestGlobal(netip.MustParseAddr("127.0.0.1"))).DialContext
}

// gitGrant is the grant of the test git server.
func gitGrant(base string) policy.EgressService {
	return policy.EgressService{Name: "git", BaseURL: base, Auth: "basic", CredentialEnv: "GIT_TOKEN",
		Methods: []string{"GET", "POST"}, Paths: []string{"/repo.git/*"},
		Query: map[string][]string{"service": {"git-upload-pack", "git-receive-pack"}}, MaxRequests: 1000}
}

// serviceHarness is a broker with one service route in front of srv.
func serviceHarness(t *testing.T, srv *gitsrv.Server, g policy.EgressService, opts ...func(*ServicesConfig)) *harness {
	t.Helper()
	fp := newFakeProvider(t, false)
	cfg := ServicesConfig{Grants: []policy.EgressService{g}, Credentials: map[string]string{g.Name: "git:" + testSvcCred},
		Guarded: []string{testCred}, Dial: testGuard(), RootCAs: srv.RootCAs()}
	for _, o := range opts {
		o(&cfg)
	}
	svc, err := NewServices(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return startBroker(t, fp, testPolicy(fp.srv.URL, 10), nil, func(c *Config) { c.Services = svc })
}

func startGit(t *testing.T, refs int) *gitsrv.Server {
	t.Helper()
	testenv.Need(t, gitsrv.Backend() != "", "git http-backend is not installed (CI installs git: .ci/run)")
	root := t.TempDir()
	if refs >= 0 {
		if err := gitsrv.MakeRepo(root, "repo.git", refs); err != nil {
			t.Fatal(err)
		}
	}
	srv, err := gitsrv.Start(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return srv
}

// TestServiceGit: real git, on the host, through the broker's service
// route to git http-backend: a clone of 250 branches, a fetch with haves
// (over 1 KiB of them, which git sends gzip-compressed with protocol v0)
// and a push of 2 MiB (chunked). The server sees moat's credential, git
// never does; every request is journaled before it reaches the server.
func TestServiceGit(t *testing.T) {
	srv := startGit(t, 250)
	h := serviceHarness(t, srv, gitGrant(srv.URL))
	work := t.TempDir()
	cfg := []string{"-c", "url.http://" + h.addr + "/svc/git/.insteadOf=https://git.example/", "-c", "protocol.version=0"}
	run := func(dir string, args ...string) string {
		t.Helper()
		out, err := gitsrv.Git(dir, nil, append(append([]string{}, cfg...), args...)...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	run(work, "clone", "-q", "https://git.example/repo.git", "clone")
	clone := filepath.Join(work, "clone")
	refs := run(clone, "branch", "-r")
	if n := strings.Count(refs, "origin/b"); n != 250 {
		t.Fatalf("clone has %d remote branches, want 250", n)
	}
	// Haves: 40 local commits the server lacks, and a new commit on the
	// server, so that the fetch negotiates.
	for i := range 40 {
		run(clone, "commit", "-q", "--allow-empty", "-m", fmt.Sprint("local ", i))
	}
	up := filepath.Join(work, "up")
	run(work, "clone", "-q", "https://git.example/repo.git", "up")
	run(up, "commit", "-q", "--allow-empty", "-m", "upstream")
	big := make([]byte, 2<<20)
	rand.Read(big)
	if err := os.WriteFile(filepath.Join(up, "big.bin"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	run(up, "add", "big.bin")
	run(up, "commit", "-q", "-m", "big")
	run(up, "-c", "http.postBuffer=65536", "push", "-q", "origin", "main")
	run(clone, "fetch", "-q", "origin")
	if got := strings.TrimSpace(run(clone, "log", "-1", "--format=%s", "origin/main")); got != "big" {
		t.Fatalf("fetched origin/main is %q, want the pushed commit", got)
	}

	var pushed, gz int
	for _, rec := range h.records(audit.TypeServiceRequested) {
		if rec["path"] == "/repo.git/git-receive-pack" && rec["body_bytes"].(float64) > 2<<20 {
			pushed++
		}
		if rec["content_encoding"] == "gzip" {
			gz++
			if rec["encoded_sha256"] == rec["body_sha256"] || rec["encoded_bytes"].(float64) <= 0 {
				t.Errorf("gzip request record without its two digests: %v", rec)
			}
		}
	}
	if pushed != 1 || gz == 0 {
		t.Errorf("journal: %d pushes over 2 MiB (want 1), %d gzip bodies (want some)", pushed, gz)
	}
	req, done := h.records(audit.TypeServiceRequested), h.records(audit.TypeServiceCompleted)
	if len(req) != len(done) || len(req) != len(srv.Seen()) {
		t.Errorf("%d service.requested, %d service.completed, server saw %d requests", len(req), len(done), len(srv.Seen()))
	}
	for _, s := range srv.Seen() {
		if s.Header.Get("Authorization") == "" || s.Header.Get("Moat-Pre-Effect") == "" {
			t.Errorf("server got %s %s without moat's credential or pre-effect header", s.Method, s.Path)
		}
	}
	cfgText, _ := os.ReadFile(filepath.Join(clone, ".git", "config"))
	if bytes.Contains(cfgText, []byte(testSvcCred)) {
		t.Error("the credential reached git's config")
	}
}

// get is a raw GET of a service path.
func get(target string, extra ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n", target)
	for _, e := range extra {
		b.WriteString(e + "\r\n")
	}
	b.WriteString("\r\n")
	return b.String()
}

// TestServiceRefusals: each attack is refused, journaled and never reaches
// the service; the positive control, in the same broker, reaches it.
func TestServiceRefusals(t *testing.T) {
	srv := startGit(t, 3)
	h := serviceHarness(t, srv, gitGrant(srv.URL))
	ok := "/svc/git/repo.git/info/refs?service=git-upload-pack"
	control := func() {
		t.Helper()
		before := len(srv.Seen())
		r := h.raw(get(ok, "Connection: close"))
		if r.status != 200 || !strings.Contains(r.body, "refs/heads/main") || len(srv.Seen()) != before+1 {
			t.Fatalf("control: status %d, body %.200q; server saw %d new requests", r.status, r.body, len(srv.Seen())-before)
		}
	}
	control()
	for _, c := range []struct {
		name, in string
		reason   Reason
	}{
		{"dotdot", get("/svc/git/repo.git/../other.git/info/refs?service=git-upload-pack"), ReasonPathTrick},
		{"dot", get("/svc/git/./repo.git/info/refs?service=git-upload-pack"), ReasonPathTrick},
		{"pct2e", get("/svc/git/repo.git/%2e%2e/x/info/refs?service=git-upload-pack"), ReasonPathTrick},
		{"pct2f", get("/svc/git/repo.git%2f..%2fother.git/info/refs"), ReasonPathTrick},
		{"doubleslash", get("/svc/git//repo.git/info/refs?service=git-upload-pack"), ReasonPathTrick},
		{"doubleslash-inner", get("/svc/git/repo.git//info/refs?service=git-upload-pack"), ReasonPathTrick},
		{"backslash", get(`/svc/git/repo.git\..\x/info/refs`), ReasonPathTrick},
		// Servlet containers (Tomcat, Jetty behind many artifact and CI
		// servers) strip ";params" from each segment before resolving dot
		// segments: "..;" is ".." to them, so the grant's /repo.git/* would
		// reach /other.git.
		{"semicolon-dotdot", get("/svc/git/repo.git/..;/other.git/info/refs?service=git-upload-pack"), ReasonPathTrick},
		{"semicolon-param", get("/svc/git/repo.git/info/refs;jsessionid=1?service=git-upload-pack"), ReasonPathTrick},
		{"fragment", get("/svc/git/repo.git/info/refs#x"), ReasonQuery},
		{"empty-query", get("/svc/git/repo.git/info/refs?"), ReasonQuery},
		{"other-repo", get("/svc/git/other.git/info/refs?service=git-upload-pack"), ReasonServicePath},
		{"repo-root", get("/svc/git/repo.git/"), ReasonServicePath},
		{"unknown-service", get("/svc/nope/repo.git/info/refs"), ReasonServiceUnknown},
		{"method", "DELETE /svc/git/repo.git/info/refs HTTP/1.1\r\nHost: x\r\n\r\n", ReasonMethod},
		{"query-value", get("/svc/git/repo.git/info/refs?service=git-upload-archive"), ReasonServiceQuery},
		{"query-name", get("/svc/git/repo.git/info/refs?service=git-upload-pack&x=1"), ReasonServiceQuery},
		{"query-twice", get("/svc/git/repo.git/info/refs?service=git-upload-pack&service=git-upload-pack"), ReasonServiceQuery},
		{"query-escaped", get("/svc/git/repo.git/info/refs?service=git%2dupload-pack"), ReasonServiceQuery},
		{"authorization", get(ok, "Authorization: Bearer mine-0123456789abcdef"), ReasonServiceHeader},
		{"cookie", get(ok, "Cookie: a=b"), ReasonServiceHeader},
		{"moat-header", get(ok, "Moat-Pre-Effect: x"), ReasonServiceHeader},
		{"deflate-body", "POST /svc/git/repo.git/git-upload-pack HTTP/1.1\r\nHost: x\r\nContent-Encoding: deflate\r\nContent-Length: 1\r\n\r\nx", ReasonCompressedBody},
		{"bad-gzip", "POST /svc/git/repo.git/git-upload-pack HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\nContent-Length: 4\r\n\r\nxxxx", ReasonServiceEncoding},
		{"connect", "CONNECT git.example:443 HTTP/1.1\r\nHost: git.example:443\r\n\r\n", ReasonConnect},
		{"absolute", "GET https://git.example/svc/git/repo.git/info/refs HTTP/1.1\r\nHost: x\r\n\r\n", ReasonTargetForm},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := len(srv.Seen())
			r := h.raw(c.in)
			if got := Reason(r.header.Get("Moat-Reason")); got != c.reason || r.status < 400 {
				t.Fatalf("status %d reason %q, want a refusal %q; body %s", r.status, got, c.reason, r.body)
			}
			if n := len(srv.Seen()) - before; n != 0 {
				t.Fatalf("the service saw %d requests", n)
			}
			last := h.lastRecord()
			if last["type"] != audit.TypeServiceRefused && last["type"] != audit.TypeInferenceRefused || last["reason"] != string(c.reason) {
				t.Fatalf("last record %v, want a refusal with reason %s", last, c.reason)
			}
			control()
		})
	}
}

// TestServiceGzipBody: a gzip body reaches the service decoded, and the
// record has both digests; the same body sent plain has the same
// body_sha256 and no encoded digest.
func TestServiceGzipBody(t *testing.T) {
	srv := startGit(t, 1)
	var got []byte
	srv.SetRespond(func(w http.ResponseWriter, r *http.Request) bool {
		got, _ = io.ReadAll(r.Body)
		w.Write([]byte("ok"))
		return true
	})
	h := serviceHarness(t, srv, gitGrant(srv.URL))
	plain := bytes.Repeat([]byte("0032have 0123456789abcdef0123456789abcdef01234567\n"), 100)
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	zw.Write(plain)
	zw.Close()
	send := func(enc string, body []byte) map[string]any {
		t.Helper()
		head := "POST /svc/git/repo.git/git-upload-pack HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-git-upload-pack-request\r\n" + enc +
			fmt.Sprintf("Content-Length: %d\r\nConnection: close\r\n\r\n", len(body))
		if r := h.raw(head + string(body)); r.status != 200 || r.body != "ok" {
			t.Fatalf("status %d body %q", r.status, r.body)
		}
		if !bytes.Equal(got, plain) {
			t.Fatalf("the service got %d bytes, want the %d decoded bytes", len(got), len(plain))
		}
		recs := h.records(audit.TypeServiceRequested)
		return recs[len(recs)-1]
	}
	gz := send("Content-Encoding: gzip\r\n", zb.Bytes())
	pl := send("", plain)
	sum := sha256.Sum256(plain)
	esum := sha256.Sum256(zb.Bytes())
	if gz["body_sha256"] != hex.EncodeToString(sum[:]) || gz["encoded_sha256"] != hex.EncodeToString(esum[:]) ||
		gz["encoded_bytes"].(float64) != float64(zb.Len()) || gz["content_encoding"] != "gzip" {
		t.Errorf("gzip record %v", gz)
	}
	if pl["body_sha256"] != gz["body_sha256"] || pl["encoded_sha256"] != nil || pl["content_encoding"] != nil {
		t.Errorf("plain record %v", pl)
	}
	// A truncated gzip body is refused, not sent in part.
	before := len(srv.Seen())
	cut := zb.Bytes()[:zb.Len()-8]
	head0 := fmt.Sprintf("POST /svc/git/repo.git/git-upload-pack HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n", len(cut))
	if r := h.raw(head0 + string(cut)); r.header.Get("Moat-Reason") != string(ReasonServiceEncoding) || len(srv.Seen()) != before {
		t.Errorf("truncated gzip: status %d reason %q, server saw %d", r.status, r.header.Get("Moat-Reason"), len(srv.Seen())-before)
	}
	// A gzip bomb over MaxBodyBytes is refused.
	zb.Reset()
	zw = gzip.NewWriter(&zb)
	zw.Write(make([]byte, MaxBodyBytes+1))
	zw.Close()
	head := fmt.Sprintf("POST /svc/git/repo.git/git-upload-pack HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n", zb.Len())
	if r := h.raw(head + zb.String()); r.header.Get("Moat-Reason") != string(ReasonBodyTooLarge) {
		t.Errorf("gzip bomb: status %d reason %q", r.status, r.header.Get("Moat-Reason"))
	}
}

// TestServiceRedirect: a redirect is neither followed nor passed back; a
// 304 (not a redirect) and a 200 pass.
func TestServiceRedirect(t *testing.T) {
	srv := startGit(t, 1)
	h := serviceHarness(t, srv, gitGrant(srv.URL))
	for _, c := range []struct {
		status int
		want   int
	}{{302, 502}, {301, 502}, {307, 502}, {308, 502}, {200, 200}, {304, 304}} {
		srv.SetRespond(func(w http.ResponseWriter, r *http.Request) bool {
			if c.status != 200 && c.status != 304 {
				w.Header().Set("Location", "https://elsewhere.example/x")
			}
			w.WriteHeader(c.status)
			return true
		})
		before := len(srv.Seen())
		r := h.raw(get("/svc/git/repo.git/info/refs?service=git-upload-pack", "Connection: close"))
		if r.status != c.want || r.header.Get("Location") != "" || len(srv.Seen()) != before+1 {
			t.Errorf("service %d: status %d (want %d), Location %q, server saw %d", c.status, r.status, c.want, r.header.Get("Location"), len(srv.Seen())-before)
		}
		last := h.lastRecord()
		if c.want == 502 && (last["type"] != audit.TypeServiceFailed || last["reason"] != string(ReasonServiceRedirect)) {
			t.Errorf("service %d: last record %v", c.status, last)
		}
		if c.want != 502 && last["type"] != audit.TypeServiceCompleted {
			t.Errorf("service %d: last record %v", c.status, last)
		}
	}
}

// TestServiceReflection: a service that echoes its credential (body or
// header), or a provider's, has its answer withheld and ends the run; the
// control, a service echoing other headers, passes.
func TestServiceReflection(t *testing.T) {
	for _, c := range []struct {
		name    string
		respond http.HandlerFunc
		reflect bool
	}{
		{"control", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "ua=%s", r.Header.Get("User-Agent")) }, false},
		{"body-raw", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "auth=%s", r.Header.Get("Authorization")) }, true},
		{"body-token", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, `{"token":%q}`, testSvcCred) }, true},
		{"header", func(w http.ResponseWriter, r *http.Request) { w.Header().Set("Etag", r.Header.Get("Authorization")) }, true},
		{"provider-cred", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, testCred) }, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := startGit(t, -1)
			srv.SetRespond(func(w http.ResponseWriter, r *http.Request) bool { c.respond(w, r); return true })
			h := serviceHarness(t, srv, gitGrant(srv.URL))
			r := h.raw(get("/svc/git/repo.git/info/refs?service=git-upload-pack", "User-Agent: git/2.39"))
			leaked := strings.Contains(r.body, testSvcCred) || strings.Contains(r.body, testCred) || strings.Contains(fmt.Sprint(r.header), "Basic ")
			if !c.reflect {
				if r.status != 200 || r.body != "ua=git/2.39" || h.b.Failed() != nil {
					t.Fatalf("control: status %d body %q failed %v", r.status, r.body, h.b.Failed())
				}
				return
			}
			if r.status != 502 || leaked || Reason(r.header.Get("Moat-Reason")) != ReasonCredentialReflect {
				t.Fatalf("status %d reason %q leaked %v", r.status, r.header.Get("Moat-Reason"), leaked)
			}
			if reason := <-h.fatal; reason != string(ReasonCredentialReflect) {
				t.Fatalf("fatal %q", reason)
			}
			if last := h.lastRecord(); last["type"] != audit.TypeServiceFailed || last["reason"] != string(ReasonCredentialReflect) {
				t.Fatalf("last record %v", last)
			}
			// No request leaves afterwards.
			before := len(srv.Seen())
			if r := h.raw(get("/svc/git/repo.git/info/refs?service=git-upload-pack")); r.status != 503 || len(srv.Seen()) != before {
				t.Fatalf("after the reflection: status %d, server saw %d", r.status, len(srv.Seen())-before)
			}
		})
	}
}

// TestServiceAllowance: max_requests is the grant's; the request past it
// is refused and does not reach the service.
func TestServiceAllowance(t *testing.T) {
	srv := startGit(t, 1)
	g := gitGrant(srv.URL)
	g.MaxRequests = 2
	h := serviceHarness(t, srv, g)
	for i := range 3 {
		r := h.raw(get("/svc/git/repo.git/info/refs?service=git-upload-pack"))
		want := 200
		if i == 2 {
			want = 429
		}
		if r.status != want {
			t.Fatalf("request %d: status %d, want %d", i, r.status, want)
		}
	}
	if n := len(srv.Seen()); n != 2 {
		t.Fatalf("the service saw %d requests, want 2", n)
	}
}

// TestServiceUnconfigured: a grant whose credential is not set is
// refused by name; the same grant with it set passes.
func TestServiceUnconfigured(t *testing.T) {
	srv := startGit(t, 1)
	fp := newFakeProvider(t, false)
	svc, err := NewServices(ServicesConfig{Grants: []policy.EgressService{gitGrant(srv.URL)},
		Dial: testGuard(), RootCAs: srv.RootCAs()})
	if err != nil {
		t.Fatal(err)
	}
	h := startBroker(t, fp, testPolicy(fp.srv.URL, 10), nil, func(c *Config) { c.Services = svc })
	r := h.raw(get("/svc/git/repo.git/info/refs?service=git-upload-pack"))
	if r.status != 503 || !strings.Contains(r.body, "GIT_TOKEN") || len(srv.Seen()) != 0 {
		t.Fatalf("status %d body %s, server saw %d", r.status, r.body, len(srv.Seen()))
	}
	h2 := serviceHarness(t, srv, gitGrant(srv.URL))
	if r := h2.raw(get("/svc/git/repo.git/info/refs?service=git-upload-pack")); r.status != 200 {
		t.Fatalf("control: status %d", r.status)
	}
}

func TestNewServicesRefuses(t *testing.T) {
	good := policy.EgressService{Name: "gh", BaseURL: "https://github.com", Auth: "bearer", Methods: []string{"GET"}, Paths: []string{"/*"}, MaxRequests: 1}
	creds := map[string]string{"gh": testSvcCred}
	if _, err := NewServices(ServicesConfig{Grants: []policy.EgressService{good}, Credentials: creds, Dial: testGuard()}); err != nil {
		t.Fatalf("control: %v", err)
	}
	if _, err := NewServices(ServicesConfig{Grants: []policy.EgressService{good}, Credentials: creds}); err == nil {
		t.Error("no dialer: accepted")
	}
	for name, mod := range map[string]func(*policy.EgressService){
		"http":       func(g *policy.EgressService) { g.BaseURL = "http://github.com" },
		"userinfo":   func(g *policy.EgressService) { g.BaseURL = "https://u:p@github.com" },
		"query":      func(g *policy.EgressService) { g.BaseURL = "https://github.com/?a=b" },
		"name-slash": func(g *policy.EgressService) { g.Name = "a/b" },
		"auth":       func(g *policy.EgressService) { g.Auth = "digest" },
		"basic":      func(g *policy.EgressService) { g.Auth = "basic" }, // the credential holds no user:
		"no-auth":    func(g *policy.EgressService) { g.Auth = "" },      // a credential and no auth
	} {
		g := good
		mod(&g)
		if _, err := NewServices(ServicesConfig{Grants: []policy.EgressService{g}, Credentials: creds, Dial: testGuard()}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestServiceGuard: with the guard as moat runs it (no test address),
// the service on 127.0.0.1 is refused before any byte leaves, and
// journaled; the test guard (control) reaches it.
func TestServiceGuard(t *testing.T) {
	srv := startGit(t, 1)
	strict := serviceHarness(t, srv, gitGrant(srv.URL), func(c *ServicesConfig) { c.Dial = netguard.New().DialContext })
	r := strict.raw(get("/svc/git/repo.git/info/refs?service=git-upload-pack"))
	if r.status != 502 || Reason(r.header.Get("Moat-Reason")) != ReasonServiceAddress || len(srv.Seen()) != 0 {
		t.Fatalf("strict guard: status %d reason %q, server saw %d", r.status, r.header.Get("Moat-Reason"), len(srv.Seen()))
	}
	if last := strict.lastRecord(); last["type"] != audit.TypeServiceFailed || last["reason"] != string(ReasonServiceAddress) {
		t.Fatalf("last record %v", last)
	}
	h := serviceHarness(t, srv, gitGrant(srv.URL))
	if r := h.raw(get("/svc/git/repo.git/info/refs?service=git-upload-pack")); r.status != 200 || len(srv.Seen()) != 1 {
		t.Fatalf("control: status %d, server saw %d", r.status, len(srv.Seen()))
	}
}

// FuzzServiceTarget: whatever the target, a service request the front
// accepts has a plain path (no dot or empty segments, no escapes) and a
// query of unreserved bytes only once the grant accepted it.
func FuzzServiceTarget(f *testing.F) {
	g := gitGrant("https://git.example")
	sv, _, err := newService(&g, "git:"+testSvcCred, &ServicesConfig{Dial: testGuard()})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, target string) {
		req, err := parseRequestLine([]byte("GET " + target + " HTTP/1.1"))
		if err != nil {
			return
		}
		if req.query != "" && !strings.HasPrefix(req.path, ServicesPathPrefix) {
			t.Fatalf("query %q kept outside %s", req.query, ServicesPathPrefix)
		}
		if strings.Contains(req.path, "%") || strings.Contains(req.path, "//") || strings.Contains(req.path, "/../") || strings.Contains(req.path, "?") {
			t.Fatalf("path %q accepted", req.path)
		}
		if sv.checkQuery(req.query) == nil && (strings.Contains(req.query, "%") || req.query != "" && req.query != "service=git-upload-pack" && req.query != "service=git-receive-pack") {
			t.Fatalf("query %q accepted", req.query)
		}
	})
}
