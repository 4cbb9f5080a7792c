package measure_test

import (
	"encoding/json"
	"fmt"

	"github.com/moat-sandbox/moat/boundary/measure"
)

// A Report as it is recorded: one check per attempted action, with the
// property it bears on, whether it is a violation or a positive control,
// what happened, and whether that is the safe outcome.
func ExampleReport() {
	rep := measure.Report{Checks: []measure.Check{
		{Property: measure.PropFilesystem, Name: "fs/read-secret:/etc/shadow", Kind: measure.KindViolation,
			Outcome: measure.OutcomeFailed, OK: true, Detail: "open: no such file or directory"},
		{Property: measure.PropFilesystem, Name: "fs/write-rw:/srv/agent/workspace", Kind: measure.KindControl,
			Outcome: measure.OutcomeSucceeded, OK: true, Detail: "created /srv/agent/workspace/.moat-measure-3f2a-7 and removed it"},
		{Property: measure.PropPrivilege, Name: "priv/unshare-userns", Kind: measure.KindViolation,
			Outcome: measure.OutcomeSucceeded, OK: false, Detail: "unshare(CLONE_NEWUSER) succeeded: a child ran in a new user namespace"},
	}}
	b, _ := json.MarshalIndent(rep, "", "  ")
	fmt.Println(string(b))
	// Output:
	// {
	//   "checks": [
	//     {
	//       "property": "filesystem_confinement",
	//       "name": "fs/read-secret:/etc/shadow",
	//       "kind": "violation",
	//       "ok": true,
	//       "outcome": "failed",
	//       "detail": "open: no such file or directory"
	//     },
	//     {
	//       "property": "filesystem_confinement",
	//       "name": "fs/write-rw:/srv/agent/workspace",
	//       "kind": "control",
	//       "ok": true,
	//       "outcome": "succeeded",
	//       "detail": "created /srv/agent/workspace/.moat-measure-3f2a-7 and removed it"
	//     },
	//     {
	//       "property": "privilege_floor",
	//       "name": "priv/unshare-userns",
	//       "kind": "violation",
	//       "ok": false,
	//       "outcome": "succeeded",
	//       "detail": "unshare(CLONE_NEWUSER) succeeded: a child ran in a new user namespace"
	//     }
	//   ]
	// }
}
