package broker

import (
	"context"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/broker/wire"
	"github.com/moat-sandbox/moat/internal/netguard"
	"github.com/moat-sandbox/moat/policy"
)

// Lockfile-bound package registries (egress.packages, issue 19). The
// workload's package manager speaks plain HTTP/1.1 to
// http://127.0.0.1:PORT/pkg/<kind>/ through the same strict front as
// inference; the broker answers only what the grant's lockfiles pin,
// read once when the sandbox started (PackagesConfig.NPM):
//
//   - GET /pkg/npm/<name>/-/<file>.tgz is served only if that path is the
//     resolved tarball of a pinned name and version. The broker journals
//     package.requested (name, version, the lockfile's digest) durably,
//     fetches the same path from the grant's upstream over TLS through
//     the SSRF guard's dialer, checks the bytes' SHA-512 against the
//     lockfile's integrity and serves them only if they match (otherwise
//     package.failed, nothing served); package.completed after.
//   - GET /pkg/npm/<name> (a packument) is fetched from the upstream and
//     served filtered to the pinned versions, each version's dist
//     rewritten to the lockfile's integrity and a tarball URL on the
//     broker, whatever the upstream said: a packument cannot send the
//     package manager to another host or to an unpinned version.
//   - Everything else is refused and never reaches the upstream
//     (package.refused): another method (publish, unpublish, dist-tag,
//     audit), a name no lockfile pins (the message names the lockfiles to
//     update), a version other than the pinned ones, registry endpoints
//     under /-/.
//
// Redirects from the upstream are never followed.
const PackagesPathPrefix = "/pkg/"

// Reasons of package.refused and package.failed records.
const (
	ReasonPackageUnknownKind  Reason = "package_kind_not_granted" // /pkg/<kind> names no granted registry
	ReasonPackageNotPinned    Reason = "package_not_pinned"       // no lockfile pins the name
	ReasonPackageVersion      Reason = "package_version_not_pinned"
	ReasonPackageEndpoint     Reason = "package_endpoint_refused" // a registry endpoint moat does not serve
	ReasonPackageDigest       Reason = "package_digest_mismatch"  // the tarball's bytes differ from the lockfile's digest
	ReasonPackageUpstream     Reason = "package_upstream_status"  // the upstream answered other than 200
	ReasonPackageMetadata     Reason = "package_metadata_invalid" // a packument moat cannot read
	ReasonPackageAddress      Reason = "package_address_refused"  // the SSRF guard refused the upstream's address
	ReasonPackageUnconfigured Reason = "package_unconfigured"
)

// packagePreEffectHeader carries, on every upstream package fetch, the
// lowercase hex SHA-256 of the fetch's package.requested journal line as
// written (without its LF): audit.LineHash, the value the next line's
// prev holds. It is the only header besides Accept, Accept-Encoding and
// User-Agent; the line itself (Moat-Pre-Effect on the other roads) is
// not sent, since it names the executable and the lockfile's host path.
const packagePreEffectHeader = "Moat-Pre-Effect-SHA256"

// PackageTimeout bounds one upstream fetch.
const PackageTimeout = 10 * time.Minute

// PackagesConfig configures the broker's package route.
type PackagesConfig struct {
	// Grants are the policy's egress.packages (validated).
	Grants []policy.PackageGrant
	// NPM are the pins of the npm grant's lockfiles, read once when the
	// sandbox started (ParseNPMLockfile); Go those of the goproxy grant's
	// go.sum files (ParseGoSum).
	NPM  []NPMPin
	Go   []GoPin
	PyPI []PyPIPin
	// BaseURL is where the workload reaches the broker,
	// "http://127.0.0.1:PORT": packuments' tarball URLs point there.
	BaseURL string
	// Dial is the SSRF guard's dialer (required; see ServicesConfig.Dial).
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
	// RootCAs verifies the upstreams' certificates; nil: the system's
	// roots plus the grant's ca_file.
	RootCAs *x509.CertPool
}

// Packages is the broker's package route (Config.Packages). Its pins
// are one packageSet, replaced whole by Reload (an operator's explicit
// re-read of the lockfiles); each request uses the set it loaded first.
type Packages struct {
	set   atomic.Pointer[packageSet]
	bases []*registry // one per grant: upstream, client and allowance, kept across reloads
	self  string      // BaseURL
}

// packageSet is the served registries built from one reading of the
// lockfiles.
type packageSet struct {
	npm     *npmRegistry
	goproxy *goRegistry
	pypi    *pypiRegistry
}

// registry is what every kind shares: the grant, its upstream and
// client, and its allowance.
type registry struct {
	grant    *policy.PackageGrant
	upstream *url.URL
	client   *http.Client
	used     atomic.Int64
}

type npmRegistry struct {
	*registry
	self      string             // BaseURL + "/pkg/npm"
	byTarball map[string]*NPMPin // resolved tarball path -> pin
	byName    map[string][]*NPMPin
}

// NewPackages checks cfg and builds the route.
func NewPackages(cfg PackagesConfig) (*Packages, error) {
	if cfg.Dial == nil {
		return nil, errors.New("moat: broker: packages: no guarded dialer (the SSRF guard is required)")
	}
	if u, err := url.Parse(cfg.BaseURL); err != nil || u.Scheme != "http" || u.Host == "" || u.Path != "" {
		return nil, fmt.Errorf("moat: broker: packages: base URL %q must be http://host:port", cfg.BaseURL)
	}
	p := &Packages{self: cfg.BaseURL}
	kinds := map[string]bool{}
	for i := range cfg.Grants {
		g := &cfg.Grants[i]
		roots := cfg.RootCAs
		if roots == nil {
			var err error
			if roots, err = x509.SystemCertPool(); err != nil || roots == nil {
				roots = x509.NewCertPool()
			}
			if g.CAFile != "" {
				pem, err := readCapped(g.CAFile, maxCAFileBytes)
				if err != nil {
					return nil, fmt.Errorf("moat: broker: packages: ca_file: %w", err)
				}
				if !roots.AppendCertsFromPEM(pem) {
					return nil, fmt.Errorf("moat: broker: packages: ca_file %q holds no PEM certificate", g.CAFile)
				}
			}
		}
		u, err := url.Parse(strings.TrimSuffix(g.Upstream, "/"))
		if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.RawPath != "" {
			return nil, fmt.Errorf("moat: broker: packages: upstream %q must be https://host[:port][/prefix]", g.Upstream)
		}
		base := &registry{grant: g, upstream: u, client: upstreamClient(cfg.Dial, roots, PackageTimeout)}
		switch {
		case !slices.Contains(policy.PackageKinds, g.Kind):
			return nil, fmt.Errorf("moat: broker: packages: kind %q is not served", g.Kind)
		case kinds[g.Kind]:
			return nil, fmt.Errorf("moat: broker: packages: %s is granted twice", g.Kind)
		}
		kinds[g.Kind] = true
		p.bases = append(p.bases, base)
	}
	set, err := p.build(cfg)
	if err != nil {
		return nil, err
	}
	p.set.Store(set)
	return p, nil
}

// build makes the served registries of the grants from the pins of cfg
// (NPM, Go, PyPI); the grants' upstreams, clients and allowances are
// p's.
func (p *Packages) build(cfg PackagesConfig) (*packageSet, error) {
	set := &packageSet{}
	var err error
	for _, base := range p.bases {
		switch base.grant.Kind {
		case policy.PackagePyPI:
			set.pypi, err = newPyPIRegistry(base, cfg.PyPI)
		case policy.PackageGoProxy:
			set.goproxy, err = newGoRegistry(base, cfg.Go)
		case policy.PackageNPM:
			set.npm, err = newNPMRegistry(base, p.self+PackagesPathPrefix+policy.PackageNPM, cfg.NPM)
		}
		if err != nil {
			return nil, err
		}
	}
	return set, nil
}

// lockfiles names the grant's lockfiles, for messages.
func (r *registry) lockfiles() string { return strings.Join(r.grant.Lockfiles, ", ") }

// servePackage serves one request under PackagesPathPrefix and reports
// whether the connection may be kept.
func (b *Broker) servePackage(x *exchange, req *request) bool {
	kind, rest, _ := strings.Cut(req.path[len(PackagesPathPrefix):], "/")
	x.api, x.endpoint = "package", PackagesPathPrefix+kind
	set := b.cfg.Packages.set.Load()
	r, g, py := set.npm, set.goproxy, set.pypi
	if !(kind == policy.PackageNPM && r != nil || kind == policy.PackageGoProxy && g != nil || kind == policy.PackagePyPI && py != nil) {
		return b.refusePackage(x, "", "", req.method, refuse(ReasonPackageUnknownKind, 404, "no package registry %s is granted; the policy's egress.packages grants %s", quote(kind), set.kinds()))
	}
	if b.failed.Load() {
		return b.refusePackage(x, kind, "", req.method, refuse(ReasonRunFailed, 503, "the run was stopped after a fatal event (%s); no further requests are possible", b.fatalReason()))
	}
	if req.method != http.MethodGet {
		return b.refusePackage(x, kind, "", req.method, refuse(ReasonMethod, 405, "method %s is refused: a package grant only installs what the lockfiles pin (no publish, unpublish, dist-tag or audit)", quote(req.method)))
	}
	if kind == policy.PackageGoProxy {
		return b.serveGoProxy(x, req, g, rest)
	}
	if kind == policy.PackagePyPI {
		return b.servePyPI(x, req, py, rest)
	}
	if rest == "" || strings.HasPrefix(rest, "-/") {
		return b.refusePackage(x, kind, "", req.method, refuse(ReasonPackageEndpoint, 404, "registry endpoint %s is not served: moat serves only the packages and tarballs %s pins", quote("/"+rest), r.lockfiles()))
	}
	if name, _, ok := strings.Cut(rest, npmTarballSep); ok {
		return b.serveNPMTarball(x, req, r, name, "/"+rest)
	}
	return b.serveNPMPackument(x, req, r, rest)
}

func (p *packageSet) kinds() string {
	var ks []string
	if p.npm != nil {
		ks = append(ks, policy.PackageNPM)
	}
	if p.goproxy != nil {
		ks = append(ks, policy.PackageGoProxy)
	}
	if p.pypi != nil {
		ks = append(ks, policy.PackagePyPI)
	}
	if len(ks) == 0 {
		return "none"
	}
	return strings.Join(ks, ", ")
}

func (r *npmRegistry) notPinned(name string) *frontError {
	if checkNPMName(name) != "" {
		return refuse(ReasonPackageNotPinned, 404, "%s is not a package name any lockfile pins (%s)", quote(name), r.lockfiles())
	}
	return refuse(ReasonPackageNotPinned, 404, "package %s is not in the lockfile (%s); add it there (npm install %s outside the sandbox, or with a grant that allows it) and start a new run", quote(name), r.lockfiles(), name)
}

func (r *npmRegistry) versions(name string) string {
	var vs []string
	for _, p := range r.byName[name] {
		vs = append(vs, p.Version)
	}
	slices.SortFunc(vs, compareSemver)
	return strings.Join(vs, ", ")
}

func (b *Broker) serveNPMTarball(x *exchange, req *request, r *npmRegistry, name, path string) bool {
	pin := r.byTarball[path]
	if pin == nil {
		if len(r.byName[name]) == 0 {
			return b.refusePackage(x, policy.PackageNPM, name, req.method, r.notPinned(name))
		}
		return b.refusePackage(x, policy.PackageNPM, name, req.method, refuse(ReasonPackageVersion, 404,
			"tarball %s is not pinned: the lockfile (%s) pins %s at %s only; update the lockfile to change versions", quote(path), r.lockfiles(), name, r.versions(name)))
	}
	rec := audit.PackageRequested{RequestID: x.id, Kind: policy.PackageNPM, Artifact: audit.PackageArtifactTarball, Name: pin.Name,
		Version: pin.Version, Expected: pin.IntegrityString(), Path: path, Lockfile: pin.Lockfile}
	status, data, ok := b.fetchPackage(x, req, r.registry, rec, path, "application/octet-stream")
	if !ok {
		return false
	}
	if sum := sha512.Sum512(data); sum != pin.Integrity {
		return b.packageFailure(x, status, ReasonPackageDigest, 502, "sha512-"+base64.StdEncoding.EncodeToString(sum[:]),
			fmt.Sprintf("the tarball of %s@%s from the upstream does not match the lockfile's integrity (%s): nothing was served", pin.Name, pin.Version, pin.Lockfile))
	}
	return b.completePackage(x, req, data, "application/octet-stream")
}

func (b *Broker) serveNPMPackument(x *exchange, req *request, r *npmRegistry, name string) bool {
	if strings.Count(name, "/") > 1 || (strings.Contains(name, "/") && !strings.HasPrefix(name, "@")) {
		return b.refusePackage(x, policy.PackageNPM, "", req.method, refuse(ReasonPackageEndpoint, 404, "path %s is neither a package nor a tarball", quote("/"+name)))
	}
	pins := r.byName[name]
	if len(pins) == 0 {
		return b.refusePackage(x, policy.PackageNPM, name, req.method, r.notPinned(name))
	}
	rec := audit.PackageRequested{RequestID: x.id, Kind: policy.PackageNPM, Artifact: audit.PackageArtifactMetadata, Name: name, Path: "/" + name}
	status, data, ok := b.fetchPackage(x, req, r.registry, rec, "/"+name, npmPackumentAccept)
	if !ok {
		return false
	}
	out, err := r.filterPackument(name, data)
	if err != nil {
		return b.packageFailure(x, status, ReasonPackageMetadata, 502, "", fmt.Sprintf("the upstream's metadata for %s cannot be read: %v", name, err))
	}
	return b.completePackage(x, req, out, "application/json")
}

// fetchPackage runs the common part of an admitted fetch: attribution,
// allowance, the durable package.requested, the upstream GET and its
// body. On failure the answer is written and ok is false.
func (b *Broker) fetchPackage(x *exchange, req *request, r *registry, rec audit.PackageRequested, path, accept string) (int, []byte, bool) {
	rec.Attribution = b.attribution(x)
	if b.cfg.Policy.Inference.RequireAttribution && rec.Attribution.Status != boundary.AttributionResolved {
		return 0, nil, b.refusePackage(x, rec.Kind, rec.Name, req.method, refuse(ReasonUnattributed, 403,
			"the policy requires every request to be attributed to a process, and this connection could not be (%s)", wire.Bound(rec.Attribution.Reason)))
	}
	if !r.reserve() {
		return 0, nil, b.refusePackage(x, rec.Kind, rec.Name, req.method, refuse(ReasonAllowanceExhausted, 429,
			"the %s grant's allowance (max_requests %d) is used up for this run", r.grant.Kind, r.grant.MaxRequests))
	}
	b.logDecision(x, slog.LevelDebug, decisionAdmitted, "", "")
	line, ok := b.appendStart(rec)
	if !ok {
		return 0, nil, b.packageFailure(x, 0, ReasonAuditFailure, 503, "", "the run's audit journal failed, so nothing was fetched and no further requests are possible; the run is ending")
	}
	if b.failed.Load() {
		return 0, nil, b.packageFailure(x, 0, ReasonRunFailed, 503, "", fmt.Sprintf("the run was stopped after a fatal event (%s); nothing was fetched", b.fatalReason()))
	}
	u := *r.upstream
	prefix := strings.TrimSuffix(u.Path, "/")
	if prefix != "" && strings.HasPrefix(path, prefix+"/") {
		prefix = ""
	}
	u.Path, u.RawPath = prefix+path, ""
	if strings.HasPrefix(path, "https://") {
		pu, err := url.Parse(path) // a PyPI file on the grant's files host, checked by the caller
		if err != nil {
			return 0, nil, b.packageFailure(x, 0, ReasonInternal, 500, "", "BUG: a checked file URL does not parse: "+err.Error())
		}
		u = *pu
	}
	hreq, err := http.NewRequestWithContext(b.ctx, http.MethodGet, u.String(), http.NoBody)
	if err != nil {
		return 0, nil, b.packageFailure(x, 0, ReasonInternal, 500, "", "BUG: building the upstream request: "+err.Error())
	}
	hreq.Header.Set("Accept", accept)
	hreq.Header.Set("Accept-Encoding", "identity")
	hreq.Header.Set("User-Agent", "moat")
	// The registry is usually public: it gets the line's digest, which
	// binds the fetch to its durable record for whoever holds the
	// journal, never the line (executable, lockfile path).
	hreq.Header.Set(packagePreEffectHeader, audit.LineHash(line))
	resp, err := r.client.Do(hreq)
	if err != nil {
		if rs := netguard.ReasonOf(err); rs != "" && rs != netguard.ReasonDialFailed {
			return 0, nil, b.packageFailure(x, 0, ReasonPackageAddress, 502, "", fmt.Sprintf("the upstream %s was not dialled: its address was refused (%s); moat dials only global unicast addresses", r.upstream.Host, rs))
		}
		return 0, nil, b.packageFailure(x, 0, ReasonUpstreamError, 502, "", fmt.Sprintf("the upstream %s could not be reached: %s", r.upstream.Host, upstreamErrText(err)))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		answer := 502
		if resp.StatusCode == http.StatusNotFound {
			answer = 404
		}
		return resp.StatusCode, nil, b.packageFailure(x, resp.StatusCode, ReasonPackageUpstream, answer, "", fmt.Sprintf("the upstream answered HTTP %d for %s (redirects are not followed)", resp.StatusCode, path))
	}
	rbody, _, err := decodeBody(resp)
	if err != nil {
		return resp.StatusCode, nil, b.packageFailure(x, resp.StatusCode, ReasonUpstreamEncoding, 502, "", "the upstream sent a response moat cannot inspect: "+upstreamErrText(err))
	}
	x.w.charge.deadline = time.Now().Add(b.readTimeout)
	data, err := b.readResponse(x.w, rbody)
	var fe *frontError
	switch {
	case errors.As(err, &fe):
		return resp.StatusCode, nil, b.packageFailure(x, resp.StatusCode, fe.Code, 502, "", fe.Msg)
	case err != nil:
		return resp.StatusCode, nil, b.packageFailure(x, resp.StatusCode, ReasonUpstreamError, 502, "", "reading the upstream's answer failed: "+upstreamErrText(err))
	}
	return resp.StatusCode, data, true
}

// completePackage journals package.completed and serves data.
func (b *Broker) completePackage(x *exchange, req *request, data []byte, ctype string) bool {
	sum := sha256.Sum256(data)
	_, wait, ok := b.appendAsync(audit.PackageCompleted{RequestID: x.id, Status: http.StatusOK,
		BodySHA256: hex.EncodeToString(sum[:]), BodyBytes: int64(len(data))}, true)
	if !ok {
		return b.packageFailure(x, http.StatusOK, ReasonAuditFailure, 503, "", "the run's audit journal failed; the answer is withheld and the run is ending")
	}
	x.status = http.StatusOK
	werr := writeFull(x.w.bw, http.StatusOK, [][2]string{{"Moat-Request-Id", x.id}, {"Content-Type", ctype}}, data, req.close)
	b.syncSoon(wait)
	b.logDecision(x, slog.LevelInfo, decisionCompleted, "", "")
	return werr == nil
}

func (r *registry) reserve() bool {
	for {
		n := r.used.Load()
		if n >= int64(r.grant.MaxRequests) {
			return false
		}
		if r.used.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// packageError answers in the shape npm prints: {"error": message}.
func packageError(x *exchange, status int, code Reason, msg string) {
	body, _ := json.Marshal(map[string]string{"error": msg, "code": string(code)})
	hdr := [][2]string{{"Content-Type", "application/json"}, {"Moat-Reason", string(code)}, {"Moat-Request-Id", x.id}}
	writeFull(x.w.bw, status, hdr, body, true)
}

// refusePackage journals package.refused (counted with every refusal of
// the run against inference.max_refusals) and answers; nothing was
// fetched.
func (b *Broker) refusePackage(x *exchange, kind, name, method string, fe *frontError) bool {
	msg := wire.BoundTo(refusalPrefix+fe.Msg, MaxDetailBytes)
	x.status = fe.Status
	switch n := b.refusals.Add(1); {
	case n <= b.maxRefusals+1:
		b.logDecision(x, slog.LevelWarn, decisionRefused, fe.Code, msg)
		b.appendStart(audit.PackageRefused{RequestID: x.id, Kind: kind, Method: wire.Bound(method), Name: wire.Bound(name),
			Reason: string(fe.Code), Detail: msg, Attribution: b.attribution(x)})
		if n == b.maxRefusals+1 {
			b.fatal(ReasonRefusalLimit, fmt.Errorf("the broker refused %d requests, more than the policy's inference.max_refusals (%d); the run was ended so that refusals cannot fill the journal: read the refusals in the journal and fix the workload's requests, or raise inference.max_refusals",
				n, b.maxRefusals))
		}
	case n == b.maxRefusals+2:
		b.logDecision(x, slog.LevelWarn, decisionRefused, fe.Code, "refusals past inference.max_refusals are answered but neither journaled nor logged")
	}
	packageError(x, fe.Status, fe.Code, msg)
	return false
}

// packageFailure closes a journaled package.requested with package.failed
// and answers; got is the received digest on a mismatch.
func (b *Broker) packageFailure(x *exchange, status int, reason Reason, answer int, got, msg string) bool {
	detail := wire.BoundTo(failurePrefix(reason)+msg, MaxDetailBytes)
	x.status = answer
	b.append(audit.PackageFailed{RequestID: x.id, Status: status, Reason: string(reason), Detail: detail, Got: got})
	b.logDecision(x, slog.LevelWarn, decisionFailed, reason, detail)
	packageError(x, answer, reason, detail)
	return false
}

// filterPackument keeps the versions the lockfiles pin, with dist set to
// the lockfile's integrity and the broker's tarball URL, and dist-tags
// reduced to latest (the highest pinned version the upstream knows).
func (r *npmRegistry) filterPackument(name string, data []byte) ([]byte, error) {
	var doc struct {
		Name     string                                `json:"name"`
		Versions map[string]map[string]json.RawMessage `json:"versions"`
		Modified json.RawMessage                       `json:"modified,omitempty"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	if doc.Name != name {
		return nil, fmt.Errorf("it names package %q", doc.Name)
	}
	versions := map[string]map[string]json.RawMessage{}
	latest := ""
	for _, pin := range r.byName[name] {
		v, ok := doc.Versions[pin.Version]
		if !ok {
			continue
		}
		var ver struct {
			Name    string `json:"name"`
			Version string `json:"version"`
		}
		raw, _ := json.Marshal(v)
		if json.Unmarshal(raw, &ver) != nil || ver.Name != name || ver.Version != pin.Version {
			return nil, fmt.Errorf("version %s does not describe %s@%s", pin.Version, name, pin.Version)
		}
		dist, _ := json.Marshal(map[string]string{"tarball": r.self + pin.TarballPath, "integrity": pin.IntegrityString()})
		versions[pin.Version] = npmManifest(v, dist, pin)
		if latest == "" || compareSemver(pin.Version, latest) > 0 {
			latest = pin.Version
		}
	}
	out := map[string]any{"name": name, "versions": versions, "dist-tags": map[string]string{}}
	if latest != "" {
		out["dist-tags"] = map[string]string{"latest": latest}
	}
	if len(doc.Modified) > 0 {
		out["modified"] = doc.Modified
	}
	return json.Marshal(out)
}

// compareSemver orders versions by major.minor.patch numerically, a
// prerelease before its release, prereleases by their text.
func compareSemver(a, b string) int {
	split := func(v string) ([3]int, string) {
		v, _, _ = strings.Cut(v, "+")
		core, pre, _ := strings.Cut(v, "-")
		var n [3]int
		for i, f := range strings.SplitN(core, ".", 3) {
			n[i], _ = strconv.Atoi(f)
		}
		return n, pre
	}
	an, ap := split(a)
	bn, bp := split(b)
	for i := range an {
		if an[i] != bn[i] {
			return an[i] - bn[i]
		}
	}
	switch {
	case ap == bp:
		return strings.Compare(a, b)
	case ap == "":
		return 1
	case bp == "":
		return -1
	}
	return strings.Compare(ap, bp)
}
