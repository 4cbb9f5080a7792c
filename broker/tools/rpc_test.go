package tools

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/strictjson"
	"github.com/moat-sandbox/moat/policy"
)

// testEntry is the server entry the admission tests use: one allowed
// tool, 256 bytes of arguments.
func testEntry() *policy.MCPServer {
	return &policy.MCPServer{Name: "calc", Tools: []string{"add"}, MaxCalls: 10, MaxArgumentBytes: 256, Timeout: policy.DefaultToolTimeout}
}

// admit runs the whole admission of one body: envelope, method, and for
// tools/call its params. It returns the reason code ("" when admitted).
func admit(body []byte, s *policy.MCPServer) (*Message, *Call, string) {
	m, rf := ParseMessage(body)
	if rf == nil {
		rf = checkMethod(m)
	}
	if rf != nil {
		return nil, nil, rf.Reason
	}
	if m.Method != MethodToolsCall {
		return m, nil, ""
	}
	c, rf := ParseCall(m.Params, s)
	if rf != nil {
		return m, nil, rf.Reason
	}
	return m, c, ""
}

func readMessages(t testing.TB) map[string][]byte {
	t.Helper()
	dir := filepath.Join("testdata", "messages")
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = b
	}
	if len(out) == 0 {
		t.Fatal("no messages in testdata")
	}
	return out
}

// TestTestdata: each file's name says its outcome: ok_… is admitted, any
// other prefix names the reason code it is refused with.
func TestTestdata(t *testing.T) {
	for name, body := range readMessages(t) {
		t.Run(name, func(t *testing.T) {
			_, _, got := admit(body, testEntry())
			want := ""
			if !strings.HasPrefix(name, "ok_") {
				want = strings.TrimSuffix(name, ".json")
				for _, r := range []string{ReasonBadJSON, ReasonBadRequest, ReasonBatch, ReasonMethodNotAllowed, ReasonToolNotAllowed, ReasonBadParams, ReasonArgumentsTooLarge} {
					if strings.HasPrefix(want, r) {
						want = r
					}
				}
			}
			if got != want {
				t.Errorf("got reason %q, want %q", got, want)
			}
		})
	}
}

// TestCanonicalArguments: the arguments forwarded are the RFC 8785 form,
// whatever order and number spelling the workload used, and the allowlist
// decides before anything else about the tool.
func TestCanonicalArguments(t *testing.T) {
	_, c, reason := admit([]byte(`{"params":{"arguments":{"b":1.0,"a":"<&>\u00e9","c":[1e2,{"z":null,"y":true}]},"name":"add"},"id":"q","method":"tools/call","jsonrpc":"2.0"}`), testEntry())
	if reason != "" {
		t.Fatalf("refused: %s", reason)
	}
	if want := `{"a":"<&>é","b":1,"c":[100,{"y":true,"z":null}]}`; string(c.Arguments) != want {
		t.Errorf("got %s, want %s", c.Arguments, want)
	}
	// Control for the allowlist: the same call to an unlisted tool, and
	// with "*".
	body := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"mul","arguments":{}}}`)
	if _, _, r := admit(body, testEntry()); r != ReasonToolNotAllowed {
		t.Errorf("unlisted tool: got %q, want %q", r, ReasonToolNotAllowed)
	}
	star := testEntry()
	star.Tools = []string{policy.AllTools}
	if _, _, r := admit(body, star); r != "" {
		t.Errorf(`"*": got %q, want admitted`, r)
	}
	// Size: exactly at the limit passes, one byte over is refused.
	s := testEntry()
	arg := `{"a":"` + strings.Repeat("x", int(s.MaxArgumentBytes)-8) + `"}`
	if len(arg) != int(s.MaxArgumentBytes) {
		t.Fatalf("BUG: test argument is %d bytes", len(arg))
	}
	mk := func(a string) []byte {
		return []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"add","arguments":` + a + `}}`)
	}
	if _, _, r := admit(mk(arg), s); r != "" {
		t.Errorf("at the limit: got %q, want admitted", r)
	}
	if _, _, r := admit(mk(strings.Replace(arg, "x", "xx", 1)), s); r != ReasonArgumentsTooLarge {
		t.Errorf("one over: got %q, want %q", r, ReasonArgumentsTooLarge)
	}
}

// FuzzAdmit: no input panics; an admitted call's arguments are canonical
// JSON within the limit, and an admitted message's id is canonical.
func FuzzAdmit(f *testing.F) {
	for _, b := range readMessages(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		m, c, reason := admit(body, testEntry())
		if reason != "" {
			return
		}
		if m.ID != nil {
			if canon, err := strictjson.Canonicalize(m.ID); err != nil || !bytes.Equal(canon, m.ID) {
				t.Fatalf("id %q is not canonical", m.ID)
			}
		}
		if c == nil {
			if m.Method == MethodToolsCall {
				t.Fatal("tools/call admitted without a call")
			}
			return
		}
		if canon, err := strictjson.Canonicalize(c.Arguments); err != nil || !bytes.Equal(canon, c.Arguments) {
			t.Fatalf("arguments %q are not canonical (%v)", c.Arguments, err)
		}
		if len(c.Arguments) > int(testEntry().MaxArgumentBytes) || !testEntry().AllowsTool(c.Tool) {
			t.Fatalf("admitted %q with %d bytes of arguments", c.Tool, len(c.Arguments))
		}
	})
}
