package probe

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
)

// Names shared with the controller for the egress case (issue 13). The
// names resolve only through the test resolver of the moat_test_hooks
// binary that the controller runs for this case.
const (
	// EgressCA is the test CA's certificate, written by the controller
	// into the workspace.
	EgressCA = ".moat-evidence-egress-ca.pem"
	// EgressGranted is the registry's granted name; EgressRebind is
	// granted too, and answers the registry's address at its first lookup
	// and the trap's (loopback) after; EgressUngranted resolves to the
	// registry's address but is not granted; EgressPrivate is granted and
	// resolves to a private address, EgressLoopback to the trap's.
	EgressGranted   = "registry.test"
	EgressRebind    = "rebind.test"
	EgressUngranted = "evil.test"
	EgressPrivate   = "private.test"
	EgressLoopback  = "loop.test"
	// EgressPath is the registry path the probe fetches.
	EgressPath = "/simple/moat-evidence/"
)

// egressGet fetches https://host:port/path through the egress port that
// moat gives the workload (HTTPS_PROXY, used for every host: Go's own
// proxy rules would bypass it for a loopback literal), trusting only the
// controller's test CA, and returns the body.
func (p *runner) egressGet(name, host string) (string, error) {
	proxy := os.Getenv("HTTPS_PROXY")
	if proxy == "" {
		err := errors.New("HTTPS_PROXY is not set")
		p.step(name, 0, err, "")
		return "", err
	}
	pu, err := url.Parse(proxy)
	if err != nil {
		p.step(name, 0, err, "")
		return "", err
	}
	pem, err := os.ReadFile(filepath.Join(p.Workspace, EgressCA))
	if err != nil {
		p.step(name, 0, err, "")
		return "", err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	c := &http.Client{Timeout: stepTimeout, Transport: &http.Transport{Proxy: http.ProxyURL(pu),
		TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := c.Get("https://" + host + ":" + p.EgressPort + EgressPath)
	if err != nil {
		p.step(name, 0, err, "")
		return "", err
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
	body := strings.TrimSpace(string(b))
	p.step(name, res.StatusCode, nil, body)
	if res.StatusCode != http.StatusOK {
		return "", errors.New(res.Status)
	}
	return body, nil
}

func init() {
	// A granted registry fetch succeeds while an ungranted name, a
	// rebinding name and private- and loopback-address names are refused.
	caseSteps["egress-grants"] = func(p *runner) {
		p.control("before")
		if body, err := p.egressGet("egress-granted", EgressGranted); err == nil {
			p.control("egress-fetch data=" + body)
		}
		p.egressGet("egress-rebind-first", EgressRebind)
		p.egressGet("egress-rebind-second", EgressRebind)
		p.egressGet("egress-ungranted", EgressUngranted)
		p.egressGet("egress-private", EgressPrivate)
		p.egressGet("egress-loopback", EgressLoopback)
		p.control("after")
	}
}
