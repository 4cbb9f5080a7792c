package audit

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// TestPackageRecords: package records sign, verify complete, decode back
// to what was written, carry the members the package doc lists (all
// present, then without the omitempty ones), count in no member of
// run.terminated, and the timeline marks refusals and failures.
func TestPackageRecords(t *testing.T) {
	attr := Attribution{Status: "resolved", PID: 4242, Executable: "/usr/bin/node", SHA256: strings.Repeat("c", 64)}
	recs := []Record{
		PackageLockfile{Kind: "npm", Path: "/w/package-lock.json", SHA256: strings.Repeat("9", 64), Pins: 412, Trust: "pinned"},
		PackageRequested{RequestID: "moatreq_000000000000000000000001", Kind: "npm", Artifact: PackageArtifactTarball, Name: "left-pad",
			Version: "1.3.0", Expected: "sha512-" + strings.Repeat("A", 86) + "==", Path: "/left-pad/-/left-pad-1.3.0.tgz", Lockfile: "/w/package-lock.json", Attribution: attr},
		PackageFailed{RequestID: "moatreq_000000000000000000000001", Status: 200, Reason: "package_digest_mismatch", Detail: "tampered", Got: "sha512-BBBB"},
		PackageRequested{RequestID: "moatreq_000000000000000000000002", Kind: "npm", Artifact: PackageArtifactMetadata, Name: "left-pad", Path: "/left-pad", Attribution: attr},
		PackageCompleted{RequestID: "moatreq_000000000000000000000002", Status: 200, BodySHA256: strings.Repeat("1", 64), BodyBytes: 812},
		PackageRefused{RequestID: "moatreq_000000000000000000000003", Kind: "npm", Method: "GET", Name: "lefft-pad", Reason: "package_not_pinned", Detail: "moat: refused: not in /w/package-lock.json", Attribution: attr},
		PackageRefused{RequestID: "moatreq_000000000000000000000004", Method: "PUT", Reason: "method_not_allowed", Detail: "publish", Attribution: attr},
		PackageFailed{RequestID: "moatreq_000000000000000000000005", Reason: "upstream_error", Detail: "refused"},
	}
	j := checkRecords(t, recordsCase{
		records: recs,
		members: map[int]string{
			0: "kind,path,pins,sha256,trust",
			1: "artifact,attribution,expected,kind,lockfile,name,path,request_id,version",
			2: "detail,got,reason,request_id,status",
			3: "artifact,attribution,kind,name,path,request_id",
			4: "body_bytes,body_sha256,request_id,status",
			5: "attribution,detail,kind,method,name,reason,request_id",
			6: "attribution,detail,method,reason,request_id",
			7: "detail,reason,request_id",
		},
	}).journal
	var tl bytes.Buffer
	WriteTimeline(&tl, j)
	out := tl.String()
	for _, want := range []string{
		`REFUSED package.refused`, `FAILED package.failed`, `kind=npm tarball "left-pad" version="1.3.0" expected=sha512-AAAAA`,
		`lockfile="/w/package-lock.json" pid=4242`, `reason=package_digest_mismatch detail="tampered" got=sha512-BBBB`,
		`kind=npm method="GET" name="lefft-pad" reason=package_not_pinned`,
		`kind=npm path="/w/package-lock.json" sha256=999999999999 pins=412 trust=pinned`, `status=200 body=111111111111 bytes=812`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("timeline lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "BUG") {
		t.Errorf("timeline has a BUG line:\n%s", out)
	}
	if _, err := recordTypes[TypePackageCompleted]([]byte(`{"request_id":"x","status":200,"body_sha256":"","body_bytes":1,"extra":1}`)); err == nil {
		t.Error("package.completed with an unknown member decoded")
	}
}

// TestLockfileDigests: run.started carries the lockfiles' digests; a
// package.reload must name, for every lockfile in force, the digest it
// replaces, and only an applied one moves the set on. The writer refuses
// (without writing) what the verifier would reject, and a re-signed
// reload naming another old digest verifies invalid.
func TestLockfileDigests(t *testing.T) {
	a, b, c := strings.Repeat("a", 64), strings.Repeat("b", 64), strings.Repeat("c", 64)
	const lock = "/w/package-lock.json"
	w, priv := newTestWriter(t)
	rs := runStarted(w)
	rs.Lockfiles = []PackageLockfile{{Kind: "npm", Path: lock, SHA256: a, Pins: 3, Trust: "pinned"}}
	change := func(old, now string) []PackageLockfileChange {
		return []PackageLockfileChange{{Kind: "npm", Path: lock, OldSHA256: old, SHA256: now, Pins: 4, Trust: "pinned"}}
	}
	lines := appendAll(t, w, rs, sampleRecords()[0],
		PackageReload{Requester: "uid 0 pid 7", Outcome: ReloadRefused, Lockfiles: change(a, c), Reason: "lockfile_untrusted", Detail: "edited"},
		PackageReload{Requester: "uid 0 pid 8", Outcome: ReloadApplied, Lockfiles: change(a, b)},
		PackageReload{Requester: "uid 0 pid 9", Outcome: ReloadApplied, Lockfiles: change(b, b)},
	)
	// Refused by the writer: the old digest is no longer in force (the
	// positive control is the applied reload from b just above), an
	// applied reload without its new digest, a lockfile not in force, a
	// refusal without its reason.
	for _, bad := range []PackageReload{
		{Requester: "uid 0 pid 10", Outcome: ReloadApplied, Lockfiles: change(a, c)},
		{Requester: "uid 0 pid 10", Outcome: ReloadApplied, Lockfiles: change(b, "")},
		{Requester: "uid 0 pid 10", Outcome: ReloadApplied, Lockfiles: []PackageLockfileChange{{Kind: "npm", Path: "/other", OldSHA256: b, SHA256: c, Trust: "pinned"}}},
		{Requester: "uid 0 pid 10", Outcome: ReloadRefused, Lockfiles: change(b, c)},
		{Outcome: ReloadApplied, Lockfiles: change(b, c)},
	} {
		if _, err := w.Append(bad); err == nil {
			t.Errorf("writer accepted %+v", bad)
		}
	}
	line, err := w.Append(RunTerminated{Reason: ReasonCompleted})
	if err != nil {
		t.Fatal(err)
	}
	lines = append(lines, line)
	pub := priv.Public().(ed25519.PublicKey)
	if res := Verify(joinLines(lines), pub); res.Status != Complete {
		t.Fatalf("verify: %v (%v)", res.Status, res.Err)
	}
	e, err := ParseLine(lines[0])
	if err != nil {
		t.Fatal(err)
	}
	if got := e.Record.(RunStarted).Lockfiles; !reflect.DeepEqual(got, rs.Lockfiles) {
		t.Errorf("run.started lockfiles %+v", got)
	}
	var tl bytes.Buffer
	WriteTimeline(&tl, joinLines(lines))
	for _, want := range []string{`lockfile="/w/package-lock.json":aaaaaaaaaaaa:pinned`, `REFUSED package.reload`,
		`outcome=applied requester="uid 0 pid 8" "/w/package-lock.json":aaaaaaaaaaaa->bbbbbbbbbbbb`, `reason=lockfile_untrusted`} {
		if !strings.Contains(tl.String(), want) {
			t.Errorf("timeline lacks %q:\n%s", want, tl.String())
		}
	}
	// Re-signed lines the writer would not have made.
	for name, edit := range map[string]struct {
		line int
		f    func(m map[string]any)
	}{
		"reload from a digest not in force": {3, func(m map[string]any) {
			m["lockfiles"].([]any)[0].(map[string]any)["old_sha256"] = c
		}},
		"refused reload moves the set": {4, func(m map[string]any) {
			m["lockfiles"].([]any)[0].(map[string]any)["old_sha256"] = c // c was only refused
		}},
		"run.started digest not hex": {0, func(m map[string]any) {
			m["lockfiles"].([]any)[0].(map[string]any)["sha256"] = "xyz"
		}},
		"run.started trust": {0, func(m map[string]any) {
			m["lockfiles"].([]any)[0].(map[string]any)["trust"] = "anything"
		}},
	} {
		j := make([][]byte, len(lines))
		copy(j, lines)
		j[edit.line] = resign(t, priv, lines[edit.line], edit.f)
		// Relink the lines after the edited one.
		for i := edit.line + 1; i < len(j); i++ {
			j[i] = resign(t, priv, j[i], func(m map[string]any) { m["prev"] = LineHash(j[i-1]) })
		}
		res := Verify(joinLines(j), pub)
		if res.Status != Invalid || !errors.Is(res.Err, ErrBadRecord) || res.Line != edit.line+1 {
			t.Errorf("%s: got %v line %d (%v), want invalid bad record on line %d", name, res.Status, res.Line, res.Err, edit.line+1)
		}
	}
}
