package audit

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
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
	w, priv := newTestWriter(t)
	all := append([]Record{runStarted(w), sampleRecords()[0]}, recs...)
	all = append(all, RunTerminated{Reason: ReasonCompleted})
	var lines [][]byte
	for _, r := range all {
		line, err := w.Append(r)
		if err != nil {
			t.Fatalf("Append %s: %v", r.RecordType(), err)
		}
		lines = append(lines, line)
	}
	j := joinLines(lines)
	res := Verify(j, priv.Public().(ed25519.PublicKey))
	if res.Status != Complete {
		t.Fatalf("got %v (%v), want complete", res.Status, res.Err)
	}
	if res.Terminal == nil || res.Terminal.Counts != (Counts{}) {
		t.Errorf("package records counted: %+v", res.Terminal)
	}
	members := map[int]string{
		0: "kind,path,pins,sha256,trust",
		1: "artifact,attribution,expected,kind,lockfile,name,path,request_id,version",
		2: "detail,got,reason,request_id,status",
		3: "artifact,attribution,kind,name,path,request_id",
		4: "body_bytes,body_sha256,request_id,status",
		5: "attribution,detail,kind,method,name,reason,request_id",
		6: "attribution,detail,method,reason,request_id",
		7: "detail,reason,request_id",
	}
	for i, want := range recs {
		e, err := ParseLine(lines[i+2])
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(e.Record, want) {
			t.Errorf("line %d: got %#v, want %#v", i+3, e.Record, want)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(e.Payload, &m); err != nil {
			t.Fatal(err)
		}
		var keys []string
		for k := range m {
			switch k {
			case "v", "run", "seq", "prev", "time", "type":
				continue
			}
			keys = append(keys, k)
		}
		if got := strings.Join(sortedStrings(keys), ","); got != members[i] {
			t.Errorf("%s members %s, want %s", want.RecordType(), got, members[i])
		}
	}
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
