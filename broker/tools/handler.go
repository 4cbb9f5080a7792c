package tools

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/confirmation"
	"github.com/moat-sandbox/moat/internal/strictjson"
	"github.com/moat-sandbox/moat/policy"
)

// methodDiscover is the stateless protocol's probe (SEP-2575).
const methodDiscover = "server/discover"

// PathPrefix is where the tool servers are served: PathPrefix + name.
const PathPrefix = "/mcp/"

// maxDetailBytes caps a refusal's detail in the journal.
const maxDetailBytes = 4 << 10

// Journal is where records go. *audit.Writer implements it: Append returns
// once the line is durable.
type Journal interface {
	Append(audit.Record) ([]byte, error)
}

// Upstream is a connected tool server.
type Upstream interface {
	ListTools(ctx context.Context) ([]*sdk.Tool, error)
	// CallTool sends args, canonical JSON of an object, as
	// params.arguments, byte for byte.
	CallTool(ctx context.Context, tool string, args []byte) (*sdk.CallToolResult, error)
}

// Config configures a Handler.
type Config struct {
	Policy  *policy.Policy // validated; its tools.mcp entries are the servers
	Journal Journal
	// Servers maps each tools.mcp name to its connected server. An entry
	// without one is refused at request time (server_error).
	Servers map[string]Upstream
	// Attribute resolves the calling process of a request (the broker's
	// Attributor on the connection, see ContextWithAttribution); nil:
	// "unavailable".
	Attribute func(*http.Request) audit.Attribution
	// Reflects reports whether data carries a credential moat holds (the
	// inference broker's scanner); nil is refused by New.
	Reflects func(data []byte) bool
	// OnFatal is called once when the run must end: a reflected
	// credential, a journal failure, the refusal limit.
	OnFatal func(reason string, err error)
	Log     *slog.Logger
}

// Handler serves /mcp/<name>. It is an http.Handler so that any HTTP/1.1
// front can serve it: the broker's own strict front in a run, net/http in
// tests.
type Handler struct {
	cfg      Config
	servers  map[string]*server
	log      *slog.Logger
	failed   atomic.Bool
	refusals atomic.Int64
	// The run's accounting, when the broker shares it (UseAccount):
	// records through the broker's journal path, refusals in its count.
	acctAppend  func(audit.Record) ([]byte, bool)
	acctRefusal func() (n, limit int64)
	fatalMu     sync.Mutex
	fatalErr    error // guarded by fatalMu
	// The run's state, when the broker shares it (UseRunState).
	runFailed func() error
	runFatal  func(reason string, err error)
	// hold, when set (UseApprovals), holds a call for an operator's
	// approval before its pre-effect record.
	hold func(ctx context.Context, callID, server, tool string, args []byte) (reason, msg string)
}

type server struct {
	entry *policy.MCPServer
	up    Upstream
	used  atomic.Int64 // reserved calls
}

// New checks cfg and builds a Handler.
func New(cfg Config) (*Handler, error) {
	if cfg.Policy == nil || cfg.Journal == nil || cfg.Reflects == nil {
		return nil, errors.New("moat: tools: BUG: a policy, a journal and a reflection guard are required")
	}
	h := &Handler{cfg: cfg, servers: map[string]*server{}, log: cfg.Log}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	for i := range cfg.Policy.Tools.MCP {
		e := &cfg.Policy.Tools.MCP[i]
		h.servers[e.Name] = &server{entry: e, up: cfg.Servers[e.Name]}
	}
	for name := range cfg.Servers {
		if h.servers[name] == nil {
			return nil, fmt.Errorf("moat: tools: BUG: server %q is not in the policy", name)
		}
	}
	return h, nil
}

type attrKey struct{}

// ContextWithAttribution carries the caller's attribution, resolved by
// the front from the connection, to the handler.
func ContextWithAttribution(ctx context.Context, a audit.Attribution) context.Context {
	return context.WithValue(ctx, attrKey{}, a)
}

func (h *Handler) attribute(r *http.Request) audit.Attribution {
	if a, ok := r.Context().Value(attrKey{}).(audit.Attribution); ok {
		return a
	}
	if h.cfg.Attribute != nil {
		return h.cfg.Attribute(r)
	}
	return audit.Attribution{Status: confirmation.AttributionUnavailable, Reason: "no attributor configured"}
}

// Failed reports the fatal event that stopped all tool calls, or nil.
func (h *Handler) Failed() error {
	h.fatalMu.Lock()
	defer h.fatalMu.Unlock()
	return h.fatalErr
}

func (h *Handler) fatal(reason string, err error) {
	h.fatalMu.Lock()
	first := h.fatalErr == nil
	if first {
		h.fatalErr = fmt.Errorf("%s: %w", reason, err)
		h.failed.Store(true)
	}
	h.fatalMu.Unlock()
	if first {
		h.log.Error("moat.tools fatal", "reason", reason, "error", err.Error())
		if h.runFatal != nil {
			h.runFatal(reason, err)
		}
		if h.cfg.OnFatal != nil {
			h.cfg.OnFatal(reason, err)
		}
	}
}

// append writes rec; a failure ends the run.
func (h *Handler) append(rec audit.Record) bool {
	_, ok := h.appendLine(rec)
	return ok
}

// UseAccount makes the handler use the run's accounting (package broker
// calls it from New, before serving): appendRec writes a record through
// the broker's journal path, which applies audit.max_bytes to every
// record of the run and ends the run itself when the journal fails or is
// full (false: not written); refusal counts one refusal in the run's
// count and returns it with inference.max_refusals. Without it the
// handler journals to Config.Journal and counts its own refusals.
func (h *Handler) UseAccount(appendRec func(audit.Record) ([]byte, bool), refusal func() (n, limit int64)) {
	h.acctAppend, h.acctRefusal = appendRec, refusal
}

// UseRunState ties the gateway to the rest of the run (package broker
// calls it from New, before serving): failed reports the run's fatal
// event on another road (the broker's), after which no tool call is
// made; fatal is told the gateway's own fatal event, so that the broker's
// roads stop too. Both are needed: otherwise each road stopped only
// itself, and the others went on until the run was torn down.
func (h *Handler) UseRunState(failed func() error, fatal func(reason string, err error)) {
	h.runFailed, h.runFatal = failed, fatal
}

// UseApprovals makes the handler hold calls for approval (package broker
// calls it from New, before serving, when the policy has approval
// rules): hold blocks until the call is decided and returns "" when it
// may be made, else the refusal's reason and message (without prefix).
func (h *Handler) UseApprovals(hold func(ctx context.Context, callID, server, tool string, args []byte) (reason, msg string)) {
	h.hold = hold
}

// appendLine writes rec and returns its durable line.
func (h *Handler) appendLine(rec audit.Record) ([]byte, bool) {
	if h.acctAppend != nil {
		line, ok := h.acctAppend(rec)
		if !ok {
			// The broker ended the run (its journal failed or is full):
			// the gateway stops too, without a second fatal event.
			h.fatalMu.Lock()
			if h.fatalErr == nil {
				h.fatalErr = errors.New("the run's journal failed or reached audit.max_bytes")
				h.failed.Store(true)
			}
			h.fatalMu.Unlock()
		}
		return line, ok
	}
	line, err := h.cfg.Journal.Append(rec)
	if err != nil {
		h.fatal(ReasonAuditFailure, err)
		return nil, false
	}
	return line, true
}

func newCallID() string {
	var b [12]byte
	rand.Read(b[:])
	return "moatcall_" + hex.EncodeToString(b[:])
}

// ServeHTTP serves one request to /mcp/<name>.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := newCallID()
	name, _ := strings.CutPrefix(r.URL.Path, PathPrefix)
	s := h.servers[name]
	if s == nil {
		h.refuse(w, r, http.StatusNotFound, nil, id, name, refused(ReasonServerNotFound, CodeRefused,
			"no tool server is named %s here; the policy's servers are at %s", quote(name), strings.Join(h.paths(), ", ")))
		return
	}
	switch {
	case r.Method == http.MethodGet || r.Method == http.MethodDelete:
		// The transport's own probes: a client asks for a server stream
		// (GET) or ends its session (DELETE). No stream and no session
		// are offered, which the transport says with 405; nothing was
		// asked of a server, so this is answered, not journaled.
		w.Header().Set("Allow", "POST")
		h.log.Debug("moat.tools transport probe", "server", name, "method", r.Method)
		body, _ := errorBody(nil, CodeInvalidRequest, ReasonHTTPMethod, "moat: no server stream and no session are offered; POST one JSON-RPC message per request")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusMethodNotAllowed)
		w.Write(body)
		return
	case r.Method != http.MethodPost:
		w.Header().Set("Allow", "POST")
		h.refuse(w, r, http.StatusMethodNotAllowed, nil, id, name, refused(ReasonHTTPMethod, CodeInvalidRequest,
			"HTTP %s is not served at %s: POST one JSON-RPC message per request", quote(r.Method), r.URL.Path))
		return
	case !isJSON(r.Header.Get("Content-Type")):
		h.refuse(w, r, http.StatusUnsupportedMediaType, nil, id, name, refused(ReasonContentType, CodeInvalidRequest,
			"Content-Type must be application/json, got %s", quote(r.Header.Get("Content-Type"))))
		return
	}
	for k := range r.Header {
		if strings.HasPrefix(strings.ToLower(k), "moat-") {
			h.refuse(w, r, http.StatusBadRequest, nil, id, name, refused(ReasonMoatHeader, CodeInvalidRequest,
				"header %s is reserved for moat and may not be sent", quote(k)))
			return
		}
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, int64(MaxBodyBytes)+1))
	if err != nil {
		return // the connection is gone
	}
	if len(body) > MaxBodyBytes {
		h.refuse(w, r, http.StatusRequestEntityTooLarge, nil, id, name, refused(ReasonBodyTooLarge, CodeInvalidRequest,
			"the body is over %d bytes", MaxBodyBytes))
		return
	}
	m, rf := ParseMessage(body)
	if rf == nil {
		rf = checkMethod(m)
	}
	if rf != nil && m != nil && m.Method == methodDiscover && m.ID != nil {
		// The SDKs' first probe of the stateless protocol: the answer
		// "method not found" makes them fall back to initialize. Like
		// the transport probes it is answered, not journaled.
		h.log.Debug("moat.tools protocol probe", "server", name, "method", m.Method)
		h.replyError(w, m.ID, CodeMethodNotFound, ReasonMethodNotAllowed, "moat: server/discover is not served; use initialize")
		return
	}
	if rf != nil {
		var rid []byte
		if m != nil {
			rid = m.ID
			if rf.Method == "" && checkMethod(m) == nil {
				rf.Method = m.Method
			}
		}
		h.refuse(w, r, http.StatusOK, rid, id, name, rf)
		return
	}
	switch m.Method {
	case MethodInitialized, MethodCancelled:
		// A cancellation cannot reach a call already sent (each call
		// has its own timeout); both are acknowledged.
		w.WriteHeader(http.StatusAccepted)
	case MethodInitialize:
		h.reply(w, m.ID, map[string]any{
			"protocolVersion": negotiate(m.Params),
			"capabilities":    map[string]any{"tools": map[string]any{}},
			"serverInfo":      map[string]any{"name": "moat/" + name, "version": "1"},
		})
	case MethodToolsList:
		h.list(w, r, s, m, id)
	case MethodToolsCall:
		h.call(w, r, s, m, id)
	default:
		h.refuse(w, r, http.StatusOK, m.ID, id, name, refused(ReasonMethodNotAllowed, CodeInternal, "BUG: admitted method %s has no handler", quote(m.Method)))
	}
}

func isJSON(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	return strings.EqualFold(strings.TrimSpace(mt), "application/json")
}

func (h *Handler) paths() []string {
	var out []string
	for i := range h.cfg.Policy.Tools.MCP {
		out = append(out, PathPrefix+h.cfg.Policy.Tools.MCP[i].Name)
	}
	if len(out) == 0 {
		return []string{"nowhere (the policy names no tool server)"}
	}
	return out
}

func (h *Handler) list(w http.ResponseWriter, r *http.Request, s *server, m *Message, id string) {
	for k := range m.Params {
		if k != "_meta" {
			rf := refused(ReasonBadParams, CodeInvalidParams, "tools/list takes no %s here: the broker answers with every allowed tool at once", quote(k))
			rf.Method = MethodToolsList
			h.refuse(w, r, http.StatusOK, m.ID, id, s.entry.Name, rf)
			return
		}
	}
	if rf := h.ready(s, MethodToolsList); rf != nil {
		h.refuse(w, r, http.StatusOK, m.ID, id, s.entry.Name, rf)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Duration(s.entry.Timeout))
	defer cancel()
	all, err := s.up.ListTools(ctx)
	if err != nil && h.cfg.Reflects([]byte(err.Error())) {
		h.fatal(ReasonReflected, fmt.Errorf("tool server %q answered tools/list with an error that carries a credential moat holds; withheld", s.entry.Name))
		h.replyError(w, m.ID, CodeRefused, ReasonReflected, "moat: the tool server's error was withheld: it carried a credential; the run is ended")
		return
	}
	if err != nil {
		h.log.Warn("moat.tools list failed", "server", s.entry.Name, "error", err.Error())
		h.replyError(w, m.ID, CodeInternal, ReasonServerError, fmt.Sprintf("moat: tool server %q could not list its tools: %s", s.entry.Name, bound(err.Error())))
		return
	}
	allowed := []*sdk.Tool{}
	for _, t := range all {
		if t != nil && s.entry.AllowsTool(t.Name) {
			allowed = append(allowed, t)
		}
	}
	res, err := canonical(&sdk.ListToolsResult{Tools: allowed})
	if err != nil {
		h.replyError(w, m.ID, CodeInternal, ReasonServerError, fmt.Sprintf("moat: tool server %q listed tools moat cannot encode: %s", s.entry.Name, bound(err.Error())))
		return
	}
	if h.cfg.Reflects(res) {
		h.fatal(ReasonReflected, fmt.Errorf("tool server %q listed tools that carry a credential moat holds; withheld", s.entry.Name))
		h.replyError(w, m.ID, CodeRefused, ReasonReflected, "moat: the tool list was withheld: it carried a credential; the run is ended")
		return
	}
	h.replyRaw(w, m.ID, res)
}

// ready refuses when the run failed or the server is not connected.
func (h *Handler) ready(s *server, method string) *Refusal {
	if h.failed.Load() {
		r := refused(ReasonRunFailed, CodeRefused, "the run was stopped after a fatal event (%v); no further tool calls are possible", h.Failed())
		r.Method = method
		return r
	}
	if h.runFailed != nil {
		if err := h.runFailed(); err != nil {
			r := refused(ReasonRunFailed, CodeRefused, "the run was stopped after a fatal event (%v); no further tool calls are possible", err)
			r.Method = method
			return r
		}
	}
	if s.up == nil {
		r := refused(ReasonServerError, CodeRefused, "tool server %q is not running", s.entry.Name)
		r.Method = method
		return r
	}
	return nil
}

func (h *Handler) call(w http.ResponseWriter, r *http.Request, s *server, m *Message, id string) {
	name := s.entry.Name
	if rf := h.ready(s, MethodToolsCall); rf != nil {
		h.refuse(w, r, http.StatusOK, m.ID, id, name, rf)
		return
	}
	c, rf := ParseCall(m.Params, s.entry)
	if rf != nil {
		h.refuse(w, r, http.StatusOK, m.ID, id, name, rf)
		return
	}
	att := h.attribute(r)
	if h.cfg.Policy.Inference.RequireAttribution && att.Status != confirmation.AttributionResolved {
		rf := refused(ReasonUnattributed, CodeRefused, "the policy requires every call to be attributed to a process, and this one could not be (%s)", bound(att.Reason))
		rf.Method, rf.Tool = MethodToolsCall, c.Tool
		h.refuse(w, r, http.StatusOK, m.ID, id, name, rf)
		return
	}
	if !reserve(&s.used, int64(s.entry.MaxCalls)) {
		rf := refused(ReasonAllowanceExhausted, CodeRefused, "the run's allowance of calls to server %q (max_calls %d) is used up; no further calls to it are possible in this run", name, s.entry.MaxCalls)
		rf.Method, rf.Tool = MethodToolsCall, c.Tool
		h.refuse(w, r, http.StatusOK, m.ID, id, name, rf)
		return
	}
	if h.hold != nil {
		if reason, msg := h.hold(r.Context(), id, name, c.Tool, c.Arguments); reason != "" {
			rf := refused(reason, CodeRefused, "%s", msg)
			rf.Method, rf.Tool = MethodToolsCall, c.Tool
			h.refuse(w, r, http.StatusOK, m.ID, id, name, rf)
			return
		}
	}
	sum := sha256.Sum256(c.Arguments)
	line, ok := h.appendLine(audit.ToolRequested{CallID: id, Server: name, Tool: c.Tool,
		ArgumentsSHA256: hex.EncodeToString(sum[:]), ArgumentsBytes: int64(len(c.Arguments)), Attribution: att})
	if !ok {
		h.replyError(w, m.ID, CodeRefused, ReasonAuditFailure, "moat: the call was not made: its record could not be made durable, and the run is ended")
		return
	}
	// A fatal event may have come while the call was held for approval
	// or while its record was written: the call then does not leave.
	if rf := h.ready(s, MethodToolsCall); rf != nil {
		h.fail(w, m.ID, id, rf.Reason, strings.Replace(rf.Message, "moat: refused: ", "moat: ", 1)+"; the call was not made")
		return
	}
	h.log.Debug("moat.tools admitted", "call_id", id, "server", name, "tool", c.Tool, "attribution", string(att.Status))
	timeout := time.Duration(s.entry.Timeout)
	ctx, cancel := context.WithTimeout(context.WithValue(r.Context(), preEffectKey{}, line), timeout)
	defer cancel()
	res, err := s.up.CallTool(ctx, c.Tool, c.Arguments)
	if err != nil && h.cfg.Reflects([]byte(err.Error())) {
		// The server's error text is shown and journaled like a result.
		h.fatal(ReasonReflected, fmt.Errorf("the error of tool %q on server %q carries a credential moat holds; withheld", c.Tool, name))
		h.fail(w, m.ID, id, ReasonReflected, "moat: the server's error was withheld: it carried a credential; the run is ended")
		return
	}
	if err != nil {
		reason, msg := ReasonServerError, fmt.Sprintf("moat: tool %s on server %q failed: %s", quote(c.Tool), name, bound(err.Error()))
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			reason, msg = ReasonTimeout, fmt.Sprintf("moat: tool %s on server %q did not answer within %s (the policy's timeout); the call was abandoned", quote(c.Tool), name, s.entry.Timeout)
		}
		h.fail(w, m.ID, id, reason, msg)
		return
	}
	out, err := canonical(res)
	if err != nil {
		h.fail(w, m.ID, id, ReasonServerError, fmt.Sprintf("moat: tool %s on server %q returned a result moat cannot encode: %s", quote(c.Tool), name, bound(err.Error())))
		return
	}
	if h.cfg.Reflects(out) {
		h.fatal(ReasonReflected, fmt.Errorf("the result of tool %q on server %q carries a credential moat holds; withheld", c.Tool, name))
		h.fail(w, m.ID, id, ReasonReflected, "moat: the result was withheld: it carried a credential; the run is ended")
		return
	}
	outSum := sha256.Sum256(out)
	if !h.append(audit.ToolCompleted{CallID: id, ResultSHA256: hex.EncodeToString(outSum[:]), ResultBytes: int64(len(out)), IsError: res.IsError}) {
		h.replyError(w, m.ID, CodeRefused, ReasonAuditFailure, "moat: the result was withheld: its record could not be made durable, and the run is ended")
		return
	}
	h.log.Info("moat.tools completed", "call_id", id, "server", name, "tool", c.Tool, "result_bytes", len(out), "is_error", res.IsError)
	h.replyRaw(w, m.ID, out)
}

func (h *Handler) fail(w http.ResponseWriter, rid []byte, id, reason, msg string) {
	msg = bound(msg)
	h.log.Warn("moat.tools failed", "call_id", id, "reason", reason, "detail", msg)
	h.append(audit.ToolFailed{CallID: id, Reason: reason, Detail: msg})
	h.replyError(w, rid, CodeInternal, reason, msg)
}

// refuse journals tool.refused, logs one line and answers. The refusal
// past inference.max_refusals ends the run; later ones are only answered.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, status int, rid []byte, id, serverName string, rf *Refusal) {
	msg := bound(rf.Message)
	var n, maxR int64
	if h.acctRefusal != nil {
		n, maxR = h.acctRefusal()
	} else {
		n, maxR = h.refusals.Add(1), int64(h.cfg.Policy.Inference.MaxRefusals)
	}
	if n <= maxR+1 {
		h.log.Warn("moat.tools refused", "call_id", id, "server", bound(serverName), "reason", rf.Reason, "detail", msg)
		h.append(audit.ToolRefused{CallID: id, Server: bound(serverName), Method: bound(rf.Method), Tool: bound(rf.Tool),
			Reason: rf.Reason, Detail: msg, Attribution: h.attribute(r)})
		if n == maxR+1 {
			h.fatal(ReasonRefusalLimit, fmt.Errorf("the run's refusals (the broker's and the tool gateway's) reached %d, more than the policy's inference.max_refusals (%d)", n, maxR))
		}
	}
	if status == http.StatusOK || status >= 400 {
		body, _ := errorBody(rid, rf.Code, rf.Reason, msg)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		w.Write(body)
		return
	}
	w.WriteHeader(status)
}

// bound cuts s to maxDetailBytes of valid UTF-8.
func bound(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= maxDetailBytes {
		return s
	}
	cut := maxDetailBytes
	for cut > 0 && s[cut]&0xC0 == 0x80 {
		cut--
	}
	return s[:cut] + "…"
}

func reserve(used *atomic.Int64, max int64) bool {
	for {
		n := used.Load()
		if n >= max {
			return false
		}
		if used.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// canonical encodes v (an SDK result) as RFC 8785 canonical JSON.
func canonical(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return strictjson.Canonicalize(b)
}

func (h *Handler) reply(w http.ResponseWriter, rid []byte, result map[string]any) {
	b, err := strictjson.Encode(result)
	if err != nil {
		h.replyError(w, rid, CodeInternal, "internal_error", "BUG: moat could not encode its answer")
		return
	}
	h.replyRaw(w, rid, b)
}

// replyRaw answers with {"id":…,"jsonrpc":"2.0","result":result}.
func (h *Handler) replyRaw(w http.ResponseWriter, rid, result []byte) {
	b := make([]byte, 0, len(result)+len(rid)+32)
	b = append(b, `{"id":`...)
	b = append(b, rid...)
	b = append(b, `,"jsonrpc":"2.0","result":`...)
	b = append(b, result...)
	b = append(b, '}')
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.Write(b)
}

func (h *Handler) replyError(w http.ResponseWriter, rid []byte, code int, reason, msg string) {
	b, _ := errorBody(rid, code, reason, msg)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.Write(b)
}

// errorBody is a JSON-RPC error response; id null when rid is nil.
func errorBody(rid []byte, code int, reason, msg string) ([]byte, error) {
	var id any
	if rid != nil {
		v, err := strictjson.Decode(rid)
		if err != nil {
			return nil, err
		}
		id = v
	}
	return strictjson.Encode(map[string]any{
		"jsonrpc": "2.0",
		"id":      id,
		"error":   map[string]any{"code": code, "message": msg, "data": map[string]any{"reason": reason}},
	})
}
