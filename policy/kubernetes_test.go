package policy

import (
	"errors"
	"maps"
	"reflect"
	"strings"
	"testing"
)

// TestKubernetesSection: the section's values, its defaults when present,
// and a clear refusal (code and key path) of each bad value, with the
// good value of the same key accepted in the same table.
func TestKubernetesSection(t *testing.T) {
	p, err := Parse([]byte("version: 1\n"), "")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(p.Kubernetes, Kubernetes{}) {
		t.Errorf("absent section: %+v, want the zero value", p.Kubernetes)
	}
	p, err = Parse([]byte("version: 1\nbackend: kubernetes\nkubernetes: {image: k8s.local/moat:1}\n"), "")
	if err != nil {
		t.Fatal(err)
	}
	if k := p.Kubernetes; k.Namespace != "default" || k.RuntimeClassName != "gvisor" || k.Image != "k8s.local/moat:1" || p.Backend != "kubernetes" {
		t.Errorf("defaults: %+v", k)
	}
	p, err = Parse([]byte(`version: 1
kubernetes:
  kubeconfig: /etc/moat/kube.conf
  namespace: agents
  runtime_class_name: runsc.example.com
  image: reg.example:5000/a/b:v1.2
  node_selector: {kubernetes.io/hostname: n1, pool: ""}
  resources: {cpu: "0.5", memory: 1Gi}
  broker_address: "fd00::1"
  host_path_grants: true
`), "")
	if err != nil {
		t.Fatal(err)
	}
	want := Kubernetes{Kubeconfig: "/etc/moat/kube.conf", Namespace: "agents", RuntimeClassName: "runsc.example.com",
		Image: "reg.example:5000/a/b:v1.2", NodeSelector: map[string]string{"kubernetes.io/hostname": "n1", "pool": ""},
		Resources: KubernetesResources{CPU: "0.5", Memory: 1 << 30}, BrokerAddress: "fd00::1", HostPathGrants: true}
	if !reflect.DeepEqual(p.Kubernetes, want) {
		t.Errorf("got %+v\nwant %+v", p.Kubernetes, want)
	}
	y, err := p.YAML()
	if err != nil {
		t.Fatal(err)
	}
	q, err := Parse(y, "")
	if err != nil || !reflect.DeepEqual(q.Kubernetes, want) || !maps.Equal(q.Kubernetes.NodeSelector, want.NodeSelector) {
		t.Errorf("round trip: %v %+v\n%s", err, q, y)
	}

	for _, tt := range []struct {
		section string
		code    string
		path    string
		msg     string
	}{
		{"{image: a/b:1, namespace: Agents}", CodeBadValue, "kubernetes.namespace", "not a DNS label"},
		{"{image: a/b:1, namespace: " + strings.Repeat("a", 64) + "}", CodeBadValue, "kubernetes.namespace", "not a DNS label"},
		{"{image: \"a b\"}", CodeBadValue, "kubernetes.image", "not an image reference"},
		{"{image: \"A/b\"}", CodeBadValue, "kubernetes.image", "not an image reference"},
		{"{image: 7}", CodeWrongType, "kubernetes.image", ""},
		{"{image: a/b:1, kubeconfig: /k, in_cluster: true}", CodeBadValue, "kubernetes.in_cluster", "keep one"},
		{"{image: a/b:1, broker_address: 127.0.0.1}", CodeBadValue, "kubernetes.broker_address", "loopback"},
		{"{image: a/b:1, broker_address: \"::1\"}", CodeBadValue, "kubernetes.broker_address", "loopback"},
		{"{image: a/b:1, broker_address: 0.0.0.0}", CodeBadValue, "kubernetes.broker_address", "not a unicast"},
		{"{image: a/b:1, broker_address: \"::ffff:10.0.0.1\"}", CodeBadValue, "kubernetes.broker_address", ""},
		{"{image: a/b:1, broker_address: 10.0.0.01}", CodeBadValue, "kubernetes.broker_address", "not an IP address"},
		{"{image: a/b:1, broker_address: \"fe80::1%eth0\"}", CodeBadValue, "kubernetes.broker_address", "not an IP address"},
		{"{image: a/b:1, resources: {cpu: 0}}", CodeBadValue, "kubernetes.resources.cpu", "positive"},
		{"{image: a/b:1, resources: {cpu: \"-1\"}}", CodeBadValue, "kubernetes.resources.cpu", "positive"},
		{"{image: a/b:1, resources: {cpu: 1.5Gi}}", CodeBadValue, "kubernetes.resources.cpu", ""},
		{"{image: a/b:1, resources: {memory: 1Ki}}", CodeBadValue, "kubernetes.resources.memory", "out of range"},
		{"{image: a/b:1, resources: {gpu: 1}}", CodeUnknownKey, "kubernetes.resources.gpu", ""},
		{"{image: a/b:1, node_selector: {\"/x\": a}}", CodeBadValue, "kubernetes.node_selector./x", "prefix"},
		{"{image: a/b:1, node_selector: {\"a/b/c\": a}}", CodeBadValue, "kubernetes.node_selector.a/b/c", ""},
		{"{image: a/b:1, node_selector: {x: " + strings.Repeat("v", 64) + "}}", CodeBadValue, "kubernetes.node_selector.x", "label value"},
		{"{image: a/b:1, node_selector: [a]}", CodeWrongType, "kubernetes.node_selector", ""},
		{"{image: a/b:1, runtime_class_name: \"\"}", CodeBadValue, "kubernetes.runtime_class_name", "DNS subdomain"},
		{"{image: a/b:1, host_path_grants: yes}", CodeWrongType, "kubernetes.host_path_grants", ""},
		{"[a]", CodeWrongType, "kubernetes", ""},
	} {
		_, err := Parse([]byte("version: 1\nkubernetes: "+tt.section+"\n"), "")
		var pe *Error
		if !errors.As(err, &pe) {
			t.Errorf("%s: got %v, want a refusal", tt.section, err)
			continue
		}
		if !pe.Has(tt.code, tt.path) || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("%s: got %v\nwant %s at %s saying %q", tt.section, err, tt.code, tt.path, tt.msg)
		}
	}
}
