package kubernetes

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/moat-sandbox/moat/internal/fsutil"
	"github.com/moat-sandbox/moat/internal/kubeapi"
	"github.com/moat-sandbox/moat/policy"
)

// MoatInImage is where the sandbox image holds moat's own binary: the
// Pod's main process, the stage in front of every exec and the
// measurement run it.
const MoatInImage = "/usr/local/bin/moat"

// RunLabel is the label that names a sandbox's Pod, and that its
// NetworkPolicy selects.
const RunLabel = "moat.sandbox/run"

// containerName is the Pod's one container.
const containerName = "sandbox"

// objectName is the Pod's and NetworkPolicy's name for a run id
// (kubeapi.ObjectName, shared with conformance and evidence).
func objectName(runID string) string { return kubeapi.ObjectName(runID) }

// podSpec is what buildPod needs besides the policy.
type podSpec struct {
	Name string
	UID  int64
	GID  int64
}

// buildPod is the sandbox's Pod: one container running moat's pause as a
// non-root uid with no privilege escalation, every capability dropped, a
// read-only root file system and the runtime's default seccomp profile;
// no service account token, no host namespaces, no service links; a
// private /tmp and the grants as volumes (grantVolumes).
func buildPod(pol *policy.Policy, ps podSpec) (*corev1.Pod, error) {
	k := pol.Kubernetes
	vols, mounts, err := grantVolumes(pol, ps.UID, ps.GID)
	if err != nil {
		return nil, err
	}
	tmp := resource.NewQuantity(int64(pol.Filesystem.TmpSize), resource.BinarySI)
	vols = append(vols, corev1.Volume{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: tmp}}})
	mounts = append(mounts, corev1.VolumeMount{Name: "tmp", MountPath: "/tmp"})
	limits := corev1.ResourceList{}
	mem := k.Resources.Memory
	if mem == 0 {
		mem = pol.Process.Limits.Memory
	}
	if mem > 0 {
		limits[corev1.ResourceMemory] = *resource.NewQuantity(int64(mem), resource.BinarySI)
	}
	if k.Resources.CPU != "" {
		q, err := resource.ParseQuantity(k.Resources.CPU)
		if err != nil {
			return nil, fmt.Errorf("kubernetes.resources.cpu %q: %v", k.Resources.CPU, err)
		}
		limits[corev1.ResourceCPU] = q
	}
	f, t := false, true
	rc := k.RuntimeClassName
	var grace int64 = 0
	seccomp := &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: ps.Name, Namespace: k.Namespace, Labels: map[string]string{RunLabel: ps.Name}},
		Spec: corev1.PodSpec{
			RuntimeClassName:              &rc,
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  &f,
			EnableServiceLinks:            &f,
			HostNetwork:                   false,
			HostPID:                       false,
			HostIPC:                       false,
			NodeSelector:                  k.NodeSelector,
			TerminationGracePeriodSeconds: &grace,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot: &t, RunAsUser: &ps.UID, RunAsGroup: &ps.GID, SeccompProfile: seccomp,
			},
			Volumes: vols,
			Containers: []corev1.Container{{
				Name:    containerName,
				Image:   k.Image,
				Command: []string{MoatInImage, PauseHelper},
				// The image is the operator's: never pulled anew for a run.
				ImagePullPolicy: corev1.PullIfNotPresent,
				SecurityContext: &corev1.SecurityContext{
					RunAsNonRoot: &t, RunAsUser: &ps.UID, RunAsGroup: &ps.GID,
					AllowPrivilegeEscalation: &f, Privileged: &f, ReadOnlyRootFilesystem: &t,
					Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					SeccompProfile: seccomp,
				},
				Resources:    corev1.ResourceRequirements{Limits: limits, Requests: limits},
				VolumeMounts: mounts,
			}},
		},
	}
	return pod, nil
}

// grantVolumes are the policy's filesystem grants as volumes. By default
// each read_write grant is an emptyDir at its path (its content is the
// Pod's own, not the host's) and read_only grants are served by the
// image's read-only root. With kubernetes.host_path_grants each grant is
// a hostPath volume of the same path, read-only or not as granted, and
// only when checkHostPath accepts it: the kubelet resolves a hostPath on
// the node, following symlinks, so no component of the path may be one
// that the workload could replace.
func grantVolumes(pol *policy.Policy, uid, gid int64) ([]corev1.Volume, []corev1.VolumeMount, error) {
	var vols []corev1.Volume
	var mounts []corev1.VolumeMount
	add := func(path string, ro bool, src corev1.VolumeSource) {
		name := fmt.Sprintf("grant-%d", len(vols))
		vols = append(vols, corev1.Volume{Name: name, VolumeSource: src})
		mounts = append(mounts, corev1.VolumeMount{Name: name, MountPath: path, ReadOnly: ro})
	}
	// No read_write grant may cover moat's binary in the image: the Pod's
	// main process, the stage in front of every process and the
	// measurement that decides Ready run it. Such a grant serves another
	// file at that path: nothing (an emptyDir: the Pod cannot start) or,
	// with host_path_grants, the host directory's, which the workload of
	// one run could replace for the measurement of the next.
	for _, g := range pol.Filesystem.ReadWrite {
		if fsutil.Within(MoatInImage, g) {
			return nil, nil, fmt.Errorf("the read_write grant %s covers %s, moat's binary in the image, which runs the measurement that decides Ready and the stage in front of every process; grant another path", g, MoatInImage)
		}
	}
	if !pol.Kubernetes.HostPathGrants {
		for _, g := range pol.Filesystem.ReadWrite {
			add(g, false, corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}})
		}
		return vols, mounts, nil
	}
	for _, l := range []struct {
		paths []string
		ro    bool
	}{{pol.Filesystem.ReadOnly, true}, {pol.Filesystem.ReadWrite, false}} {
		for _, g := range l.paths {
			typ, err := checkHostPath(g, uid, gid)
			if err != nil {
				return nil, nil, err
			}
			add(g, l.ro, corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: g, Type: &typ}})
		}
	}
	return vols, mounts, nil
}

// checkHostPath accepts a grant as a hostPath volume only when no
// component that the kubelet follows can be replaced by the workload
// (uid, gid): every component is a real directory or, last, the grant
// itself, never a symlink, and no directory above the grant is writable
// by the workload, unless it is sticky and the entry below it is not the
// workload's. It returns the hostPath type that pins the grant's kind.
func checkHostPath(g string, uid, gid int64) (corev1.HostPathType, error) {
	if !filepath.IsAbs(g) || filepath.Clean(g) != g {
		return "", fmt.Errorf("host_path_grants: %q is not an absolute clean path", g)
	}
	parts := strings.Split(strings.TrimPrefix(g, "/"), "/")
	dir := "/"
	for i, p := range parts {
		next := filepath.Join(dir, p)
		var st syscall.Stat_t
		if err := syscall.Lstat(next, &st); err != nil {
			return "", fmt.Errorf("host_path_grants: %s: %v", next, err)
		}
		var dst syscall.Stat_t
		if err := syscall.Stat(dir, &dst); err != nil {
			return "", fmt.Errorf("host_path_grants: %s: %v", dir, err)
		}
		if writableBy(dst, uid, gid) && (dst.Mode&syscall.S_ISVTX == 0 || int64(st.Uid) == uid) {
			return "", fmt.Errorf("host_path_grants: grant %s is refused: %s, a component the kubelet follows, sits in %s, which the workload's uid %d can write, so it could be replaced (by a symlink) before the kubelet mounts it; grant a path whose directories are not the workload's, or leave host_path_grants off (emptyDir)", g, next, dir, uid)
		}
		// Nor by anyone else but root and the uid running moat: another
		// uid may be another sandbox's workload (its own hostPath grant
		// holding this one) or another user, who can swap the component
		// for a symlink after this check and before the kubelet mounts
		// it (seen: a sandbox toggling its directory's entry wrote the
		// other sandbox's grant into its own).
		if o := othersCanReplace(dst, st); o != "" {
			return "", fmt.Errorf("host_path_grants: grant %s is refused: %s, a component the kubelet follows, sits in %s, which %s can write (another sandbox's workload or another user), so it could be replaced (by a symlink) between this check and the kubelet's mount; grant a path whose directories only root or the user running moat can write, or leave host_path_grants off (emptyDir)", g, next, dir, o)
		}
		mode := st.Mode & syscall.S_IFMT
		switch {
		case mode == syscall.S_IFLNK:
			return "", fmt.Errorf("host_path_grants: grant %s is refused: %s is a symlink, which the kubelet would follow on the node; grant the path it names", g, next)
		case i < len(parts)-1 && mode != syscall.S_IFDIR:
			return "", fmt.Errorf("host_path_grants: %s is not a directory", next)
		}
		dir = next
		if i == len(parts)-1 {
			if mode == syscall.S_IFDIR {
				return corev1.HostPathDirectory, nil
			}
			if mode == syscall.S_IFREG {
				return corev1.HostPathFile, nil
			}
			return "", fmt.Errorf("host_path_grants: grant %s is neither a directory nor a regular file", g)
		}
	}
	return "", fmt.Errorf("host_path_grants: / itself cannot be granted")
}

// othersCanReplace names who, besides root and the uid and gid running
// moat, can replace the entry est in the directory dst, or "": anyone who
// can write dst, unless dst is sticky and both dst and the entry belong
// to root or to moat's uid (then only they can rename or remove it).
func othersCanReplace(dst, est syscall.Stat_t) string {
	op, opg := uint32(os.Geteuid()), uint32(os.Getegid())
	trusted := func(u uint32) bool { return u == 0 || u == op }
	if dst.Mode&syscall.S_ISVTX != 0 && trusted(dst.Uid) && trusted(est.Uid) {
		return ""
	}
	switch {
	case dst.Mode&0o002 != 0:
		return "every user"
	case dst.Mode&0o200 != 0 && !trusted(dst.Uid):
		return fmt.Sprintf("uid %d", dst.Uid)
	case dst.Mode&0o020 != 0 && dst.Gid != 0 && dst.Gid != opg:
		return fmt.Sprintf("group %d", dst.Gid)
	}
	return ""
}

// writableBy reports whether a directory with st is writable by uid/gid
// (owner, group or other write bit; root is never the workload).
func writableBy(st syscall.Stat_t, uid, gid int64) bool {
	switch {
	case int64(st.Uid) == uid:
		return st.Mode&0o200 != 0
	case int64(st.Gid) == gid:
		return st.Mode&0o020 != 0
	}
	return st.Mode&0o002 != 0
}

// buildNetworkPolicy is the sandbox's NetworkPolicy: it selects the Pod by
// its run label, denies every ingress, and allows egress only to the
// broker, TCP host:port.
func buildNetworkPolicy(namespace, name string, broker netip.Addr, port int) *networkingv1.NetworkPolicy {
	bits := 32
	if broker.Is6() {
		bits = 128
	}
	tcp := corev1.ProtocolTCP
	p := intstr.FromInt32(int32(port))
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{RunLabel: name}},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{RunLabel: name}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{},
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To:    []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: netip.PrefixFrom(broker, bits).String()}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p}},
			}},
		},
	}
}

// refuseUnsupported names the policy features this backend does not
// serve yet (their variables and listeners assume the sandbox's own
// loopback), or "".
func refuseUnsupported(pol *policy.Policy) string {
	var what []string
	if len(pol.Tools.MCP) > 0 {
		what = append(what, "tools.mcp")
	}
	if len(pol.Egress.Hosts) > 0 {
		what = append(what, "egress.hosts")
	}
	if len(pol.Egress.Services) > 0 {
		what = append(what, "egress.services")
	}
	if len(pol.Egress.Packages) > 0 {
		what = append(what, "egress.packages")
	}
	if len(pol.Filesystem.Volumes) > 0 {
		what = append(what, "filesystem.volumes")
	}
	if len(what) == 0 {
		return ""
	}
	return fmt.Sprintf("%s %s not available on the kubernetes backend yet (the broker is off the Pod and only its inference routes are wired there); remove %s or use --backend native or gvisor", strings.Join(what, ", "), map[bool]string{true: "is", false: "are"}[len(what) == 1], map[bool]string{true: "it", false: "them"}[len(what) == 1])
}
