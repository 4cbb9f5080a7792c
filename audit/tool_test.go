package audit

import (
	"errors"
	"strings"
	"testing"
)

// toolRecords are one of each tool record, after boundary.confirmed.
func toolRecords() []Record {
	attr := Attribution{Status: "resolved", PID: 4242, Executable: "/usr/bin/python3", SHA256: strings.Repeat("c", 64)}
	return []Record{
		ToolRefused{CallID: "moatcall_000000000000000000000001", Server: "calc", Method: "tools/call", Tool: "rm",
			Reason: "tool_not_allowed", Detail: `moat: refused: tool "rm" is not allowed on server "calc" (allowed: add)`, Attribution: attr},
		ToolRequested{CallID: "moatcall_000000000000000000000002", Server: "calc", Tool: "add",
			ArgumentsSHA256: strings.Repeat("d", 64), ArgumentsBytes: 13, Attribution: attr},
		ToolCompleted{CallID: "moatcall_000000000000000000000002", ResultSHA256: strings.Repeat("e", 64), ResultBytes: 52},
		ToolRequested{CallID: "moatcall_000000000000000000000003", Server: "calc", Tool: "add",
			ArgumentsSHA256: strings.Repeat("f", 64), ArgumentsBytes: 2, Attribution: Attribution{Status: "unavailable", Reason: "endpoint-only backend"}},
		ToolFailed{CallID: "moatcall_000000000000000000000003", Reason: "timeout", Detail: "moat: the server did not answer within 5s"},
	}
}

// TestToolRecordsVerify: tool records sign, verify complete, and decode
// back to what was written; run.terminated's counts.tools counts them.
func TestToolRecordsVerify(t *testing.T) {
	j := checkRecords(t, recordsCase{records: toolRecords(),
		counts: Counts{Tools: ToolCounts{Requested: 2, Completed: 1, Refused: 1, Failed: 1}}})
	lines, priv := j.lines, j.priv
	n := len(lines)
	if !strings.Contains(string(mustPayload(t, lines[n-1])), `"counts":{"completed":0,"failed":0,"processes":0,"refused":0,"requested":0,"tools":{"completed":1,"failed":1,"refused":1,"requested":2}}`) {
		t.Errorf("run.terminated: %s", mustPayload(t, lines[n-1]))
	}
	// Re-signed with the right key: tool counts dropped, or changed, are
	// refused; the unchanged line is the control (verified above).
	for name, edit := range map[string]func(m map[string]any){
		"tools dropped":   func(m map[string]any) { delete(m["counts"].(map[string]any), "tools") },
		"tools changed":   func(m map[string]any) { m["counts"].(map[string]any)["tools"].(map[string]any)["failed"] = 0 },
		"tool count gone": func(m map[string]any) { delete(m["counts"].(map[string]any)["tools"].(map[string]any), "failed") },
	} {
		bad := joinLines(replaceLine(lines, n-1, resign(t, priv, lines[n-1], edit)))
		if r := Verify(bad, j.pub); r.Status != Invalid || !(errors.Is(r.Err, ErrCounts) || errors.Is(r.Err, ErrBadRecord)) {
			t.Errorf("%s: got %v (%v), want invalid", name, r.Status, r.Err)
		}
	}
	// Control: a tool.requested line with a member the type does not have
	// is refused, signed or not.
	bad := signLine(priv, []byte(`{"arguments_bytes":2,"arguments_sha256":"`+strings.Repeat("f", 64)+`","attribution":{"status":"unavailable"},"call_id":"x","extra":1,"prev":"`+strings.Repeat("0", 64)+`","run":"r","seq":1,"server":"s","time":"2026-11-29T08:30:00Z","tool":"t","type":"tool.requested","v":1}`))
	if _, err := VerifyLine(bad, j.pub); !errors.Is(err, ErrBadRecord) {
		t.Errorf("unknown member: got %v, want ErrBadRecord", err)
	}
}

// TestNoToolCountsWithoutTools: a run without tool records has no
// counts.tools (its journal is what it was before tools existed), and an
// explicit zero tools member is not the writer's form.
func TestNoToolCountsWithoutTools(t *testing.T) {
	j := checkRecords(t, recordsCase{})
	lines, priv, pub := j.lines, j.priv, j.pub
	if p := mustPayload(t, lines[2]); strings.Contains(string(p), "tools") {
		t.Fatalf("run.terminated of a run without tools: %s", p)
	}
	bad := joinLines(replaceLine(lines, 2, resign(t, priv, lines[2], func(m map[string]any) {
		m["counts"].(map[string]any)["tools"] = map[string]any{"requested": 0, "completed": 0, "refused": 0, "failed": 0}
	})))
	if r := Verify(bad, pub); r.Status != Invalid || !errors.Is(r.Err, ErrBadRecord) {
		t.Fatalf("explicit zero tools: got %v (%v), want ErrBadRecord", r.Status, r.Err)
	}
}

// mustPayload decodes a line's payload.
func mustPayload(t *testing.T, line []byte) []byte {
	t.Helper()
	e, err := ParseLine(line)
	if err != nil {
		t.Fatal(err)
	}
	return e.Payload
}

// Example_toolRequested prints the payload of a tool.requested record as
// the writer makes it (pinned key and clock).
func Example_toolRequested() {
	printPayloads(toolRecords()[1:3]...)
	// Output:
	// {"arguments_bytes":13,"arguments_sha256":"dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd","attribution":{"executable":"/usr/bin/python3","pid":4242,"sha256":"cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc","status":"resolved"},"call_id":"moatcall_000000000000000000000002","prev":"55898897234ad4da482306cdb6528b39c2917bfbe7a2093e933803a43f7ee49b","run":"run-1","seq":3,"server":"calc","time":"2026-12-01T02:00:00Z","tool":"add","type":"tool.requested","v":1}
	// {"call_id":"moatcall_000000000000000000000002","is_error":false,"prev":"89dae48fdee0a7e1c2c4d54079741d747024aa65f453472b9052d4fc31dbbaf3","result_bytes":52,"result_sha256":"eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee","run":"run-1","seq":4,"time":"2026-12-01T02:00:00Z","type":"tool.completed","v":1}
}

// TestToolDescribe: audit show renders every tool record (no "BUG:
// unknown record"), with the fields a reader needs.
func TestToolDescribe(t *testing.T) {
	want := []string{
		`call=moatcall_000000000000000000000001 server="calc" method="tools/call" tool="rm" reason=tool_not_allowed pid=4242 exe=/usr/bin/python3 detail=`,
		`call=moatcall_000000000000000000000002 server=calc tool=add args=dddddddddddd bytes=13 pid=4242 exe=/usr/bin/python3`,
		`call=moatcall_000000000000000000000002 result=eeeeeeeeeeee bytes=52 is_error=false`,
		`call=moatcall_000000000000000000000003 server=calc tool=add args=ffffffffffff bytes=2 attribution=unavailable(endpoint-only backend)`,
		`call=moatcall_000000000000000000000003 reason=timeout detail="moat: the server did not answer within 5s"`,
	}
	for i, r := range toolRecords() {
		if got := Describe(r); !strings.HasPrefix(got, want[i]) {
			t.Errorf("%s: got %s, want prefix %s", r.RecordType(), got, want[i])
		}
	}
}

// TestToolServerConfirmed: a server's sandbox measurement signs, verifies,
// decodes back, renders, and is not a tool call: run.terminated has no
// counts.tools for it. A not-ready one carries its reason.
func TestToolServerConfirmed(t *testing.T) {
	bc := sampleRecords()[0].(BoundaryConfirmed)
	recs := []Record{
		ToolServerConfirmed{Server: "calc", Ready: true, Properties: bc.Properties, Checks: bc.Checks},
		ToolServerConfirmed{Server: "files", Ready: false, Properties: bc.Properties, Reason: "network: a host address was reachable"},
	}
	checkRecords(t, recordsCase{records: recs, end: RunTerminated{Reason: ReasonRefused, ExitCode: 125}})
	if d := Describe(recs[0]); !strings.HasPrefix(d, `server="calc" ready=true `) {
		t.Errorf("Describe: %s", d)
	}
	if d := Describe(recs[1]); !strings.Contains(d, `ready=false`) || !strings.Contains(d, `reason="network: a host address was reachable"`) {
		t.Errorf("Describe: %s", d)
	}
	// Control: where boundary.confirmed belongs (line 2) it is refused.
	w2, _ := newTestWriter(t)
	w2.Append(runStarted(w2))
	if _, err := w2.Append(ToolServerConfirmed{Server: "calc", Ready: true, Properties: bc.Properties}); err == nil {
		t.Error("tool.server_confirmed accepted on line 2")
	}
}
