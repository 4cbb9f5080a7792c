package policy_test

import (
	"fmt"

	"github.com/moat-sandbox/moat/policy"
)

// Parse reports every problem at once, each with its line and key path.
func ExampleParse_errors() {
	_, err := policy.Parse([]byte(`version: 1
process:
  uid: 0
  limits: {memory: 64MB, pids: -1}
inference:
  providers:
    - name: local
      api: openai-chat
      base_url: http://192.0.2.1:8080
      credential_env: LOCAL_KEY
      models: []
audit: {dir: /var/lib/moat/runs}
sandbox: true
`), "")
	fmt.Println(err)
	// Output:
	// 6 problems:
	//   line 3: process.uid: uid 0 is root inside the sandbox; use a non-zero id (default 1000)
	//   line 4: process.limits.memory: size "64MB" is not an integer with an optional Ki, Mi, Gi or Ti suffix (e.g. 64Mi)
	//   line 4: process.limits.pids: negative limit -1; limits are counts in [4, 4194304]
	//   line 9: inference.providers[0].base_url: base_url "http://192.0.2.1:8080" uses plain http to a non-loopback host; use https:// (http:// is allowed only for 127.0.0.0/8, ::1 and localhost)
	//   line 11: inference.providers[0].models: empty; a provider with no models can serve nothing
	//   line 13: sandbox: unknown key "sandbox" (known here: version, backend, landlock, filesystem, process, inference, audit, tools, egress, approvals, kubernetes)
}

// The effective policy fills in every default; YAML prints it in a form
// that loads back unchanged, with the host ids moat derives as comments.
func ExamplePolicy_YAML() {
	p, err := policy.Parse([]byte("version: 1\nprocess: {uid: 1500}\naudit: {dir: /var/lib/moat/runs}\n"), "")
	if err != nil {
		panic(err)
	}
	y, _ := p.YAML()
	fmt.Print(string(y))
	// Output:
	// version: 1
	// backend: native
	// landlock:
	//   abi_floor: 6
	// filesystem:
	//   read_only: []
	//   read_write: []
	//   tmp_size: 64Mi
	// process:
	//   uid: 1500
	//   gid: 1000
	//   # host_uid: 65534   (derived: no read_write grant, so nobody)
	//   # host_gid: 65534   (derived: no read_write grant, so nobody)
	//   # host_uid and host_gid apply when moat runs as root; rootless, the workload runs as the caller's own uid and gid
	//   env:
	//     HOME: /tmp
	//     PATH: /usr/local/bin:/usr/bin:/bin
	//   workdir: /tmp
	//   limits:
	//     memory: 512Mi
	//     pids: 256
	//     open_files: 1024
	//     required: false
	//   supervisor_timeout: 10s
	// inference:
	//   max_requests: 32
	//   require_attribution: false
	//   max_output_tokens: 8192
	//   max_refusals: 64
	//   providers: []
	// audit:
	//   dir: /var/lib/moat/runs
	//   max_bytes: 64Mi
}
