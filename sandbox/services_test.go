package sandbox

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/testenv"
	"github.com/moat-sandbox/moat/policy"
)

func servicePolicy() *policy.Policy {
	return &policy.Policy{Egress: policy.Egress{Services: []policy.EgressService{
		{Name: "github", BaseURL: "https://github.com/", CredentialEnv: "MOAT_TEST_GH", Auth: "basic"},
		{Name: "api", BaseURL: "https://api.example.com/v2"},
	}}}
}

// TestGitConfig: git itself reads the file moat writes and rewrites each
// base_url to the broker; a URL of no service is left alone (control).
func TestGitConfig(t *testing.T) {
	_, err := exec.LookPath("git")
	testenv.Need(t, err == nil, "git is not installed (CI installs it: .ci/run)")
	f := filepath.Join(t.TempDir(), "gitconfig")
	if err := os.WriteFile(f, gitConfig(4242, servicePolicy()), 0o644); err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]string{
		"https://github.com/owner/repo":   "http://127.0.0.1:4242/svc/github/owner/repo",
		"https://api.example.com/v2/x":    "http://127.0.0.1:4242/svc/api/x",
		"https://gitlab.com/owner/repo":   "https://gitlab.com/owner/repo",
		"https://github.com.evil/x":       "https://github.com.evil/x",
		"https://api.example.com/v2other": "https://api.example.com/v2other",
	} {
		cmd := exec.Command("git", "ls-remote", "--get-url", in)
		cmd.Env = []string{"GIT_CONFIG_GLOBAL=" + f, "GIT_CONFIG_NOSYSTEM=1", "HOME=/nonexistent", "PATH=" + os.Getenv("PATH")}
		cmd.Dir = t.TempDir()
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("git ls-remote --get-url %s: %v", in, err)
		}
		if got := strings.TrimSpace(string(out)); got != want {
			t.Errorf("%s: git uses %s, want %s", in, got, want)
		}
	}
	if env := serviceEnv(servicePolicy()); len(env) != 1 || env[0] != "GIT_CONFIG_GLOBAL="+GitConfigPath {
		t.Errorf("serviceEnv = %v", env)
	}
	if env := serviceEnv(&policy.Policy{}); env != nil {
		t.Errorf("serviceEnv without services = %v", env)
	}
}

// TestServiceCredentials: an unset credential_env refuses the run by
// name; set, it is read; a service without one needs none.
func TestServiceCredentials(t *testing.T) {
	pol := servicePolicy()
	if _, err := serviceCredentials(pol, func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), "MOAT_TEST_GH") {
		t.Fatalf("unset: %v", err)
	}
	c, err := serviceCredentials(pol, func(k string) string { return map[string]string{"MOAT_TEST_GH": "u:tok"}[k] })
	if err != nil || c["github"] != "u:tok" || len(c) != 1 {
		t.Fatalf("set: %v %v", c, err)
	}
}
