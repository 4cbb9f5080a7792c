package broker

import (
	"bytes"
	"encoding/json"

	"github.com/moat-sandbox/moat/audit"
)

// Token usage, as the provider reports it. Anthropic puts it in "usage"
// (and, streaming, in message_start's "message.usage" and message_delta's
// "usage"); OpenAI chat in "usage" with prompt/completion names (the last
// chunk, when stream_options.include_usage is set); OpenAI responses in
// "usage", streaming in response.completed's "response.usage". Counts are
// cumulative, so the largest value seen wins. Usage is informational: a
// response without it records zeros.

// maxUsageLineBytes caps one SSE line parsed for usage; longer lines are
// passed through unparsed.
const maxUsageLineBytes = 1 << 20

type usageFields struct {
	InputTokens      int `json:"input_tokens"`
	OutputTokens     int `json:"output_tokens"`
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

type usageHolder struct {
	Usage *usageFields `json:"usage"`
}

type usageProbe struct {
	Usage    *usageFields `json:"usage"`
	Message  *usageHolder `json:"message"`
	Response *usageHolder `json:"response"`
}

func mergeUsage(u *audit.Usage, data []byte) {
	var p usageProbe
	if json.Unmarshal(data, &p) != nil {
		return
	}
	for _, f := range []*usageFields{p.Usage, holderUsage(p.Message), holderUsage(p.Response)} {
		if f == nil {
			continue
		}
		u.InputTokens = max(u.InputTokens, f.InputTokens, f.PromptTokens)
		u.OutputTokens = max(u.OutputTokens, f.OutputTokens, f.CompletionTokens)
	}
}

func holderUsage(h *usageHolder) *usageFields {
	if h == nil {
		return nil
	}
	return h.Usage
}

// usageOf reads usage from a complete JSON response.
func usageOf(body []byte) audit.Usage {
	var u audit.Usage
	mergeUsage(&u, body)
	return u
}

// sseUsage reads usage from the data lines of an event stream, fed in
// arbitrary pieces.
type sseUsage struct {
	u    audit.Usage
	line []byte
	skip bool // the current line is over maxUsageLineBytes
}

func (s *sseUsage) feed(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		part := p
		if i >= 0 {
			part = p[:i]
		}
		if !s.skip {
			if len(s.line)+len(part) > maxUsageLineBytes {
				s.skip, s.line = true, s.line[:0]
			} else {
				s.line = append(s.line, part...)
			}
		}
		if i < 0 {
			return
		}
		if !s.skip {
			l := bytes.TrimSuffix(s.line, []byte("\r"))
			if d, ok := bytes.CutPrefix(l, []byte("data:")); ok {
				mergeUsage(&s.u, bytes.TrimSpace(d))
			}
		}
		s.line, s.skip = s.line[:0], false
		p = p[i+1:]
	}
}
