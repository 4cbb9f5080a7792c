package policy

import (
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"sync"

	"go.yaml.in/yaml/v3"
)

// Kubernetes configures the kubernetes backend (boundary/kubernetes): the
// cluster moat creates the sandbox's Pod and NetworkPolicy in, and the
// Pod's image, runtime class, placement and resources. Other backends
// ignore it. Absent: the zero value, which the kubernetes backend refuses
// (it needs at least image).
type Kubernetes struct {
	// Kubeconfig is the kubeconfig file moat uses (absolute after Load).
	// Absent and in_cluster false: $KUBECONFIG, else ~/.kube/config.
	Kubeconfig string `yaml:"kubeconfig,omitempty" json:"kubeconfig,omitempty"`
	// InCluster uses the service account of the Pod moat runs in.
	InCluster bool `yaml:"in_cluster,omitempty" json:"in_cluster,omitempty"`
	// Namespace of the Pod and NetworkPolicy. Default "default".
	Namespace string `yaml:"namespace" json:"namespace"`
	// RuntimeClassName is the Pod's runtimeClassName. Default "gvisor".
	RuntimeClassName string `yaml:"runtime_class_name" json:"runtime_class_name"`
	// Image is the sandbox's image; it holds moat's own binary at
	// /usr/local/bin/moat (the measurement and the stage run it).
	Image string `yaml:"image" json:"image"`
	// NodeSelector is the Pod's nodeSelector.
	NodeSelector map[string]string `yaml:"node_selector,omitempty" json:"node_selector,omitempty"`
	// Resources are the container's limits (requests equal them).
	Resources KubernetesResources `yaml:"resources,omitempty" json:"resources,omitzero"`
	// BrokerAddress is the host address the broker listens on, which the
	// Pod must reach (the node's or the Pod bridge's). Absent: the node's
	// InternalIP when the cluster has one node and that address is this
	// host's.
	BrokerAddress string `yaml:"broker_address,omitempty" json:"broker_address,omitempty"`
	// HostPathGrants mounts the filesystem grants as hostPath volumes of
	// the same paths (the node must be this host); false (the default)
	// mounts each read_write grant as an emptyDir and serves read_only
	// grants from the image's read-only root.
	HostPathGrants bool `yaml:"host_path_grants,omitempty" json:"host_path_grants,omitempty"`
}

// KubernetesResources are a container's CPU and memory limits.
type KubernetesResources struct {
	// CPU as Kubernetes writes it: cores ("2", "0.5") or millicores
	// ("500m"). Absent: no CPU limit.
	CPU string `yaml:"cpu,omitempty" json:"cpu,omitempty"`
	// Memory limit. Absent: process.limits.memory.
	Memory Size `yaml:"memory,omitempty" json:"memory,omitempty"`
}

// Kubernetes defaults and bounds.
const (
	DefaultKubernetesNamespace    = "default"
	DefaultKubernetesRuntimeClass = "gvisor"
	maxKubernetesImage            = 512
	maxNodeSelector               = 32
)

var (
	kubernetesKeys = []string{"kubeconfig", "in_cluster", "namespace", "runtime_class_name", "image", "node_selector", "resources", "broker_address", "host_path_grants"}
	resourcesKeys  = []string{"cpu", "memory"}

	// The patterns are compiled when first used, not in package
	// initialisation: compiled, their bounded repetitions ({0,61}, {0,127},
	// {64}) are 1,145 allocations and 0.25 ms, which every start of the moat
	// binary paid (issue 15: the sandbox's init, stages and measurement
	// helper are such starts).
	dnsLabel     = lazyRegexp(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
	dnsSubdomain = lazyRegexp(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	labelName    = lazyRegexp(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
	cpuQuantity  = lazyRegexp(`^([1-9][0-9]{0,6}m|[0-9]{1,4}(\.[0-9]{1,3})?)$`)
	// imageRef is a container image reference: a name with optional
	// registry, tag and digest, no spaces or control characters.
	imageRef = lazyRegexp(`^[a-z0-9][a-z0-9._/:-]*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$`)
)

// lazyRegexp returns a function that compiles pattern once, when first
// called.
func lazyRegexp(pattern string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(pattern) })
}

func (d *decoder) kubernetes(n *yaml.Node, k *Kubernetes) {
	f := d.mapping(n, "kubernetes", kubernetesKeys...)
	k.Namespace, k.RuntimeClassName = DefaultKubernetesNamespace, DefaultKubernetesRuntimeClass
	if n := f["kubeconfig"]; n != nil {
		if s, ok := d.path(n, "kubernetes.kubeconfig"); ok {
			k.Kubeconfig = s
		}
	}
	if n := f["in_cluster"]; n != nil {
		if v, ok := d.bool(n, "kubernetes.in_cluster"); ok {
			k.InCluster = v
			if v && f["kubeconfig"] != nil {
				d.add(n, CodeBadValue, "kubernetes.in_cluster", "in_cluster: true and kubeconfig both name the cluster; keep one")
			}
		}
	}
	if n := f["namespace"]; n != nil {
		if s, ok := d.str(n, "kubernetes.namespace"); ok {
			if !dnsLabel().MatchString(s) {
				d.add(n, CodeBadValue, "kubernetes.namespace", "namespace %q is not a DNS label (lower-case letters, digits and '-', at most 63, starting and ending alphanumeric)", s)
			} else {
				k.Namespace = s
			}
		}
	}
	if n := f["runtime_class_name"]; n != nil {
		if s, ok := d.str(n, "kubernetes.runtime_class_name"); ok {
			if len(s) > 253 || !dnsSubdomain().MatchString(s) {
				d.add(n, CodeBadValue, "kubernetes.runtime_class_name", "runtime class %q is not a DNS subdomain (the RuntimeClass's name, e.g. gvisor)", s)
			} else {
				k.RuntimeClassName = s
			}
		}
	}
	if n := f["image"]; n != nil {
		if s, ok := d.str(n, "kubernetes.image"); ok {
			if len(s) > maxKubernetesImage || !imageRef().MatchString(s) {
				d.add(n, CodeBadValue, "kubernetes.image", "image %q is not an image reference (registry/name:tag or @sha256:digest, lower-case name, at most %d bytes)", s, maxKubernetesImage)
			} else {
				k.Image = s
			}
		}
	}
	if n := f["node_selector"]; n != nil {
		k.NodeSelector = d.nodeSelector(n, "kubernetes.node_selector")
	}
	if n := f["resources"]; n != nil {
		rf := d.mapping(n, "kubernetes.resources", resourcesKeys...)
		if n := rf["cpu"]; n != nil {
			// 2 and 0.5 are numbers in YAML, and CPU quantities as written.
			if s, ok := d.cpu(n, "kubernetes.resources.cpu"); ok {
				if !cpuQuantity().MatchString(s) || s == "0" || s == "0.0" {
					d.add(n, CodeBadValue, "kubernetes.resources.cpu", "cpu %q is not a positive CPU quantity such as 2, 0.5 or 500m", s)
				} else {
					k.Resources.CPU = s
				}
			}
		}
		if n := rf["memory"]; n != nil {
			if v, ok := d.size(n, "kubernetes.resources.memory", MinMemory); ok {
				k.Resources.Memory = v
			}
		}
	}
	if n := f["broker_address"]; n != nil {
		if s, ok := d.str(n, "kubernetes.broker_address"); ok {
			if msg := checkBrokerAddress(s); msg != "" {
				d.add(n, CodeBadValue, "kubernetes.broker_address", "%s", msg)
			} else {
				k.BrokerAddress = s
			}
		}
	}
	if n := f["host_path_grants"]; n != nil {
		if v, ok := d.bool(n, "kubernetes.host_path_grants"); ok {
			k.HostPathGrants = v
		}
	}
}

// cpu decodes a CPU quantity: a string, or a plain YAML number.
func (d *decoder) cpu(n *yaml.Node, path string) (string, bool) {
	if n.Kind == yaml.ScalarNode && (n.ShortTag() == "!!int" || n.ShortTag() == "!!float") {
		return n.Value, true
	}
	return d.str(n, path)
}

// checkBrokerAddress says what is wrong with a broker_address, or "".
func checkBrokerAddress(s string) string {
	a, err := netip.ParseAddr(s)
	switch {
	case err != nil || a.Zone() != "":
		return fmt.Sprintf("broker_address %q is not an IP address (write the host address the Pod reaches, e.g. the node's InternalIP)", s)
	case a.Is4In6():
		return fmt.Sprintf("broker_address %q is an IPv4-mapped IPv6 address; write %s", s, a.Unmap())
	case a.String() != s:
		return fmt.Sprintf("broker_address %q is not in canonical form; write %s", s, a)
	case a.Unmap().IsLoopback():
		return fmt.Sprintf("broker_address %s is a loopback address, which inside the Pod is the Pod's own; write a host address the Pod reaches (the node's InternalIP or the Pod bridge's)", s)
	case a.IsUnspecified() || a.IsMulticast() || a.IsLinkLocalMulticast():
		return fmt.Sprintf("broker_address %s is not a unicast address; the broker must listen on one address, which the NetworkPolicy names", s)
	}
	return ""
}

// nodeSelector decodes a map of Kubernetes label keys to values.
func (d *decoder) nodeSelector(n *yaml.Node, path string) map[string]string {
	if !d.kind(n, path, yaml.MappingNode, "a mapping of label keys to values") {
		return nil
	}
	if len(n.Content)/2 > maxNodeSelector {
		d.add(n, CodeTooLarge, path, "more than %d labels", maxNodeSelector)
		return nil
	}
	out := map[string]string{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, vn := n.Content[i], n.Content[i+1]
		key, ok := d.str(kn, path)
		if !ok {
			continue
		}
		kp := path + "." + key
		if _, dup := out[key]; dup {
			d.add(kn, CodeDuplicate, kp, "duplicate label key %q", key)
			continue
		}
		if msg := checkLabelKey(key); msg != "" {
			d.add(kn, CodeBadValue, kp, "%s", msg)
			continue
		}
		v, ok := d.str(vn, kp)
		if !ok {
			continue
		}
		if v != "" && !labelName().MatchString(v) {
			d.add(vn, CodeBadValue, kp, "label value %q is not valid (at most 63 of A-Z a-z 0-9 - _ ., starting and ending alphanumeric, or empty)", v)
			continue
		}
		out[key] = v
	}
	return out
}

// checkLabelKey says what is wrong with a label key ([prefix/]name), or "".
func checkLabelKey(k string) string {
	prefix, name, hasPrefix := strings.Cut(k, "/")
	if !hasPrefix {
		prefix, name = "", k
	}
	switch {
	case hasPrefix && (prefix == "" || len(prefix) > 253 || !dnsSubdomain().MatchString(prefix)):
		return fmt.Sprintf("label key %q: prefix %q is not a DNS subdomain", k, prefix)
	case !labelName().MatchString(name):
		return fmt.Sprintf("label key %q is not valid ([prefix/]name, name at most 63 of A-Z a-z 0-9 - _ ., starting and ending alphanumeric)", k)
	}
	return ""
}
