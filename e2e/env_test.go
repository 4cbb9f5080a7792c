//go:build linux

package e2e

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// envPolicy writes a policy with the given providers (YAML list items,
// may be empty) whose base_url is a closed loopback port: these runs make
// no request.
func envPolicy(e *env, name, providers string) string {
	e.t.Helper()
	inf := ""
	if providers != "" {
		inf = "inference:\n  providers:\n" + providers
	}
	return e.policyAt(filepath.Join(e.dir, name), e.workspace, inf)
}

const (
	anthropicProvider = "    - {name: anth, api: anthropic-messages, base_url: \"http://127.0.0.1:9\", credential_env: E2E_ANTHROPIC_KEY, models: [claude-e2e]}\n"
	openaiProvider    = "    - {name: oai, api: openai-responses, base_url: \"http://127.0.0.1:9\", credential_env: E2E_OPENAI_KEY, models: [gpt-e2e]}\n"
)

// runEnv runs `sh -c env` under pol with both credentials set and returns
// the workload's variables by name.
func runEnv(t *testing.T, e *env, pol string) map[string]string {
	t.Helper()
	cmd := e.command("run", "--policy", pol, "--", "sh", "-c", "env")
	cmd.Env = append(cmd.Env, "E2E_ANTHROPIC_KEY="+anthropicCred, "E2E_OPENAI_KEY="+openaiCred, "TERM=xterm-e2e")
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	if err := cmd.Run(); err != nil {
		t.Fatalf("moat run: %v\n%s%s", err, so.String(), se.String())
	}
	m := map[string]string{}
	for _, l := range strings.Split(so.String(), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			m[k] = v
		}
	}
	return m
}

// Each provider family's SDK variables are set only when the policy has a
// provider of that family; MOAT_BROKER_URL always is. Without a terminal
// the caller's TERM is not passed.
func TestRunEnvProviderFamilies(t *testing.T) {
	e := newEnv(t)
	families := map[string][]string{
		"anthropic": {"ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"},
		"openai":    {"OPENAI_BASE_URL", "OPENAI_API_KEY"},
	}
	for _, tt := range []struct {
		name, providers string
		want            []string // families present
	}{
		{"none", "", nil},
		{"anthropic", anthropicProvider, []string{"anthropic"}},
		{"openai", openaiProvider, []string{"openai"}},
		{"both", anthropicProvider + openaiProvider, []string{"anthropic", "openai"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := runEnv(t, e, envPolicy(e, "env-"+tt.name+".yaml", tt.providers))
			for fam, vars := range families {
				want := strings.Contains(strings.Join(tt.want, " "), fam)
				for _, v := range vars {
					if _, ok := got[v]; ok != want {
						t.Errorf("%s set: %v, want %v (env %v)", v, ok, want, got)
					}
				}
			}
			if !strings.HasPrefix(got["MOAT_BROKER_URL"], "http://127.0.0.1:") {
				t.Errorf("MOAT_BROKER_URL = %q, want the broker's address", got["MOAT_BROKER_URL"])
			}
			if base, ok := got["OPENAI_BASE_URL"]; ok && base != got["MOAT_BROKER_URL"]+"/v1" {
				t.Errorf("OPENAI_BASE_URL %q, want %s/v1", base, got["MOAT_BROKER_URL"])
			}
			if term, ok := got["TERM"]; ok {
				t.Errorf("TERM=%s without a terminal", term)
			}
			if got["PATH"] != "/usr/bin:/bin" {
				t.Errorf("the policy's PATH is missing (positive control): %v", got)
			}
		})
	}
}

// The caller's TERM reaches a workload that moat gives a terminal, and
// only then (the test above is the no-terminal control); a TERM that is
// not a terminal type name is not passed, and the policy's own TERM wins.
func TestRunEnvTermWithTerminal(t *testing.T) {
	e := newEnv(t)
	pol := ttyPolicy(e)
	own := e.policyAt(filepath.Join(e.dir, "own-term.yaml"), e.workspace, "")
	b, _ := os.ReadFile(own)
	os.WriteFile(own, bytes.Replace(b, []byte("env: {PATH: /usr/bin:/bin}"), []byte("env: {PATH: /usr/bin:/bin, TERM: dumb}"), 1), 0o644)
	for _, tt := range []struct {
		name, term, pol, want string
	}{
		{"caller's TERM", "xterm-e2e-256color", pol, "term=[xterm-e2e-256color]"},
		{"not a terminal type name", "xterm; rm -rf /", pol, "term=[]"},
		{"the policy's TERM wins", "xterm-e2e", own, "term=[dumb]"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := newTestTTY(t)
			cmd := e.command("run", "--policy", tt.pol, "--", "sh", "-c", `echo "term=[$TERM] tty=$([ -t 0 ] && echo yes)"`)
			cmd.Env = append(cmd.Env, "TERM="+tt.term)
			p.start(t, cmd)
			defer cmd.Process.Kill()
			var out bytes.Buffer
			p.readUntil(t, &out, "tty=", 60*time.Second)
			p.readUntil(t, &out, "\n", 5*time.Second)
			cmd.Wait()
			if !strings.Contains(out.String(), tt.want+" tty=yes") {
				t.Errorf("terminal shows %q, want %q with a terminal", out.String(), tt.want)
			}
		})
	}
	// Control without a terminal, same TERM in moat's environment.
	cmd := e.command("run", "--policy", pol, "--", "sh", "-c", `echo "term=[$TERM]"`)
	cmd.Env = append(cmd.Env, "TERM=xterm-e2e-256color")
	out, err := cmd.Output()
	if err != nil || !strings.Contains(string(out), "term=[]") {
		t.Errorf("without a terminal: %v %q, want term=[]", err, out)
	}
}

// Every provider's credential_env is checked before anything starts: one
// refusal (125) names each missing or unusable variable with its
// providers, and no run directory is made; with both set the run works.
func TestRunCredentialsCheckedAtStart(t *testing.T) {
	e := newEnv(t)
	pol := envPolicy(e, "creds.yaml", anthropicProvider+
		"    - {name: anth2, api: anthropic-messages, base_url: \"http://127.0.0.1:9\", credential_env: E2E_ANTHROPIC_KEY, models: [claude-two]}\n"+
		openaiProvider)
	run := func(env ...string) result {
		cmd := e.command("run", "--policy", pol, "--", "true")
		for _, kv := range cmd.Env {
			if !strings.HasPrefix(kv, "E2E_") {
				env = append(env, kv)
			}
		}
		cmd.Env = env
		var so, se bytes.Buffer
		cmd.Stdout, cmd.Stderr = &so, &se
		cmd.Run()
		return result{so.String(), se.String(), cmd.ProcessState.ExitCode()}
	}
	runDirs := func() int {
		ents, _ := os.ReadDir(e.auditDir)
		return len(ents)
	}
	for _, tt := range []struct {
		name string
		env  []string
		want []string
		not  []string
	}{
		{"both missing", nil, []string{`E2E_ANTHROPIC_KEY is not set or empty (providers "anth", "anth2")`, `E2E_OPENAI_KEY is not set or empty (provider "oai")`}, nil},
		{"one empty", []string{"E2E_ANTHROPIC_KEY=" + anthropicCred, "E2E_OPENAI_KEY="}, []string{`E2E_OPENAI_KEY is not set or empty (provider "oai")`}, []string{"E2E_ANTHROPIC_KEY"}},
		{"one too short", []string{"E2E_ANTHROPIC_KEY=sk-1", "E2E_OPENAI_KEY=" + openaiCred}, []string{`E2E_ANTHROPIC_KEY (providers "anth", "anth2") is unusable`, "shorter than 8"}, []string{"E2E_OPENAI_KEY"}},
		{"one with a space", []string{"E2E_ANTHROPIC_KEY=" + anthropicCred, "E2E_OPENAI_KEY=sk-has a-space-0123"}, []string{`E2E_OPENAI_KEY (provider "oai") is unusable`, "space"}, []string{"E2E_ANTHROPIC_KEY"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := runDirs()
			r := run(tt.env...)
			if r.code != 125 {
				t.Fatalf("exit %d, want 125\n%s", r.code, r)
			}
			if n := strings.Count(r.stderr, "moat: refused:"); n != 1 || strings.Count(r.stderr, "\n") != 1 {
				t.Errorf("want one refusal line:\n%s", r.stderr)
			}
			for _, w := range tt.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, r.stderr)
				}
			}
			for _, w := range tt.not {
				if strings.Contains(r.stderr, w) {
					t.Errorf("stderr names %s, which is fine:\n%s", w, r.stderr)
				}
			}
			if strings.Contains(r.stderr, anthropicCred) || strings.Contains(r.stderr, openaiCred) {
				t.Errorf("a credential is printed:\n%s", r.stderr)
			}
			if runDirs() != before {
				t.Errorf("a run directory was made for a refused start")
			}
		})
	}
	// Control: both set, the same policy runs.
	if r := run("E2E_ANTHROPIC_KEY="+anthropicCred, "E2E_OPENAI_KEY="+openaiCred); r.code != 0 {
		t.Errorf("with both credentials: %s", r)
	}
}

// The broker's lines on moat's stderr: by default a completed request
// prints nothing and a refused one prints one line; --log-level requests
// adds the completed one, MOAT_LOG=quiet prints neither, and a bad level
// is refused before anything starts.
func TestRunBrokerLogLevels(t *testing.T) {
	e := newEnv(t)
	p, ptls := newProvider(t, false), newProvider(t, true)
	pol := e.brokerPolicy(p, ptls)
	for _, tt := range []struct {
		name                string
		flags, env          []string
		completed, refusals int
	}{
		{"default", nil, nil, 0, 1},
		{"--log-level requests", []string{"--log-level", "requests"}, nil, 1, 1},
		{"MOAT_LOG=quiet", nil, []string{"MOAT_LOG=quiet"}, 0, 0},
		{"--log-level over MOAT_LOG", []string{"--log-level", "refusals"}, []string{"MOAT_LOG=requests"}, 0, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := append(append([]string{"run"}, tt.flags...), "--policy", pol, "--", e.probe, helperArg,
				"sdk-anthropic=claude-e2e", "sdk-anthropic=claude-not-allowed")
			cmd := e.command(args...)
			cmd.Env = append(append(cmd.Env, "E2E_ANTHROPIC_KEY="+anthropicCred, "E2E_OPENAI_KEY="+openaiCred), tt.env...)
			var so, se bytes.Buffer
			cmd.Stdout, cmd.Stderr = &so, &se
			cmd.Run()
			r := result{so.String(), se.String(), cmd.ProcessState.ExitCode()}
			if r.code != 0 {
				t.Fatalf("%s", r)
			}
			wantOK(t, r, "sdk-anthropic=claude-e2e")
			wantErr(t, r, "sdk-anthropic=claude-not-allowed", "not allowed")
			if got := strings.Count(r.stderr, `msg="moat.broker completed"`); got != tt.completed {
				t.Errorf("%d completed lines, want %d:\n%s", got, tt.completed, r.stderr)
			}
			if got := strings.Count(r.stderr, `msg="moat.broker refused"`); got != tt.refusals {
				t.Errorf("%d refused lines, want %d:\n%s", got, tt.refusals, r.stderr)
			}
			if tt.refusals == 1 && !strings.Contains(r.stderr, "reason=model_not_allowed") {
				t.Errorf("the refusal line does not say why:\n%s", r.stderr)
			}
		})
	}
	r := e.moat("run", "--log-level", "loud", "--policy", pol, "--", "true")
	if r.code != 125 || !strings.Contains(r.stderr, `unknown log level "loud"`) {
		t.Errorf("bad --log-level: %s", r)
	}
	cmd := e.command("run", "--policy", pol, "--", "true")
	cmd.Env = append(cmd.Env, "MOAT_LOG=loud", "E2E_ANTHROPIC_KEY="+anthropicCred, "E2E_OPENAI_KEY="+openaiCred)
	out, _ := cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 125 || !strings.Contains(string(out), `unknown log level "loud"`) {
		t.Errorf("bad MOAT_LOG: exit %d %s", cmd.ProcessState.ExitCode(), out)
	}
}

// sandbox create checks the credentials and the log level as run does:
// refused with the same message, and with both set the sandbox is created
// (and deleted).
func TestSandboxCreateChecksCredentialsAndLogLevel(t *testing.T) {
	e := newEnv(t)
	pol := envPolicy(e, "sb-creds.yaml", anthropicProvider)
	create := func(extra []string, args ...string) result {
		cmd := e.command(append([]string{"sandbox", "create"}, args...)...)
		cmd.Env = append(cmd.Env, extra...)
		var so, se bytes.Buffer
		cmd.Stdout, cmd.Stderr = &so, &se
		cmd.Run()
		return result{so.String(), se.String(), cmd.ProcessState.ExitCode()}
	}
	if r := create(nil, "--name", "nocreds", "--policy", pol); r.code != 125 || !strings.Contains(r.stderr, `E2E_ANTHROPIC_KEY is not set or empty (provider "anth")`) {
		t.Errorf("create without the credential: %s", r)
	}
	withKey := []string{"E2E_ANTHROPIC_KEY=" + anthropicCred}
	if r := create(withKey, "--name", "badlevel", "--log-level", "loud", "--policy", pol); r.code != 125 || !strings.Contains(r.stderr, `unknown log level "loud"`) {
		t.Errorf("create --log-level loud: %s", r)
	}
	if r := create(append(withKey, "MOAT_LOG=loud"), "--name", "badenv", "--policy", pol); r.code != 125 || !strings.Contains(r.stderr, `unknown log level "loud"`) {
		t.Errorf("create with MOAT_LOG=loud: %s", r)
	}
	// Control: the credential set and a known level.
	if r := create(withKey, "--name", "ok", "--log-level", "debug", "--policy", pol); r.code != 0 {
		t.Fatalf("create with the credential: %s", r)
	}
	if r := e.moat("sandbox", "delete", "ok"); r.code != 0 {
		t.Errorf("delete: %s", r)
	}
}
