package wire

import (
	"strings"
	"testing"
)

// TestAdmitMatchesOracle: bodies chosen for the places where checking the
// canonical bytes differs in kind from checking a tree: nulls the broker
// drops, members it adds (before, between and after others, in UTF-16
// order next to supplementary characters), escaped names and values,
// tags given or defaulted, refusals whose order depends on name order.
// Each must get the oracle's answer, byte for byte.
func TestAdmitMatchesOracle(t *testing.T) {
	anth := func(extra string) string {
		return `{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":"hi"}]` + extra + `}`
	}
	bodies := []string{
		anth(``), anth(`,"max_tokens":10`), anth(`,"max_tokens":null`), anth(`,"max_tokens":1e1`), anth(`,"max_tokens":10.0`),
		anth(`,"max_tokens":0`), anth(`,"max_tokens":99999`), anth(`,"stream":null`), anth(`,"stream":true`), anth(`,"stream":false,"max_tokens":null`),
		anth(`,"\u00e9":1`), anth(`,"\ud83d\ude00":1,"\uffff":2`), anth(`,"a\nb":1`), anth(`,"mcp_servers":null`), anth(`,"container":null,"zz":1`),
		anth(`,"system":[{"type":"text","text":"a\"b\\c\u0001"}]`), anth(`,"metadata":{"user_id":"\u0000"}`),
		`{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"http://x"}}]}]}`,
		`{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":[{"source":{"type":"base64","media_type":"image/png","data":"x"}}]}]}`,
		`{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":[{"type":7}]}]}`,
		`{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":[{"type":"web_search_tool_result"}]}]}`,
		`{"model":"claude-sonnet-4-5","messages":[{"content":"x"}],"zzz":1}`,
		`{"model":"claude-sonnet-4-5","tools":[{"name":"t","input_schema":[]}],"messages":[]}`,
		`{"model":"claude-sonnet-4-5","tools":[{"type":"bash_20250124","name":"bash"}],"messages":[]}`,
		`{"model":"nope","messages":[]}`, `{"model":1,"messages":[]}`, `{"messages":[]}`, `[]`, `"x"`, `{"model":null,"messages":[]}`,
		`{"model":"gpt-4.1","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"max_completion_tokens":6}`,
		`{"model":"gpt-4.1","messages":[{"role":"user","content":"hi"}],"max_tokens":null,"max_completion_tokens":6}`,
		`{"model":"gpt-4.1","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"DATA:image/png;base64,AA"}}]}],"n":1}`,
		`{"model":"gpt-4.1","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/y.png"}}]}],"n":2}`,
		`{"model":"gpt-4.1","messages":[{"role":"user","content":"hi"}],"store":true}`,
		`{"model":"gpt-4.1","input":"hi"}`, `{"model":"gpt-4.1","input":"hi","store":null}`, `{"model":"gpt-4.1","input":"hi","store":false,"stream":null}`,
		`{"model":"gpt-4.1","input":"hi","store":true}`, `{"model":"gpt-4.1","input":[{"role":"user","content":"hi"}],"\u0001":1}`,
		`{"model":"gpt-4.1","input":[{"type":"item_reference","id":"x"}]}`, `{"model":"gpt-4.1","input":"hi","max_output_tokens":null,"truncation":"auto"}`,
		`{"model":"gpt-4.1","input":"hi","text":{"format":{"type":"json_schema","name":"x","schema":1}}}`,
	}
	n := 0
	for _, body := range bodies {
		for api := range apis() {
			for _, ep := range Endpoints(api) {
				req, ref := Admit(api, ep, []byte(body), testLimits)
				if msg := sameAdmission(req, ref, []byte(body), api, ep, testLimits); msg != "" {
					t.Error(msg)
				}
				if req != nil {
					n++
				}
				// A second limit, for the token decisions.
				lim := Limits{Models: testLimits.Models, MaxOutputTokens: 7}
				req, ref = Admit(api, ep, []byte(body), lim)
				if msg := sameAdmission(req, ref, []byte(body), api, ep, lim); msg != "" {
					t.Error(msg)
				}
			}
		}
	}
	if n < 10 {
		t.Errorf("only %d admissions among the cases; the comparison would not cover the decisions", n)
	}
	// The cases do reach the decisions that rewrite the body.
	if req, _ := Admit(APIOpenAIResponses, "/v1/responses", []byte(`{"model":"gpt-4.1","input":"hi","store":null,"\ud83d\ude00":1}`), testLimits); req != nil {
		t.Errorf("admitted an unknown field")
	}
	req, ref := Admit(APIOpenAIResponses, "/v1/responses", []byte(`{"model":"gpt-4.1","input":"hi","store":null,"stream":null}`), testLimits)
	if ref != nil || string(req.Canonical) != `{"input":"hi","max_output_tokens":4096,"model":"gpt-4.1","store":false}` {
		t.Errorf("rewritten body %s %v", req.Canonical, ref)
	}
	if !strings.Contains(string(req.Canonical), `"store":false`) {
		t.Error("store not forced")
	}
}
