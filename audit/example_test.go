package audit

import (
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Example writes a two-record journal with a pinned key and clock (Create
// uses a fresh random key and the real clock) and prints the real bytes.
func Example() {
	tmp, _ := os.MkdirTemp("", "audit-example-")
	defer os.RemoveAll(tmp)
	priv := ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize)) // all-zero seed: example only
	clock := time.Date(2026, 11, 29, 8, 30, 0, 123456000, time.UTC)
	if err := os.Mkdir(filepath.Join(tmp, "run"), 0o700); err != nil && !os.IsExist(err) {
		fmt.Println(err)
		return
	}
	w, err := create(filepath.Join(tmp, "run"), "run-1", priv, func() time.Time { return clock })
	if err != nil {
		fmt.Println(err)
		return
	}
	first, _ := w.Append(RunStarted{PolicySHA256: strings.Repeat("a", 64), Backend: "native",
		BinarySHA256: strings.Repeat("b", 64), PublicKey: string(w.PublicKeyPEM())})
	last, _ := w.Append(RunTerminated{Reason: ReasonCompleted, ExitCode: 0})
	w.Close()

	payload := func(line []byte) string {
		b64 := strings.TrimPrefix(string(line), `{"payloadType":"application/vnd.moat.audit.v1+json","payload":"`)
		b64, _, _ = strings.Cut(b64, `"`)
		p, _ := base64.StdEncoding.DecodeString(b64)
		return string(p)
	}
	fmt.Println("keyid:", w.KeyID())
	fmt.Println("line 2:", string(last))
	fmt.Println("payload 1:", payload(first))
	fmt.Println("payload 2:", payload(last))
	j, _ := os.ReadFile(w.JournalPath())
	r := Verify(j, w.PublicKey())
	fmt.Println("verify:", r.Status, r.Records, "records, exit", r.Status.ExitCode())
	// Output:
	// keyid: 139e3940e64b5491722088d9a0d741628fc826e09475d341a780acde3c4b8070
	// line 2: {"payloadType":"application/vnd.moat.audit.v1+json","payload":"eyJjb3VudHMiOnsiY29tcGxldGVkIjowLCJmYWlsZWQiOjAsInByb2Nlc3NlcyI6MCwicmVmdXNlZCI6MCwicmVxdWVzdGVkIjowfSwiZXhpdF9jb2RlIjowLCJwcmV2IjoiZjQ4M2MxYjJhMjBiYTU2NmM5NTkwOTEzYTgyNjMyMDI3OWI2YWFmOTk4MmI5ZTJlNzNlZTM0OTJjM2VmMThiMCIsInJlYXNvbiI6ImNvbXBsZXRlZCIsInJ1biI6InJ1bi0xIiwic2VxIjoyLCJ0aW1lIjoiMjAyNi0xMS0yOVQwODozMDowMC4xMjM0NTZaIiwidHlwZSI6InJ1bi50ZXJtaW5hdGVkIiwidiI6MX0=","signatures":[{"keyid":"139e3940e64b5491722088d9a0d741628fc826e09475d341a780acde3c4b8070","sig":"DtS8+IMFviLC5MUw/xtuv3b8Tx43Q7htVj2GPNKrYzyDWHe7WYYuyAfEMC0TaofoqiNOuh53bmdIhLdyDdToCA=="}]}
	// payload 1: {"backend":"native","binary_sha256":"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb","policy_sha256":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","prev":"0000000000000000000000000000000000000000000000000000000000000000","public_key":"-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAO2onvM62pC1io6jQKm8Nc2UyFXcd4kOmOsBIoYtZ2ik=\n-----END PUBLIC KEY-----\n","run":"run-1","seq":1,"time":"2026-11-29T08:30:00.123456Z","type":"run.started","v":1}
	// payload 2: {"counts":{"completed":0,"failed":0,"processes":0,"refused":0,"requested":0},"exit_code":0,"prev":"f483c1b2a20ba566c9590913a826320279b6aaf9982b9e2e73ee3492c3ef18b0","reason":"completed","run":"run-1","seq":2,"time":"2026-11-29T08:30:00.123456Z","type":"run.terminated","v":1}
	// verify: complete 2 records, exit 0
}
