//go:build linux

package e2e

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/gitsrv"
	"github.com/moat-sandbox/moat/internal/testenv"
)

// egressServiceScript runs inside the sandbox: real git, configured by
// nothing but what moat wrote (GIT_CONFIG_GLOBAL), against the service's
// own https URL, then curl's raw attacks at the broker, each followed by
// its control; the credential echo is last (it ends the run).
const egressServiceScript = `
set -u
export HOME="$WS" GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@example.com GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@example.com GIT_TERMINAL_PROMPT=0
cd "$WS"
echo "gitconfig-has-cred $(grep -c SVCCRED "$GIT_CONFIG_GLOBAL")"
echo "env-has-cred $(env | grep -c SVCCRED)"
git clone -q "$URL/repo.git" clone || echo "clone failed"
echo "branches $(git -C clone branch -r | grep -c origin/b)"
i=0; while [ $i -lt 40 ]; do git -C clone commit -q --allow-empty -m "local $i"; i=$((i+1)); done
git clone -q "$URL/repo.git" up || echo "second clone failed"
head -c 1600000 /dev/urandom > up/big.bin
git -C up add big.bin && git -C up commit -q -m big
git -C up -c http.postBuffer=65536 push -q origin main && echo pushed
git -C clone -c protocol.version=0 fetch -q origin && echo "fetched $(git -C clone log -1 --format=%s origin/main)"
B="$MOAT_BROKER_URL/svc/git"
st() { curl -s -o /dev/null -w '%{http_code}' --path-as-is "$@"; }
echo "control $(st "$B/repo.git/info/refs?service=git-upload-pack")"
echo "dotdot $(st "$B/repo.git/../other.git/info/refs?service=git-upload-pack")"
echo "pct2e $(st "$B/repo.git/%2e%2e/other.git/info/refs?service=git-upload-pack")"
echo "slashes $(st "$B//repo.git/info/refs?service=git-upload-pack")"
echo "method $(st -X DELETE "$B/repo.git/info/refs")"
echo "query $(st "$B/repo.git/info/refs?service=git-upload-archive")"
echo "redirect $(st "$B/redirect.git/info/refs?service=git-upload-pack")"
echo "control $(st "$B/repo.git/info/refs?service=git-upload-pack")"
echo "echo-start"
curl -s --path-as-is "$B/echo.git/info/refs?service=git-upload-pack"
`

// TestEgressServiceGit: git inside a native sandbox clones (250
// branches), pushes 1.6 MB and fetches with haves (gzip-compressed under
// protocol v0) over the services route to a local smart-HTTP server
// (git http-backend behind a Go TLS server on 127.0.0.1, which the
// moat_test_hooks binary's guard is told to count as global), with no
// git configuration of its own; the credential stays in moat. Attacks
// from the same run are refused and never reach the server, each with
// its control; the server's redirect is not passed on, and its echo of
// the credential is withheld and ends the run. On native and, as root,
// on gVisor.
func TestEgressServiceGit(t *testing.T) {
	for _, tool := range []string{"git", "curl"} {
		_, err := exec.LookPath(tool)
		testenv.Need(t, err == nil, tool+" is not installed")
	}
	testenv.Need(t, gitsrv.Backend() != "", "git http-backend is not installed")
	for _, backend := range ttyBackends(t) { // native, and gVisor as root
		t.Run(backend, func(t *testing.T) { testEgressServiceGit(t, backend) })
	}
}

func testEgressServiceGit(t *testing.T, backend string) {
	bin := hooksBin(t)
	e := newEnv(t)
	root := filepath.Join(e.dir, "repos")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := gitsrv.MakeRepo(root, "repo.git", 250); err != nil {
		t.Fatal(err)
	}
	srv, err := gitsrv.Start(root)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	const cred = "git:e2e-SVCCRED-0123456789abcdef"
	srv.SetRespond(func(w http.ResponseWriter, r *http.Request) bool {
		switch {
		case strings.HasPrefix(r.URL.Path, "/redirect.git/"):
			http.Redirect(w, r, "https://elsewhere.example/x", http.StatusFound)
		case strings.HasPrefix(r.URL.Path, "/echo.git/"):
			fmt.Fprintf(w, "you sent %s\n", r.Header.Get("Authorization"))
		default:
			return false
		}
		return true
	})
	ca := filepath.Join(e.dir, "ca.pem")
	writeFile(t, ca, string(srv.CAPEM()))
	pol := e.policy(fmt.Sprintf(`backend: %s
egress:
  services:
    - name: git
      base_url: %s
      ca_file: %s
      credential_env: MOAT_E2E_GIT_CRED
      auth: basic
      methods: [GET, POST]
      paths: ["/repo.git/*", "/redirect.git/*", "/echo.git/*"]
      query: {service: [git-upload-pack, git-receive-pack]}
      max_requests: 1000
`, backend, srv.URL, ca))
	cmd := exec.Command(bin, "run", "--policy", pol, "--", "/bin/sh", "-c", egressServiceScript)
	cmd.Dir = e.dir
	cmd.Env = append(os.Environ(), "MOAT_STATE_DIR="+e.stateDir, "MOAT_TEST_GLOBAL_ADDR=127.0.0.1", "MOAT_E2E_GIT_CRED="+cred)
	// The script's own variables go through the policy's env.
	setPolicyEnv(t, pol, fmt.Sprintf("PATH: /usr/bin:/bin, WS: %s, URL: %s", e.workspace, srv.URL))
	var so, se strings.Builder
	cmd.Stdout, cmd.Stderr = &so, &se
	cmd.Run()
	r := result{so.String(), se.String(), cmd.ProcessState.ExitCode()}
	for _, want := range []string{
		"gitconfig-has-cred 0\n", "env-has-cred 0\n", "branches 250\n", "pushed\n", "fetched big\n",
		"control 200\n", "dotdot 400\n", "pct2e 400\n", "slashes 400\n", "method 405\n", "query 403\n", "redirect 502\n",
		"echo-start\n",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("missing %q in the workload's output", want)
		}
	}
	if strings.Count(r.stdout, "control 200\n") != 2 || strings.Contains(r.stdout, "failed") {
		t.Errorf("controls or clones failed")
	}
	if strings.Contains(r.stdout, "SVCCRED") || strings.Contains(r.stdout, "Basic ") {
		t.Errorf("the credential reached the workload")
	}
	if r.code != 125 {
		t.Errorf("exit %d, want 125 (the run is cancelled after the echoed credential)", r.code)
	}
	if t.Failed() {
		t.Fatalf("%s", r)
	}
	// The server: the push arrived; every request carried moat's
	// credential; no attack reached it.
	head, err := gitsrv.Git(root, nil, "--git-dir", filepath.Join(root, "repo.git"), "log", "-1", "--format=%s", "main")
	if err != nil || strings.TrimSpace(head) != "big" {
		t.Errorf("server's main: %q %v", head, err)
	}
	echo := 0
	for _, s := range srv.Seen() {
		if s.Header.Get("Authorization") == "" || s.Header.Get("Moat-Pre-Effect") == "" {
			t.Errorf("server got %s %s without credential or pre-effect", s.Method, s.Path)
		}
		if strings.Contains(s.Path, "..") || strings.Contains(s.Path, "other.git") || s.Method == "DELETE" || strings.Contains(s.Query, "archive") {
			t.Errorf("attack reached the server: %s %s?%s", s.Method, s.Path, s.Query)
		}
		if strings.HasPrefix(s.Path, "/echo.git/") {
			echo++
		}
	}
	if echo != 1 {
		t.Errorf("the server saw %d echo requests, want 1 (none after the run was cancelled)", echo)
	}
	// The journal verifies and has the records.
	dir := onlyRunDir(t, e.auditDir)
	if v := e.moat("audit", "verify", dir); v.code != 0 {
		t.Errorf("audit verify: %s", v)
	}
	var gz, bigPush, refused, redirect, reflected int
	for _, p := range journalPayloads(t, filepath.Join(dir, "journal.jsonl")) {
		switch p["type"] {
		case "service.requested":
			if p["content_encoding"] == "gzip" {
				gz++
			}
			if p["path"] == "/repo.git/git-receive-pack" && p["body_bytes"].(float64) > 1<<20 {
				bigPush++
			}
		case "service.refused", "inference.refused":
			refused++
		case "service.failed":
			switch p["reason"] {
			case "service_redirect":
				redirect++
			case "credential_reflected":
				reflected++
			}
		}
	}
	if gz == 0 || bigPush != 1 || refused != 5 || redirect != 1 || reflected != 1 {
		t.Errorf("journal: %d gzip requests (want some), %d pushes over 1 MiB (want 1), %d refusals (want 5, the attacks), %d redirects, %d reflections (want 1 each)",
			gz, bigPush, refused, redirect, reflected)
	}
	show := e.moat("audit", "show", filepath.Join(dir, "journal.jsonl"))
	for _, want := range []string{"service.requested", "service.completed", "REFUSED service.refused", "FAILED service.failed", "encoding=gzip"} {
		if !strings.Contains(show.stdout, want) {
			t.Errorf("audit show lacks %q:\n%s", want, show.stdout)
		}
	}
}
