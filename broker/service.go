package broker

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/broker/wire"
	"github.com/moat-sandbox/moat/internal/netguard"
	"github.com/moat-sandbox/moat/policy"
)

// Brokered services (egress.services, issue 13 item 2). The workload
// speaks plain HTTP/1.1 to http://127.0.0.1:PORT/svc/<name>/<path>; the
// request goes through the same strict front as inference (front.go), with
// three additions that real clients (git's smart HTTP) need and that only
// paths under ServicesPathPrefix get: a query string (each parameter
// checked against the grant's query allowlist), a gzip request body
// (decoded under MaxBodyBytes; both digests are journaled) and, as for
// inference, chunked bodies. The broker then checks the method and the
// path against the grant, adds the grant's credential (which never enters
// the sandbox), journals service.requested durably, sends the request
// over TLS through the SSRF guard's dialer (ServicesConfig.Dial), never
// follows a redirect (a 3xx with a Location is refused: the workload gets
// 502 service_redirect and the journal service.failed), scans the answer
// for every credential moat holds (a reflection ends the run, as for a
// provider) and journals service.completed.
const ServicesPathPrefix = "/svc/"

// Limits of a brokered service request.
const (
	// ServiceTimeout bounds one service request, from sending it to the
	// last byte of its answer.
	ServiceTimeout = 10 * time.Minute
	// maxServiceQueryParams caps the parameters of one query string.
	maxServiceQueryParams = 16
)

// Reasons of service.refused and service.failed records.
const (
	ReasonServiceUnknown      Reason = "service_unknown"           // /svc/<name> names no granted service
	ReasonServicePath         Reason = "service_path_not_allowed"  // the grant's paths do not list the path
	ReasonServiceQuery        Reason = "service_query_not_allowed" // a query parameter or value the grant does not list
	ReasonServiceHeader       Reason = "service_header_refused"    // a credential or Moat-* header from the workload
	ReasonServiceEncoding     Reason = "service_body_encoding"     // a request body coding other than gzip, or corrupt gzip
	ReasonServiceUnconfigured Reason = "service_unconfigured"      // the grant's credential is not in moat's environment
	ReasonServiceRedirect     Reason = "service_redirect"          // the service answered with a redirect; never followed
	ReasonServiceAddress      Reason = "service_address_refused"   // the SSRF guard refused the service's address
)

// ServicesConfig configures the broker's service route.
type ServicesConfig struct {
	// Grants are the policy's egress.services (validated). Methods, paths
	// and query are checked by the grant's own AllowsMethod, AllowsPath
	// and AllowsQuery; Auth says how the credential is added: "bearer"
	// (Authorization: Bearer <cred>), "basic" (Authorization: Basic, the
	// credential holding user:password) or "header:NAME" (NAME: <cred>).
	Grants []policy.EgressService
	// Credentials maps a grant's name to its secret, read from moat's
	// environment (credential_env). A grant with an auth and no credential
	// is refused at request time (service_unconfigured).
	Credentials map[string]string
	// Guarded are every other credential moat holds for the run (the
	// providers', the tool servers'): a service answer that carries any of
	// them, or its own, is withheld and ends the run.
	Guarded []string
	// Dial is the SSRF guard's dialer: it resolves the name once, refuses
	// every address that is not global unicast and dials the checked
	// address. It is required; there is no unguarded default.
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
	// RootCAs verifies the services' certificates; nil is the system's
	// roots plus the grant's ca_file.
	RootCAs *x509.CertPool
}

// Services is the broker's service route (Config.Services).
type Services struct {
	byName  map[string]*service
	guarded []*pattern
}

type service struct {
	*policy.EgressService
	base    *url.URL
	authKey string // the header that carries the credential, "" for none
	authVal string // its value
	client  *http.Client
	used    atomic.Int64
}

// NewServices checks cfg and builds the route.
func NewServices(cfg ServicesConfig) (*Services, error) {
	if cfg.Dial == nil {
		return nil, errors.New("moat: broker: services: no guarded dialer (the SSRF guard is required)")
	}
	s := &Services{byName: map[string]*service{}}
	var secrets []string
	for _, c := range cfg.Guarded {
		if c != "" {
			secrets = append(secrets, c)
		}
	}
	for i := range cfg.Grants {
		g := &cfg.Grants[i]
		sv, extra, err := newService(g, cfg.Credentials[g.Name], &cfg)
		if err != nil {
			return nil, err
		}
		if _, dup := s.byName[g.Name]; dup {
			return nil, fmt.Errorf("moat: broker: service %q is granted twice", g.Name)
		}
		s.byName[g.Name] = sv
		secrets = append(secrets, extra...)
	}
	slices.Sort(secrets)
	for _, c := range slices.Compact(secrets) {
		s.guarded = append(s.guarded, newPattern(c))
	}
	return s, nil
}

func newService(g *policy.EgressService, cred string, cfg *ServicesConfig) (*service, []string, error) {
	if g.Name == "" || !isToken(g.Name) || strings.ContainsAny(g.Name, "%/") {
		return nil, nil, fmt.Errorf("moat: broker: service name %q must be a token usable as one path segment", g.Name)
	}
	u, err := url.Parse(strings.TrimSuffix(g.BaseURL, "/"))
	if err != nil {
		return nil, nil, fmt.Errorf("moat: broker: service %q: base_url: %w", g.Name, err)
	}
	if u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.RawPath != "" {
		return nil, nil, fmt.Errorf("moat: broker: service %q: base_url %q must be https://host[:port][/prefix] without credentials, query, fragment or escapes", g.Name, g.BaseURL)
	}
	sv := &service{EgressService: g, base: u}
	var secrets []string
	switch {
	case g.Auth == "":
	case cred == "":
		// Refused at request time, naming the variable.
	case g.Auth == policy.AuthBearer:
		sv.authKey, sv.authVal = "Authorization", "Bearer "+cred
	case g.Auth == policy.AuthBasic:
		_, pass, ok := strings.Cut(cred, ":")
		if !ok {
			return nil, nil, fmt.Errorf("moat: broker: service %q: auth basic: %s must hold user:password", g.Name, g.CredentialEnv)
		}
		enc := base64.StdEncoding.EncodeToString([]byte(cred))
		sv.authKey, sv.authVal = "Authorization", "Basic "+enc
		secrets = append(secrets, pass, enc)
	case g.AuthHeader() != "" && isToken(g.AuthHeader()):
		sv.authKey, sv.authVal = http.CanonicalHeaderKey(g.AuthHeader()), cred
	default:
		return nil, nil, fmt.Errorf("moat: broker: service %q: auth %q: want bearer, basic or header:NAME", g.Name, g.Auth)
	}
	if cred != "" {
		if g.Auth == "" {
			return nil, nil, fmt.Errorf("moat: broker: service %q has a credential but no auth", g.Name)
		}
		if err := checkCredential(g.Name, cred); err != nil {
			return nil, nil, err
		}
		secrets = append(secrets, cred)
	}
	for _, s := range secrets {
		if len(s) < MinCredentialBytes {
			return nil, nil, fmt.Errorf("moat: broker: service %q: the credential's password part is shorter than %d bytes", g.Name, MinCredentialBytes)
		}
	}
	roots := cfg.RootCAs
	if roots == nil {
		if roots, err = x509.SystemCertPool(); err != nil || roots == nil {
			roots = x509.NewCertPool()
		}
		if g.CAFile != "" {
			pem, err := readCapped(g.CAFile, maxCAFileBytes)
			if err != nil {
				return nil, nil, fmt.Errorf("moat: broker: service %q: ca_file: %w", g.Name, err)
			}
			if !roots.AppendCertsFromPEM(pem) {
				return nil, nil, fmt.Errorf("moat: broker: service %q: ca_file %q holds no PEM certificate", g.Name, g.CAFile)
			}
		}
	}
	sv.client = upstreamClient(cfg.Dial, roots, ServiceTimeout)
	return sv, secrets, nil
}

// isQueryText reports bytes that need no escaping in a query (RFC 3986
// unreserved): the allowlist compares exact bytes, so no encoded form is
// accepted.
func isQueryText(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '.', c == '_', c == '~':
		default:
			return false
		}
	}
	return true
}

// splitServiceTarget is the front's hook for targets under
// ServicesPathPrefix: it separates the query, which the service's grant
// checks. A fragment, or a "?" with nothing after it, stays in the path,
// where checkPath refuses it.
func splitServiceTarget(target string) (path, query string) {
	p, q, ok := strings.Cut(target, "?")
	if !ok || q == "" {
		return target, ""
	}
	return p, q
}

// serviceCoding is the front's hook for Content-Encoding: a request to a
// service may send its body gzip-compressed (git does for large fetch
// negotiations); nothing else is accepted.
func (r *request) serviceCoding(v string) bool {
	if !strings.HasPrefix(r.path, ServicesPathPrefix) || !strings.EqualFold(strings.TrimSpace(v), "gzip") {
		return false
	}
	r.encoding = "gzip"
	return true
}

// checkQuery checks a query against the grant's allowlist.
func (sv *service) checkQuery(q string) *frontError {
	if q == "" {
		return nil
	}
	params := strings.Split(q, "&")
	if len(params) > maxServiceQueryParams {
		return refuse(ReasonServiceQuery, 403, "the query has more than %d parameters", maxServiceQueryParams)
	}
	seen := map[string]bool{}
	for _, p := range params {
		name, val, _ := strings.Cut(p, "=")
		_, ok := sv.Query[name]
		switch {
		case !isQueryText(name) || !isQueryText(val):
			return refuse(ReasonServiceQuery, 403, "query parameter %s holds a byte outside [A-Za-z0-9._~-] (no escapes are accepted)", quote(p))
		case !ok:
			return refuse(ReasonServiceQuery, 403, "query parameter %s is not allowed for service %q%s", quote(name), sv.Name, sv.queryHint())
		case seen[name]:
			return refuse(ReasonServiceQuery, 403, "query parameter %s appears more than once", quote(name))
		case !sv.AllowsQuery(name, val):
			return refuse(ReasonServiceQuery, 403, "query %s=%s is not allowed for service %q%s", quote(name), quote(val), sv.Name, sv.queryHint())
		}
		seen[name] = true
	}
	return nil
}

func (sv *service) queryHint() string {
	if len(sv.Query) == 0 {
		return " (the grant allows no query)"
	}
	var qs []string
	for n, vs := range sv.Query {
		qs = append(qs, n+"="+strings.Join(vs, "|"))
	}
	slices.Sort(qs)
	return " (the grant allows " + strings.Join(qs, ", ") + ")"
}

// Request headers of a service request. A workload header is forwarded
// only when it is in serviceForwarded; the ones in serviceRefused refuse
// the request (the credential is moat's to add); the others (Host,
// framing, hop-by-hop, Accept-Encoding and unknown ones) are dropped.
var (
	serviceForwarded = []string{"accept", "accept-language", "content-type", "git-protocol", "user-agent"}
	serviceRefused   = []string{"authorization", "proxy-authorization", "cookie"}
)

// serviceReturned are the answer's headers given back to the workload.
var serviceReturned = []string{"Cache-Control", "Content-Type", "Etag", "Expires", "Last-Modified", "Pragma"}

// serviceHeaders picks the headers to forward and their digest.
func (sv *service) serviceHeaders(req *request) (http.Header, string, *frontError) {
	h := http.Header{}
	var lines []string
	for _, f := range req.header {
		switch {
		case slices.Contains(serviceRefused, f.name), strings.HasPrefix(f.name, "moat-"),
			sv.authKey != "" && strings.EqualFold(f.name, sv.authKey):
			return nil, "", refuse(ReasonServiceHeader, 400, "header %s is not accepted: moat adds service %q's credential itself", quote(f.name), sv.Name)
		case slices.Contains(serviceForwarded, f.name):
			h.Set(f.name, f.value)
			lines = append(lines, f.name+": "+f.value+"\n")
		}
	}
	slices.Sort(lines)
	sum := sha256.Sum256([]byte(strings.Join(lines, "")))
	return h, hex.EncodeToString(sum[:]), nil
}

// serveService serves one request under ServicesPathPrefix and reports
// whether the connection may be kept.
func (b *Broker) serveService(x *exchange, req *request) bool {
	s := b.cfg.Services
	name, rest, _ := strings.Cut(req.path[len(ServicesPathPrefix):], "/")
	rest = "/" + rest
	x.api, x.endpoint = "service", ServicesPathPrefix+name
	sv := s.byName[name]
	if sv == nil {
		return b.refuseService(x, "", req.method, refuse(ReasonServiceUnknown, 404, "no service %s is granted; the policy's egress.services names %s", quote(name), s.names()))
	}
	if b.failed.Load() {
		return b.refuseService(x, name, req.method, refuse(ReasonRunFailed, 503, "the run was stopped after a fatal event (%s); no further requests are possible", b.fatalReason()))
	}
	if !sv.AllowsMethod(req.method) {
		return b.refuseService(x, name, req.method, refuse(ReasonMethod, 405, "method %s is not allowed for service %q; the grant allows %s", quote(req.method), name, strings.Join(sv.Methods, ", ")))
	}
	if strings.Contains(rest, ";") {
		// No grant names a ';' (policy refuses it in paths), but one under
		// a "/*" tail would pass AllowsPath, and servlet containers strip
		// ";params" from each segment before resolving dot segments: to
		// them "/repo.git/..;/other.git" is "/other.git".
		return b.refuseService(x, name, req.method, refuse(ReasonPathTrick, 400, "';' (path parameters) is not allowed in a service path: servers read \"..;\" as \"..\""))
	}
	if !sv.AllowsPath(rest) {
		return b.refuseService(x, name, req.method, refuse(ReasonServicePath, 403, "path %s is not allowed for service %q; the grant allows %s", quote(rest), name, strings.Join(sv.Paths, ", ")))
	}
	if fe := sv.checkQuery(req.query); fe != nil {
		return b.refuseService(x, name, req.method, fe)
	}
	hdr, hdrSum, fe := sv.serviceHeaders(req)
	if fe != nil {
		return b.refuseService(x, name, req.method, fe)
	}
	if sv.Auth != "" && sv.authKey == "" {
		return b.refuseService(x, name, req.method, refuse(ReasonServiceUnconfigured, 503, "service %q has no credential: the operator must set %s in moat's environment", name, sv.CredentialEnv))
	}
	body := req.body
	rec := audit.ServiceRequested{RequestID: x.id, Service: name, Method: req.method, Path: rest, Query: req.query, HeadersSHA256: hdrSum}
	if req.encoding != "" {
		dec, err := gunzipCapped(body, x.w.charge)
		if err != nil {
			return b.refuseService(x, name, req.method, err)
		}
		esum := sha256.Sum256(body)
		rec.ContentEncoding, rec.EncodedSHA256, rec.EncodedBytes = req.encoding, hex.EncodeToString(esum[:]), int64(len(body))
		body = dec
	}
	bsum := sha256.Sum256(body)
	rec.BodySHA256, rec.BodyBytes = hex.EncodeToString(bsum[:]), int64(len(body))
	rec.Attribution = b.attribution(x)
	if b.cfg.Policy.Inference.RequireAttribution && rec.Attribution.Status != boundary.AttributionResolved {
		return b.refuseService(x, name, req.method, refuse(ReasonUnattributed, 403,
			"the policy requires every request to be attributed to a process, and this connection could not be (%s)", wire.Bound(rec.Attribution.Reason)))
	}
	if !sv.reserve() {
		return b.refuseService(x, name, req.method, refuse(ReasonAllowanceExhausted, 429,
			"service %q's allowance (max_requests %d) is used up for this run", name, sv.MaxRequests))
	}
	if fe := b.holdService(x, name, req.method, rest, req.query, hdrSum, body); fe != nil {
		return b.refuseService(x, name, req.method, fe)
	}
	b.logDecision(x, slog.LevelDebug, decisionAdmitted, "", "")
	line, ok := b.appendStart(rec)
	if !ok {
		return b.serviceFailure(x, 0, ReasonAuditFailure, 503, "the run's audit journal failed, so this request was not sent and no further requests are possible; the run is ending")
	}
	if b.failed.Load() {
		return b.serviceFailure(x, 0, ReasonRunFailed, 503, fmt.Sprintf("the run was stopped after a fatal event (%s); the request was not sent", b.fatalReason()))
	}
	u := *sv.base
	u.Path = strings.TrimSuffix(u.Path, "/") + rest
	u.RawPath, u.RawQuery = "", req.query
	hreq, err := http.NewRequestWithContext(b.ctx, req.method, u.String(), bytes.NewReader(body))
	if err != nil {
		return b.serviceFailure(x, 0, ReasonInternal, 500, "BUG: building the service request: "+err.Error())
	}
	hreq.ContentLength = int64(len(body))
	if len(body) == 0 {
		hreq.Body = http.NoBody
	}
	hreq.Header = hdr
	hreq.Header.Set("Accept-Encoding", "identity")
	hreq.Header.Set(preEffectHeader, base64.StdEncoding.EncodeToString(line))
	if sv.authKey != "" {
		hreq.Header.Set(sv.authKey, sv.authVal)
	}
	resp, err := sv.client.Do(hreq)
	if err != nil {
		if s.reflects([]byte(err.Error())) {
			return b.withholdService(x, 0, "an upstream error")
		}
		if r := netguard.ReasonOf(err); r != "" && r != netguard.ReasonDialFailed {
			return b.serviceFailure(x, 0, ReasonServiceAddress, 502, fmt.Sprintf("service %q was not dialled: its address was refused (%s); moat dials only global unicast addresses", name, r))
		}
		return b.serviceFailure(x, 0, ReasonUpstreamError, 502, fmt.Sprintf("service %q could not be reached: %s", name, upstreamErrText(err)))
	}
	defer resp.Body.Close()
	if s.headReflects(resp.Status, resp.Header) {
		return b.withholdService(x, resp.StatusCode, "the response head")
	}
	if resp.StatusCode >= 300 && resp.StatusCode < 400 && resp.StatusCode != http.StatusNotModified {
		return b.serviceFailure(x, resp.StatusCode, ReasonServiceRedirect, 502, fmt.Sprintf("service %q answered with a redirect (HTTP %d); moat neither follows nor passes on redirects", name, resp.StatusCode))
	}
	rbody, _, err := decodeBody(resp)
	if err != nil {
		return b.serviceFailure(x, resp.StatusCode, ReasonUpstreamEncoding, 502, fmt.Sprintf("service %q sent a response moat cannot inspect: %s", name, upstreamErrText(err)))
	}
	x.w.charge.deadline = time.Now().Add(b.readTimeout)
	data, err := b.readResponse(x.w, rbody)
	switch {
	case errors.As(err, &fe):
		return b.serviceFailure(x, resp.StatusCode, fe.Code, 502, fe.Msg)
	case err != nil:
		return b.serviceFailure(x, resp.StatusCode, ReasonUpstreamError, 502, fmt.Sprintf("reading the answer of service %q failed: %s", name, upstreamErrText(err)))
	}
	if s.reflects(data) {
		return b.withholdService(x, resp.StatusCode, "the response body")
	}
	out := [][2]string{{"Moat-Request-Id", x.id}}
	for _, n := range serviceReturned {
		if v := resp.Header.Get(n); v != "" {
			out = append(out, [2]string{n, v})
		}
	}
	rsum := sha256.Sum256(data)
	_, wait, ok := b.appendAsync(audit.ServiceCompleted{RequestID: x.id, Status: resp.StatusCode,
		BodySHA256: hex.EncodeToString(rsum[:]), BodyBytes: int64(len(data))}, true)
	if !ok {
		return b.serviceFailure(x, resp.StatusCode, ReasonAuditFailure, 503, "the run's audit journal failed; the answer is withheld and the run is ending")
	}
	x.status = resp.StatusCode
	werr := writeFull(x.w.bw, resp.StatusCode, out, data, req.close)
	b.syncSoon(wait)
	b.logDecision(x, slog.LevelInfo, decisionCompleted, "", "")
	return werr == nil
}

func (sv *service) reserve() bool {
	for {
		n := sv.used.Load()
		if n >= int64(sv.MaxRequests) {
			return false
		}
		if sv.used.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

func (s *Services) names() string {
	var ns []string
	for n := range s.byName {
		ns = append(ns, n)
	}
	if len(ns) == 0 {
		return "none"
	}
	slices.Sort(ns)
	return strings.Join(ns, ", ")
}

// reflects reports whether data carries any credential moat holds; a scan
// that fails counts as a hit.
func (s *Services) reflects(data []byte) bool {
	for _, p := range s.guarded {
		if hit, err := scanBody(p, data); hit || err != nil {
			return true
		}
	}
	return false
}

func (s *Services) headReflects(status string, h http.Header) bool {
	for _, p := range s.guarded {
		if headReflects(p, status, h) {
			return true
		}
	}
	return false
}

// gunzipCapped decodes a gzip request body under MaxBodyBytes, charging
// the decoded bytes to the request's memory share. A body that is not
// gzip, is corrupt or ends early is refused: nothing but the whole
// decoded body is ever sent.
func gunzipCapped(body []byte, ch *charge) ([]byte, *frontError) {
	zr, err := gzip.NewReader(bytes.NewReader(body))
	if err != nil {
		return nil, refuse(ReasonServiceEncoding, 400, "the request body is not valid gzip")
	}
	out, err := io.ReadAll(io.LimitReader(zr, MaxBodyBytes+1))
	switch {
	case err != nil:
		return nil, refuse(ReasonServiceEncoding, 400, "the gzip request body is corrupt or ends early")
	case len(out) > MaxBodyBytes:
		return nil, refuse(ReasonBodyTooLarge, 413, "the decoded request body is over the limit of %d bytes", MaxBodyBytes)
	}
	if ch != nil {
		if err := ch.takeRaw(int64(len(out))); err != nil {
			var fe *frontError
			if errors.As(err, &fe) {
				return nil, fe
			}
			return nil, refuse(ReasonBusy, 503, "the broker is busy with other large requests; retry later")
		}
	}
	return out, nil
}

// appendStart appends a record that starts something (a request, a
// refusal): none is written once the broker's records reached
// audit.max_bytes.
func (b *Broker) appendStart(rec audit.Record) ([]byte, bool) {
	if b.journal.Load() && b.written.Load() >= b.maxBytes {
		b.journalFull()
		return nil, false
	}
	return b.append(rec)
}

// refuseService is refuse for a service request: a service.refused record,
// counted with every refusal of the run against inference.max_refusals.
func (b *Broker) refuseService(x *exchange, name, method string, fe *frontError) bool {
	msg := wire.BoundTo(refusalPrefix+fe.Msg, MaxDetailBytes)
	x.status = fe.Status
	switch n := b.refusals.Add(1); {
	case n <= b.maxRefusals+1:
		b.logDecision(x, slog.LevelWarn, decisionRefused, fe.Code, msg)
		b.appendStart(audit.ServiceRefused{RequestID: x.id, Service: name, Method: wire.Bound(method), Reason: string(fe.Code), Detail: msg, Attribution: b.attribution(x)})
		if n == b.maxRefusals+1 {
			b.fatal(ReasonRefusalLimit, fmt.Errorf("the broker refused %d requests, more than the policy's inference.max_refusals (%d); the run was ended so that refusals cannot fill the journal: read the refusals in the journal and fix the workload's requests, or raise inference.max_refusals",
				n, b.maxRefusals))
		}
	case n == b.maxRefusals+2:
		b.logDecision(x, slog.LevelWarn, decisionRefused, fe.Code, "refusals past inference.max_refusals are answered but neither journaled nor logged")
	}
	writeError(x.w.bw, x.api, fe.Status, fe.Code, msg, x.id)
	return false
}

// serviceFailure closes a journaled service.requested with service.failed
// and answers the workload; the connection is then closed.
func (b *Broker) serviceFailure(x *exchange, status int, reason Reason, answer int, msg string) bool {
	detail := wire.BoundTo(failurePrefix(reason)+msg, MaxDetailBytes)
	x.status = answer
	b.append(audit.ServiceFailed{RequestID: x.id, Status: status, Reason: string(reason), Detail: detail})
	b.logDecision(x, slog.LevelWarn, decisionFailed, reason, detail)
	writeError(x.w.bw, x.api, answer, reason, detail, x.id)
	return false
}

// withholdService handles an answer that carried a credential: the run is
// stopped first (so no other request leaves), then the failure journaled.
func (b *Broker) withholdService(x *exchange, status int, where string) bool {
	b.fatal(ReasonCredentialReflect, fmt.Errorf("a service's answer contained a credential of the run (in %s)", where))
	return b.serviceFailure(x, status, ReasonCredentialReflect, 502,
		"the service's answer was withheld: it contained a credential of the run; the run is being cancelled")
}
