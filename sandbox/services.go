package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/broker"
	"github.com/moat-sandbox/moat/internal/netguard"
	"github.com/moat-sandbox/moat/policy"
)

// Brokered services (the policy's egress.services): the broker serves
// them at /svc/<name>/ on its loopback port, adding each one's credential
// from moat's environment. For git, moat writes a git configuration
// inside the sandbox that rewrites each service's base_url to its broker
// URL,
//
//	[url "http://127.0.0.1:PORT/svc/github/"]
//		insteadOf = "https://github.com/"
//
// and points GIT_CONFIG_GLOBAL at it, so that `git clone
// https://github.com/owner/repo` works unmodified and without any user
// configuration. The file is written like MOAT_MCP_CONFIG's, by moat's
// own binary run as a helper under the workload's full confinement
// (MCPConfigHelper: a new file in the sandbox's private /tmp, no
// symlinks followed), before the workload starts; it holds no credential.
const (
	// GitConfigPath is where the file is, inside the sandbox.
	GitConfigPath = "/tmp/.moat/gitconfig"
	// GitConfigEnv is git's variable naming its global configuration.
	GitConfigEnv = "GIT_CONFIG_GLOBAL"
)

// testGlobalAddr, when valid, is the one address the SSRF guard treats
// as global: set only in binaries built with the moat_test_hooks tag
// (egressguard_hooks.go), never by the policy or the CLI.
var testGlobalAddr netip.Addr

// newEgressGuard is the run's SSRF guard (internal/netguard): it resolves
// a name once, refuses every address that is not global unicast and
// dials the checked address.
func newEgressGuard() *netguard.Guard {
	if testGlobalAddr.IsValid() {
		return netguard.New(netguard.WithTestGlobal(testGlobalAddr))
	}
	return netguard.New()
}

// gitConfig is the file's content for the broker at port: one url
// section per service.
func gitConfig(port int, pol *policy.Policy) []byte {
	var b bytes.Buffer
	b.WriteString("# Written by moat: git reaches each granted service through moat's broker,\n# which adds the credential (egress.services).\n")
	for _, s := range pol.Egress.Services {
		fmt.Fprintf(&b, "[url %s]\n\tinsteadOf = %s\n",
			gitQuote("http://127.0.0.1:"+strconv.Itoa(port)+broker.ServicesPathPrefix+s.Name+"/"),
			gitQuote(strings.TrimSuffix(s.BaseURL, "/")+"/"))
	}
	return b.Bytes()
}

// gitQuote quotes a git configuration value or subsection name.
func gitQuote(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	return `"` + r.Replace(s) + `"`
}

// serviceEnv is the workload's git variable: GIT_CONFIG_GLOBAL when the
// policy grants any service.
func serviceEnv(pol *policy.Policy) []string {
	if len(pol.Egress.Services) == 0 {
		return nil
	}
	return []string{GitConfigEnv + "=" + GitConfigPath}
}

// serviceCredentials reads each service's credential_env from moat's
// environment; a service that names a variable that is unset or empty
// refuses the run, naming the variable.
func serviceCredentials(pol *policy.Policy, getenv func(string) string) (map[string]string, error) {
	creds := map[string]string{}
	var probs []string
	for _, s := range pol.Egress.Services {
		if s.CredentialEnv == "" {
			continue
		}
		v := getenv(s.CredentialEnv)
		if v == "" {
			probs = append(probs, fmt.Sprintf("%s is not set or empty (service %q)", s.CredentialEnv, s.Name))
			continue
		}
		creds[s.Name] = v
	}
	if len(probs) > 0 {
		return nil, &RefusedError{Msg: "egress.services: " + strings.Join(probs, "; ") + "; set it in moat's environment (it never enters the sandbox)"}
	}
	return creds, nil
}

// openServices builds the broker's service route and writes the git
// configuration inside the sandbox; nil (/svc/ refused like any unknown
// path) when the policy grants no service. guarded are the run's other
// credentials, which a service's answer must not carry either.
func (s *Session) openServices(ctx context.Context, guarded []string) (*broker.Services, error) {
	if len(s.pol.Egress.Services) == 0 {
		return nil, nil
	}
	creds, err := serviceCredentials(s.pol, os.Getenv)
	if err != nil {
		return nil, err
	}
	svc, err := broker.NewServices(broker.ServicesConfig{Grants: s.pol.Egress.Services, Credentials: creds,
		Guarded: guarded, Dial: newEgressGuard().DialContext})
	if err != nil {
		return nil, &RefusedError{Msg: err.Error()}
	}
	if err := writeSandboxFile(ctx, s.sb, GitConfigPath, gitConfig(s.BrokerPort, s.pol)); err != nil {
		return nil, &RefusedError{Msg: err.Error()}
	}
	return svc, nil
}

// writeSandboxFile writes a new file inside sb with MCPConfigHelper.
func writeSandboxFile(ctx context.Context, sb boundary.Sandbox, path string, content []byte) error {
	var out bytes.Buffer
	p, err := sb.StartHelper(ctx, []string{MCPConfigHelper, path}, boundary.Process{
		Env: []string{"PATH=/nonexistent"}, Dir: "/tmp", Stdin: bytes.NewReader(content), Stdout: &out, Stderr: &out})
	if err != nil {
		return fmt.Errorf("writing %s in the sandbox: %w", path, err)
	}
	if code, err := p.Wait(); err != nil || code != 0 {
		return fmt.Errorf("writing %s in the sandbox: exit %d %v: %s", path, code, err, bytes.TrimSpace(out.Bytes()))
	}
	return nil
}
