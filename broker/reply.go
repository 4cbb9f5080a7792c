package broker

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/moat-sandbox/moat/broker/wire"
)

// errorBody renders an error in the API's own shape, so that unmodified SDKs
// surface msg to the agent. Before the API is known (api == ""), the shape
// carries both Anthropic's "type" and OpenAI's "error.message" and "code".
func errorBody(api string, status int, code Reason, msg string) []byte {
	var v any
	switch api {
	case wire.APIAnthropicMessages:
		v = map[string]any{"type": "error", "error": map[string]any{"type": anthropicType(status), "message": msg}}
	case wire.APIOpenAIChat, wire.APIOpenAIResponses:
		t := "invalid_request_error"
		if status >= 500 {
			t = "server_error"
		}
		v = map[string]any{"error": map[string]any{"message": msg, "type": t, "param": nil, "code": code}}
	default:
		v = map[string]any{"type": "error", "error": map[string]any{"type": anthropicType(status), "code": code, "message": msg}}
	}
	b, err := json.Marshal(v)
	if err != nil {
		panic("BUG: marshal of an error body failed: " + err.Error())
	}
	return b
}

func anthropicType(status int) string {
	switch status {
	case 401:
		return "authentication_error"
	case 403:
		return "permission_error"
	case 404:
		return "not_found_error"
	case 413:
		return "request_too_large"
	case 429:
		return "rate_limit_error"
	}
	if status >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

// writeHead writes a status line and headers. hdr pairs are written in
// order; values were checked or built by the broker.
func writeHead(w *bufio.Writer, status int, hdr [][2]string) {
	text := http.StatusText(status)
	if text == "" {
		text = "Status"
	}
	var num [20]byte
	w.WriteString("HTTP/1.1 ")
	w.Write(strconv.AppendInt(num[:0], int64(status), 10))
	w.WriteByte(' ')
	w.WriteString(text)
	w.WriteString("\r\n")
	for _, h := range hdr {
		w.WriteString(h[0])
		w.WriteString(": ")
		w.WriteString(h[1])
		w.WriteString("\r\n")
	}
	w.WriteString("\r\n")
}

// writeFull writes a complete response with a Content-Length and flushes.
func writeFull(w *bufio.Writer, status int, hdr [][2]string, body []byte, close bool) error {
	hdr = append(hdr, [2]string{"Content-Length", strconv.Itoa(len(body))})
	if close {
		hdr = append(hdr, [2]string{"Connection", "close"})
	}
	writeHead(w, status, hdr)
	w.Write(body)
	return w.Flush()
}

// writeError answers with an API-shaped error. x-should-retry: false keeps
// the Stainless-generated SDKs from retrying a decision that will not change.
func writeError(w *bufio.Writer, api string, status int, code Reason, msg, reqID string) error {
	hdr := [][2]string{
		{"Content-Type", "application/json"},
		{"X-Should-Retry", "false"},
		{"Moat-Reason", string(code)},
	}
	if reqID != "" {
		hdr = append(hdr, [2]string{"Moat-Request-Id", reqID})
	}
	return writeFull(w, status, hdr, errorBody(api, status, code, msg), true)
}

// chunkWriter frames a streamed response body for the worker.
type chunkWriter struct{ w *bufio.Writer }

func (c chunkWriter) write(p []byte) error {
	if len(p) == 0 {
		return nil
	}
	fmt.Fprintf(c.w, "%x\r\n", len(p))
	c.w.Write(p)
	c.w.WriteString("\r\n")
	return c.w.Flush()
}

func (c chunkWriter) end() error {
	c.w.WriteString("0\r\n\r\n")
	return c.w.Flush()
}
