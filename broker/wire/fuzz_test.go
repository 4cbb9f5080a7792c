package wire

import (
	"bytes"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/strictjson"
)

// Hand-written examples: testdata/examples/<api>/good/<name>.json must be
// admitted; testdata/examples/<api>/bad/<code>.<name>.json must be refused
// with <code>. Embedded, so the test binary needs no source tree.
//
//go:embed testdata/examples
var examples embed.FS

type example struct {
	api, name, code string // code "" for good examples
	body            []byte
}

func loadExamples(t testing.TB, api string) []example {
	t.Helper()
	var out []example
	for _, kind := range []string{"good", "bad"} {
		dir := path.Join("testdata/examples", api, kind)
		entries, err := fs.ReadDir(examples, dir)
		if err != nil {
			t.Fatalf("reading %s: %v", dir, err)
		}
		for _, e := range entries {
			b, err := fs.ReadFile(examples, path.Join(dir, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			ex := example{api: api, name: kind + "/" + e.Name(), body: b}
			if kind == "bad" {
				ex.code, _, _ = strings.Cut(e.Name(), ".")
			}
			out = append(out, ex)
		}
	}
	if len(out) == 0 {
		t.Fatalf("no examples for %s", api)
	}
	return out
}

func TestExamples(t *testing.T) {
	for _, api := range []string{APIAnthropicMessages, APIOpenAIChat, APIOpenAIResponses} {
		for _, ex := range loadExamples(t, api) {
			t.Run(api+"/"+ex.name, func(t *testing.T) {
				req, ref := Admit(api, Endpoints(api)[0], ex.body, testLimits)
				switch {
				case ex.code == "" && ref != nil:
					t.Errorf("refused %s: %s", ref.Code, ref.Message)
				case ex.code != "" && ref == nil:
					t.Errorf("admitted %s, want %s", req.Canonical, ex.code)
				case ex.code != "" && ref.Code != Reason(ex.code):
					t.Errorf("got %s (%s), want %s", ref.Code, ref.Message, ex.code)
				}
			})
		}
	}
}

// fuzzAdmit checks, for any input, that Admit does not panic, that it
// answers as the oracle does (admitTree: the same checks on a decoded
// tree), and that an admitted request's Canonical is itself admitted,
// unchanged, with the same model, tokens and stream flag.
//
// Run them with a short -fuzzminimizetime (1s): the seeds are whole agent
// turns of about 3 KiB, and the toolchain minimizes every input that finds
// new coverage for up to 60 s by default, reporting no executions
// meanwhile. That, not admission, is why a plain -fuzz run seemed to stall
// after its seed corpus (a minute per new input at ~25,000 executions a
// second; with 1s, 20,000-30,000 a second throughout).
func fuzzAdmit(f *testing.F, api string) {
	for _, ex := range loadExamples(f, api) {
		f.Add(ex.body)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, ep := range Endpoints(api) {
			req, ref := Admit(api, ep, body, testLimits)
			if msg := sameAdmission(req, ref, body, api, ep, testLimits); msg != "" {
				t.Fatal(msg)
			}
			if ref != nil {
				if req != nil {
					t.Fatalf("both a request and a refusal")
				}
				if ref.Code == "" || ref.Code == ReasonInternal || strings.Contains(ref.Message, "refused:") || strings.Count(ref.Error(), "moat: refused: ") != 1 {
					t.Fatalf("malformed refusal %+v", ref)
				}
				continue
			}
			again, ref := Admit(api, ep, req.Canonical, testLimits)
			if ref != nil {
				t.Fatalf("%s: canonical form %q refused: %s", ep, req.Canonical, ref.Message)
			}
			if !bytes.Equal(again.Canonical, req.Canonical) || again.Model != req.Model ||
				again.MaxTokens != req.MaxTokens || again.Stream != req.Stream {
				t.Fatalf("%s: re-admission changed the request: %+v -> %+v", ep, req, again)
			}
			if c, err := strictjson.Canonicalize(req.Canonical); err != nil || !bytes.Equal(c, req.Canonical) {
				t.Fatalf("%s: Canonical is not canonical: %v", ep, err)
			}
			if req.MaxTokens > testLimits.MaxOutputTokens {
				t.Fatalf("%s: reserved %d tokens, above the limit", ep, req.MaxTokens)
			}
		}
	})
}

func FuzzAdmitAnthropicMessages(f *testing.F) { fuzzAdmit(f, APIAnthropicMessages) }
func FuzzAdmitOpenAIChat(f *testing.F)        { fuzzAdmit(f, APIOpenAIChat) }
func FuzzAdmitOpenAIResponses(f *testing.F)   { fuzzAdmit(f, APIOpenAIResponses) }

// benchBody returns a realistic agent request for api of about 8 KiB: the
// good example, with its conversation repeated until the body is that size.
func benchBody(b testing.TB, api string) []byte {
	b.Helper()
	raw, err := fs.ReadFile(examples, path.Join("testdata/examples", api, "good/agent_turn.json"))
	if err != nil {
		b.Fatal(err)
	}
	v, err := strictjson.Decode(raw)
	if err != nil {
		b.Fatal(err)
	}
	top := v.(map[string]any)
	key := "messages"
	if api == APIOpenAIResponses {
		key = "input"
	}
	turn := top[key].([]any)
	var conv []any
	for {
		conv = append(conv, turn...)
		top[key] = conv
		body, err := strictjson.Encode(top)
		if err != nil {
			b.Fatal(err)
		}
		if len(body) >= 8<<10 {
			return body
		}
	}
}

func BenchmarkAdmit(b *testing.B) {
	for _, api := range []string{APIAnthropicMessages, APIOpenAIChat, APIOpenAIResponses} {
		b.Run(api, func(b *testing.B) {
			body := benchBody(b, api)
			if _, ref := Admit(api, Endpoints(api)[0], body, testLimits); ref != nil {
				b.Fatalf("benchmark body refused: %s", ref.Message)
			}
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			b.ReportMetric(float64(len(body)), "body-bytes")
			for b.Loop() {
				if _, ref := Admit(api, Endpoints(api)[0], body, testLimits); ref != nil {
					b.Fatal(ref)
				}
			}
		})
	}
}

// BenchmarkAdmitTree is the same admission on a decoded tree (the oracle,
// as Admit worked before it checked the canonical bytes): the before of
// bench/README.md's broker profile, in the same run.
func BenchmarkAdmitTree(b *testing.B) {
	for _, api := range []string{APIAnthropicMessages, APIOpenAIChat, APIOpenAIResponses} {
		b.Run(api, func(b *testing.B) {
			body := benchBody(b, api)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, ref := admitTree(api, Endpoints(api)[0], body, testLimits); ref != nil {
					b.Fatal(ref)
				}
			}
		})
	}
}

// BenchmarkCanonicalize is admission's first step alone: strict parsing
// and the RFC 8785 form of the same bodies.
func BenchmarkCanonicalize(b *testing.B) {
	for _, api := range []string{APIAnthropicMessages, APIOpenAIChat, APIOpenAIResponses} {
		b.Run(api, func(b *testing.B) {
			body := benchBody(b, api)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := strictjson.Canonicalize(body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func ExampleAdmit() {
	req, ref := Admit(APIOpenAIResponses, "/v1/responses",
		[]byte(`{"model":"gpt-4.1","input":"Say hi","stream":true}`),
		Limits{Models: []string{"gpt-4.1"}, MaxOutputTokens: 1024})
	fmt.Println(string(req.Canonical), req.MaxTokens, req.Stream, ref == nil)

	_, ref = Admit(APIOpenAIResponses, "/v1/responses",
		[]byte(`{"model":"gpt-4.1","input":"hi","previous_response_id":"resp_1"}`),
		Limits{Models: []string{"gpt-4.1"}, MaxOutputTokens: 1024})
	fmt.Println(ref.Code)
	fmt.Println(ref.Message)
	// Output:
	// {"input":"Say hi","max_output_tokens":1024,"model":"gpt-4.1","store":false,"stream":true} 1024 true true
	// server_state
	// previous_response_id: state held by the provider is not allowed (moat cannot see it); send the whole conversation in the request instead, with store false
}

// sameAdmission compares Admit's answer with the oracle's; "" when equal.
func sameAdmission(req *Request, ref *Refusal, body []byte, api, ep string, lim Limits) string {
	wreq, wref := admitTree(api, ep, body, lim)
	switch {
	case (ref == nil) != (wref == nil):
		return fmt.Sprintf("%s %s: Admit %+v %+v, oracle %+v %+v (body %q)", api, ep, req, ref, wreq, wref, body)
	case ref != nil && (ref.Code != wref.Code || ref.Message != wref.Message):
		return fmt.Sprintf("%s %s: Admit refuses %s %q, oracle %s %q (body %q)", api, ep, ref.Code, ref.Message, wref.Code, wref.Message, body)
	case ref == nil && (!bytes.Equal(req.Canonical, wreq.Canonical) || req.Model != wreq.Model || req.MaxTokens != wreq.MaxTokens || req.Stream != wreq.Stream):
		return fmt.Sprintf("%s %s: Admit %q %s %d %v, oracle %q %s %d %v", api, ep, req.Canonical, req.Model, req.MaxTokens, req.Stream, wreq.Canonical, wreq.Model, wreq.MaxTokens, wreq.Stream)
	}
	return ""
}
