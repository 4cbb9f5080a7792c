package broker

import (
	"bytes"
	"context"
	"net/http"
	"net/url"
	"strings"

	"github.com/moat-sandbox/moat/audit"
)

// ToolsPathPrefix is where the broker hands requests to Config.Tools, the
// tool gateway (broker/tools): MCP streamable HTTP at /mcp/<name>.
const ToolsPathPrefix = "/mcp/"

// accountedTools is a tool gateway that shares the run's accounting with
// the broker (broker/tools.Handler): its records go through the broker's
// journal path, so that audit.max_bytes bounds the broker's and the
// gateway's records together (a tool.requested or tool.refused past it is
// not written, and ends the run as an inference record would), and its
// refusals count in the broker's refusal count, which
// inference.max_refusals caps for the whole run.
type accountedTools interface {
	UseAccount(appendRec func(audit.Record) ([]byte, bool), refusal func() (n, limit int64))
}

// runStateTools is a tool gateway that shares the run's fatal event with
// the broker both ways (broker/tools.Handler): no road goes on after
// another's fatal event.
type runStateTools interface {
	UseRunState(failed func() error, fatal func(reason string, err error))
}

// shareAccount gives Config.Tools the run's accounting and state when it
// takes them.
func (b *Broker) shareAccount() {
	if t, ok := b.cfg.Tools.(accountedTools); ok {
		t.UseAccount(b.append, b.countRefusal)
	}
	if t, ok := b.cfg.Tools.(runStateTools); ok {
		t.UseRunState(b.Failed, func(reason string, err error) { b.fatal(Reason(reason), err) })
	}
}

// countRefusal counts one refusal of the run: n is the count with it,
// limit inference.max_refusals.
func (b *Broker) countRefusal() (n, limit int64) { return b.refusals.Add(1), b.maxRefusals }

type attributionKey struct{}

// AttributionFrom returns the attribution of the connection a request to
// the tool gateway arrived on, resolved by the broker as for inference.
func AttributionFrom(ctx context.Context) (audit.Attribution, bool) {
	a, ok := ctx.Value(attributionKey{}).(audit.Attribution)
	return a, ok
}

// serveTools hands one request, framed by the strict front, to the tool
// gateway as an http.Request, and writes its answer (buffered; the
// gateway never streams) with Content-Length.
func (b *Broker) serveTools(x *exchange, req *request) bool {
	hdr := http.Header{}
	for _, f := range req.header {
		hdr.Add(f.name, f.value)
	}
	ctx := context.WithValue(b.ctx, attributionKey{}, b.attribute(x.w.c))
	r, err := http.NewRequestWithContext(ctx, req.method, "http://127.0.0.1"+req.path, bytes.NewReader(req.body))
	if err != nil {
		return b.refuse(x, refuse(ReasonPathNotAllowed, 404, "path %s is not served", quote(req.path)))
	}
	r.URL = &url.URL{Path: req.path}
	r.RequestURI = req.path
	r.Header = hdr
	r.ContentLength = int64(len(req.body))
	rw := &bufferedResponse{header: http.Header{}}
	b.cfg.Tools.ServeHTTP(rw, r)
	if rw.status == 0 {
		rw.status = http.StatusOK
	}
	var out [][2]string
	for k, vs := range rw.header {
		if strings.EqualFold(k, "Content-Length") || strings.EqualFold(k, "Connection") {
			continue
		}
		for _, v := range vs {
			out = append(out, [2]string{k, v})
		}
	}
	x.status = rw.status
	keep := !req.close && rw.status < 400
	if err := writeFull(x.w.bw, rw.status, out, rw.body.Bytes(), !keep); err != nil {
		return false
	}
	return keep
}

// bufferedResponse is the http.ResponseWriter serveTools gives the
// gateway.
type bufferedResponse struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *bufferedResponse) Header() http.Header { return r.header }

func (r *bufferedResponse) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

func (r *bufferedResponse) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(p)
}

// NewReflectionGuard is the broker's credential reflection guard for the
// other roads through the door (the tool gateway): it reports whether
// data carries any of creds, raw or in any form the scanner decodes
// (scan.go). A scan that fails counts as a hit, so that what cannot be
// checked is withheld.
func NewReflectionGuard(creds []string) func([]byte) bool {
	var ps []*pattern
	for _, c := range creds {
		if c != "" {
			ps = append(ps, newPattern(c))
		}
	}
	return func(data []byte) bool {
		for _, p := range ps {
			if hit, err := scanBody(p, data); hit || err != nil {
				return true
			}
		}
		return false
	}
}
