// Package gitsrv is a smart-HTTP git server for tests: git http-backend
// (from git's exec path) behind a Go TLS server using net/http/cgi, on
// 127.0.0.1, serving the bare repositories under one directory.
package gitsrv

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// Server is a running git server.
type Server struct {
	*httptest.Server
	Root string // the directory of bare repositories

	mu   sync.Mutex
	seen []Seen
	// Respond, when set, sees each request first and reports whether it
	// answered it; else http-backend does (tests of a misbehaving
	// service).
	Respond func(w http.ResponseWriter, r *http.Request) bool
}

// Seen is one request as the server received it.
type Seen struct {
	Method, Path, Query string
	Header              http.Header
	BodyBytes           int
}

// Backend returns git http-backend's path, or "" when git has none.
func Backend() string {
	out, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		return ""
	}
	p := filepath.Join(strings.TrimSpace(string(out)), "git-http-backend")
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// Start serves root's repositories over TLS on 127.0.0.1. Every push is
// allowed (http.receivepack).
func Start(root string) (*Server, error) {
	be := Backend()
	if be == "" {
		return nil, fmt.Errorf("git http-backend not found (install git)")
	}
	s := &Server{Root: root}
	h := &cgi.Handler{Path: be, Env: []string{
		"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"HOME=" + root}}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		s.mu.Lock()
		s.seen = append(s.seen, Seen{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Header: r.Header.Clone(), BodyBytes: len(body)})
		respond := s.Respond
		s.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		r.Header.Del("Transfer-Encoding")
		if respond != nil && respond(w, r) {
			return
		}
		if r.Header.Get("Authorization") == "" {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, "credential required", 401)
			return
		}
		r.Header.Set("Content-Length", fmt.Sprint(len(body)))
		h.ServeHTTP(w, r)
	}))
	s.Config.ErrorLog = log.New(io.Discard, "", 0)
	s.StartTLS()
	return s, nil
}

// SetRespond sets Respond (nil: http-backend for every request).
func (s *Server) SetRespond(f func(w http.ResponseWriter, r *http.Request) bool) {
	s.mu.Lock()
	s.Respond = f
	s.mu.Unlock()
}

// Seen returns the requests received so far.
func (s *Server) Seen() []Seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Seen(nil), s.seen...)
}

// CAPEM is the server's certificate, PEM-encoded, for a client's roots.
func (s *Server) CAPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw})
}

// RootCAs is a pool holding the server's certificate.
func (s *Server) RootCAs() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(s.Certificate())
	return p
}

// Git runs git with no user or system configuration in dir.
func Git(dir string, env []string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append([]string{"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "HOME=" + dir, "PATH=" + os.Getenv("PATH"),
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com",
		"GIT_TERMINAL_PROMPT=0"}, env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// MakeRepo makes root/name (bare) with one commit on main and refs more
// branches, each a commit of its own.
func MakeRepo(root, name string, refs int) error {
	work, err := os.MkdirTemp("", "gitsrv-work-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	steps := [][]string{{"init", "-q", "-b", "main", "."}}
	if _, err := Git(work, nil, steps[0]...); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(work, "README"), []byte("hello\n"), 0o644); err != nil {
		return err
	}
	if _, err := Git(work, nil, "add", "README"); err != nil {
		return err
	}
	if _, err := Git(work, nil, "commit", "-q", "-m", "first"); err != nil {
		return err
	}
	// refs branches in one fast-import stream: one commit each.
	var fi bytes.Buffer
	for i := 0; i < refs; i++ {
		fmt.Fprintf(&fi, "commit refs/heads/b%03d\ncommitter t <t@example.com> %d +0000\ndata 4\nb%03d\nfrom refs/heads/main\nM 644 inline f%03d\ndata 2\n%d\n\n", i, 1700000000+i, i, i, i%10)
	}
	cmd := exec.Command("git", "fast-import", "--quiet")
	cmd.Dir = work
	cmd.Env = []string{"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "HOME=" + work, "PATH=" + os.Getenv("PATH")}
	cmd.Stdin = &fi
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("git fast-import: %v: %s", err, out)
	}
	bare := filepath.Join(root, name)
	if _, err := Git(root, nil, "clone", "-q", "--bare", "--mirror", work, bare); err != nil {
		return err
	}
	_, err = Git(bare, nil, "config", "http.receivepack", "true")
	return err
}
