package kubeapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// apiServer is an API server of the few endpoints moat calls, over plain
// JSON, with the API server's error statuses. It records each request.
type apiServer struct {
	t     *testing.T
	token string // required as a bearer token when set

	mu       sync.Mutex
	objects  map[string]map[string]any // "pods/ns/name" etc. -> JSON object
	nextRV   int
	requests []*http.Request
	bodies   []string
	watchEvs chan string // lines a watch sends, then it ends when closed
	nodes    []corev1.Node
}

func newAPIServer(t *testing.T) (*apiServer, *httptest.Server) {
	a := &apiServer{t: t, objects: map[string]map[string]any{}, watchEvs: make(chan string, 16)}
	ts := httptest.NewServer(a)
	t.Cleanup(ts.Close)
	return a, ts
}

func (a *apiServer) status(w http.ResponseWriter, code int, reason, kind, name, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]any{
		"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": msg,
		"reason": reason, "code": code, "details": map[string]any{"name": name, "kind": kind},
	})
}

func (a *apiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	a.mu.Lock()
	a.requests = append(a.requests, r)
	a.bodies = append(a.bodies, string(body))
	a.mu.Unlock()
	if a.token != "" && r.Header.Get("Authorization") != "Bearer "+a.token {
		a.status(w, 401, "Unauthorized", "", "", "Unauthorized")
		return
	}
	var group, kind, ns, name string
	p := r.URL.Path
	switch {
	case p == "/api/v1/nodes" && r.Method == http.MethodGet:
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(corev1.NodeList{TypeMeta: metav1.TypeMeta{Kind: "NodeList", APIVersion: "v1"}, Items: a.nodes})
		return
	case strings.HasPrefix(p, "/api/v1/namespaces/"):
		group, p = "v1", strings.TrimPrefix(p, "/api/v1/namespaces/")
	case strings.HasPrefix(p, "/apis/networking.k8s.io/v1/namespaces/"):
		group, p = "networking.k8s.io/v1", strings.TrimPrefix(p, "/apis/networking.k8s.io/v1/namespaces/")
	default:
		a.status(w, 404, "NotFound", "", "", "no such path "+r.URL.Path)
		return
	}
	parts := strings.Split(p, "/")
	ns, kind = parts[0], parts[len(parts)-1]
	if len(parts) == 3 {
		kind, name = parts[1], parts[2]
	} else if len(parts) != 2 {
		a.status(w, 404, "NotFound", "", "", "no such path "+r.URL.Path)
		return
	}
	if (group == "v1") != (kind == "pods") || (kind != "pods" && kind != "networkpolicies") {
		a.status(w, 404, "NotFound", "", "", "no such resource "+r.URL.Path)
		return
	}
	key := kind + "/" + ns + "/" + name
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case r.Method == http.MethodPost && name == "":
		var obj map[string]any
		if err := json.Unmarshal(body, &obj); err != nil {
			a.status(w, 400, "BadRequest", kind, "", err.Error())
			return
		}
		meta, _ := obj["metadata"].(map[string]any)
		name, _ = meta["name"].(string)
		key = kind + "/" + ns + "/" + name
		if _, ok := a.objects[key]; ok {
			a.status(w, 409, "AlreadyExists", kind, name, fmt.Sprintf("%s %q already exists", kind, name))
			return
		}
		a.nextRV++
		meta["namespace"], meta["uid"], meta["resourceVersion"] = ns, "uid-"+name, strconv.Itoa(a.nextRV)
		a.objects[key] = obj
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		json.NewEncoder(w).Encode(obj)
	case r.Method == http.MethodGet && name != "":
		obj, ok := a.objects[key]
		if !ok {
			a.status(w, 404, "NotFound", kind, name, fmt.Sprintf("%s %q not found", kind, name))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(obj)
	case r.Method == http.MethodGet && r.URL.Query().Get("watch") == "true":
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		a.mu.Unlock()
		for line := range a.watchEvs {
			io.WriteString(w, line+"\n")
			w.(http.Flusher).Flush()
		}
		a.mu.Lock()
	case r.Method == http.MethodGet:
		var items []any
		for k, o := range a.objects {
			if strings.HasPrefix(k, kind+"/"+ns+"/") {
				items = append(items, o)
			}
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"kind": "PodList", "apiVersion": "v1", "metadata": map[string]any{"resourceVersion": "7"}, "items": items})
	case r.Method == http.MethodDelete && name != "":
		if _, ok := a.objects[key]; !ok {
			a.status(w, 404, "NotFound", kind, name, fmt.Sprintf("%s %q not found", kind, name))
			return
		}
		delete(a.objects, key)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Success"})
	default:
		a.status(w, 405, "MethodNotAllowed", kind, name, r.Method+" not allowed")
	}
}

func (a *apiServer) last() (*http.Request, string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.requests[len(a.requests)-1], a.bodies[len(a.bodies)-1]
}

func newClient(t *testing.T, ts *httptest.Server, token string) *Client {
	t.Helper()
	c, err := New(&rest.Config{Host: ts.URL, BearerToken: token, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestPods(t *testing.T) {
	a, ts := newAPIServer(t)
	c := newClient(t, ts, "")
	ctx := context.Background()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "moat-r1", Labels: map[string]string{"app": "moat"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "sandbox", Image: "moat:test"}}}}
	made, err := c.CreatePod(ctx, "agents", pod)
	if err != nil {
		t.Fatal(err)
	}
	if made.UID != "uid-moat-r1" || made.Namespace != "agents" || made.Spec.Containers[0].Image != "moat:test" {
		t.Fatalf("created Pod = %+v", made.ObjectMeta)
	}
	r, body := a.last()
	if r.Method != http.MethodPost || r.URL.Path != "/api/v1/namespaces/agents/pods" || r.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("create sent %s %s (%s)", r.Method, r.URL.Path, r.Header.Get("Content-Type"))
	}
	var sent corev1.Pod
	if err := json.Unmarshal([]byte(body), &sent); err != nil || sent.Name != "moat-r1" || sent.Labels["app"] != "moat" {
		t.Fatalf("create's body %s: %v", body, err)
	}

	// Again: the API server's 409 is AlreadyExists, not NotFound.
	_, err = c.CreatePod(ctx, "agents", pod)
	if !apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err) {
		t.Fatalf("second create: %v, want AlreadyExists", err)
	}

	got, err := c.GetPod(ctx, "agents", "moat-r1")
	if err != nil || got.UID != made.UID || got.ResourceVersion == "" {
		t.Fatalf("get: %+v, %v", got, err)
	}
	if _, err := c.GetPod(ctx, "other", "moat-r1"); !apierrors.IsNotFound(err) {
		t.Fatalf("get in another namespace: %v, want NotFound", err)
	}

	l, err := c.ListPods(ctx, "agents", metav1.ListOptions{LabelSelector: "app=moat"})
	if err != nil || len(l.Items) != 1 || l.Items[0].Name != "moat-r1" {
		t.Fatalf("list: %+v, %v", l, err)
	}
	if r, _ := a.last(); r.URL.Query().Get("labelSelector") != "app=moat" {
		t.Fatalf("list's query %q", r.URL.RawQuery)
	}

	zero := int64(0)
	if err := c.DeletePod(ctx, "agents", "moat-r1", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	r, body = a.last()
	var del metav1.DeleteOptions
	if r.Method != http.MethodDelete || r.URL.Path != "/api/v1/namespaces/agents/pods/moat-r1" || json.Unmarshal([]byte(body), &del) != nil || del.GracePeriodSeconds == nil || *del.GracePeriodSeconds != 0 {
		t.Fatalf("delete sent %s %s %s", r.Method, r.URL.Path, body)
	}
	if _, err := c.GetPod(ctx, "agents", "moat-r1"); !apierrors.IsNotFound(err) {
		t.Fatalf("get after delete: %v, want NotFound", err)
	}
	if err := c.DeletePod(ctx, "agents", "moat-r1", metav1.DeleteOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("second delete: %v, want NotFound", err)
	}
}

func TestNetworkPolicies(t *testing.T) {
	a, ts := newAPIServer(t)
	c := newClient(t, ts, "")
	ctx := context.Background()
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "moat-r1"},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}, Egress: []networkingv1.NetworkPolicyEgressRule{{}}}}
	made, err := c.CreateNetworkPolicy(ctx, "agents", np)
	if err != nil || made.UID != "uid-moat-r1" || len(made.Spec.Egress) != 1 {
		t.Fatalf("create: %+v, %v", made, err)
	}
	if r, _ := a.last(); r.URL.Path != "/apis/networking.k8s.io/v1/namespaces/agents/networkpolicies" {
		t.Fatalf("create sent to %s", r.URL.Path)
	}
	if _, err := c.CreateNetworkPolicy(ctx, "agents", np); !apierrors.IsAlreadyExists(err) {
		t.Fatalf("second create: %v, want AlreadyExists", err)
	}
	if got, err := c.GetNetworkPolicy(ctx, "agents", "moat-r1"); err != nil || got.Spec.PolicyTypes[0] != networkingv1.PolicyTypeEgress {
		t.Fatalf("get: %+v, %v", got, err)
	}
	// The shared observer sees the NetworkPolicy, not a Pod; a Pod of
	// that name too once it exists.
	if left, err := ObjectsLeft(ctx, c, "agents", "moat-r1"); err != nil || !reflect.DeepEqual(left, []string{"networkpolicy/moat-r1"}) {
		t.Fatalf("ObjectsLeft = %v, %v", left, err)
	}
	if live, err := PodLive(ctx, c, "agents", "moat-r1"); live || err != nil {
		t.Fatalf("PodLive without a Pod = %v, %v", live, err)
	}
	if _, err := c.CreatePod(ctx, "agents", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "moat-r1"}}); err != nil {
		t.Fatal(err)
	}
	if left, err := ObjectsLeft(ctx, c, "agents", "moat-r1"); err != nil || !reflect.DeepEqual(left, []string{"pod/moat-r1", "networkpolicy/moat-r1"}) {
		t.Fatalf("ObjectsLeft = %v, %v", left, err)
	}
	if live, err := PodLive(ctx, c, "agents", "moat-r1"); !live || err != nil {
		t.Fatalf("PodLive with the Pod = %v, %v", live, err)
	}
	if err := c.DeleteNetworkPolicy(ctx, "agents", "moat-r1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if r, _ := a.last(); r.Method != http.MethodDelete || r.URL.Path != "/apis/networking.k8s.io/v1/namespaces/agents/networkpolicies/moat-r1" {
		t.Fatalf("delete sent %s %s", r.Method, r.URL.Path)
	}
	if _, err := c.GetNetworkPolicy(ctx, "agents", "moat-r1"); !apierrors.IsNotFound(err) {
		t.Fatalf("get after delete: %v, want NotFound", err)
	}
	if err := c.DeleteNetworkPolicy(ctx, "agents", "moat-r1", metav1.DeleteOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("second delete: %v, want NotFound", err)
	}
}

// An error other than NotFound is never taken for an object's absence.
func TestObserverErrors(t *testing.T) {
	a, ts := newAPIServer(t)
	a.token = "s3cret"
	c := newClient(t, ts, "wrong")
	ctx := context.Background()
	_, err := c.GetPod(ctx, "agents", "moat-r1")
	if !apierrors.IsUnauthorized(err) || apierrors.IsNotFound(err) {
		t.Fatalf("get with a wrong token: %v, want Unauthorized", err)
	}
	if left, err := ObjectsLeft(ctx, c, "agents", "moat-r1"); err == nil {
		t.Fatalf("ObjectsLeft without access = %v, no error", left)
	}
	if live, err := PodLive(ctx, c, "agents", "moat-r1"); err == nil {
		t.Fatalf("PodLive without access = %v, no error", live)
	}
	// Control: the right token reaches the API (NotFound, no Pod).
	c = newClient(t, ts, "s3cret")
	if _, err := c.GetPod(ctx, "agents", "moat-r1"); !apierrors.IsNotFound(err) {
		t.Fatalf("get with the token: %v, want NotFound", err)
	}
	if left, err := ObjectsLeft(ctx, c, "agents", "moat-r1"); err != nil || len(left) != 0 {
		t.Fatalf("ObjectsLeft = %v, %v", left, err)
	}
}

func TestWatchPods(t *testing.T) {
	a, ts := newAPIServer(t)
	c := newClient(t, ts, "")
	w, err := c.WatchPods(context.Background(), "agents", metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", "moat-r1").String(), ResourceVersion: "42"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	r, _ := a.last()
	q := r.URL.Query()
	if r.URL.Path != "/api/v1/namespaces/agents/pods" || q.Get("watch") != "true" || q.Get("fieldSelector") != "metadata.name=moat-r1" || q.Get("resourceVersion") != "42" {
		t.Fatalf("watch sent %s?%s", r.URL.Path, r.URL.RawQuery)
	}
	a.watchEvs <- `{"type":"MODIFIED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"moat-r1","uid":"u1","resourceVersion":"43"},"status":{"phase":"Running","podIP":"10.1.2.3"}}}`
	a.watchEvs <- `{"type":"DELETED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"moat-r1","uid":"u1","resourceVersion":"44"}}}`
	close(a.watchEvs)
	var got []string
	for ev := range w.ResultChan() {
		pod, ok := ev.Object.(*corev1.Pod)
		if !ok {
			t.Fatalf("event %s carries %T", ev.Type, ev.Object)
		}
		got = append(got, fmt.Sprintf("%s %s %s %s", ev.Type, pod.UID, pod.Status.Phase, pod.Status.PodIP))
	}
	want := []string{"MODIFIED u1 Running 10.1.2.3", "DELETED u1  "}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
	var _ watch.Interface = w
}

func TestNodeInternalIP(t *testing.T) {
	a, ts := newAPIServer(t)
	c := newClient(t, ts, "")
	ctx := context.Background()
	node := func(name string, addrs ...corev1.NodeAddress) corev1.Node {
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Addresses: addrs}}
	}
	a.nodes = []corev1.Node{node("n1", corev1.NodeAddress{Type: corev1.NodeHostName, Address: "n1"}, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "192.0.2.7"})}
	if ip, err := NodeInternalIP(ctx, c); err != nil || ip != netip.MustParseAddr("192.0.2.7") {
		t.Fatalf("NodeInternalIP = %v, %v", ip, err)
	}
	a.nodes = []corev1.Node{node("n1", corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "fd00::7"}, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "192.0.2.9"})}
	if ip, err := NodeInternalIP(ctx, c); err != nil || ip != netip.MustParseAddr("192.0.2.9") {
		t.Fatalf("dual-stack NodeInternalIP = %v, %v, want the IPv4 one", ip, err)
	}
	a.nodes = a.nodes[:1:1]
	a.nodes[0].Status.Addresses = a.nodes[0].Status.Addresses[:1]
	if ip, err := NodeInternalIP(ctx, c); err != nil || ip != netip.MustParseAddr("fd00::7") {
		t.Fatalf("IPv6-only NodeInternalIP = %v, %v", ip, err)
	}
	a.nodes = append(a.nodes, node("n2", corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "192.0.2.8"}))
	var nc *NodeCountError
	if ip, err := NodeInternalIP(ctx, c); !errors.As(err, &nc) || nc.Nodes != 2 {
		t.Fatalf("two nodes: %v, %v", ip, err)
	}
	a.nodes = []corev1.Node{node("n1", corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "198.51.100.1"})}
	if ip, err := NodeInternalIP(ctx, c); err == nil || !strings.Contains(err.Error(), "no InternalIP") {
		t.Fatalf("no InternalIP: %v, %v", ip, err)
	}
}

func TestExecURL(t *testing.T) {
	_, ts := newAPIServer(t)
	c := newClient(t, ts, "")
	u := c.ExecURL("agents", "moat-r1", &corev1.PodExecOptions{Container: "sandbox", Command: []string{"/usr/local/bin/moat", "-x", "a b"}, Stdin: true, Stderr: true, TTY: false})
	if u.Path != "/api/v1/namespaces/agents/pods/moat-r1/exec" || u.Host != strings.TrimPrefix(ts.URL, "http://") {
		t.Fatalf("exec URL %s", u)
	}
	q := u.Query()
	if !reflect.DeepEqual(q["command"], []string{"/usr/local/bin/moat", "-x", "a b"}) || q.Get("container") != "sandbox" ||
		q.Get("stdin") != "true" || q.Get("stderr") != "true" || q.Has("stdout") || q.Has("tty") {
		t.Fatalf("exec query %q", u.RawQuery)
	}
	u = c.ExecURL("agents", "moat-r1", &corev1.PodExecOptions{Container: "sandbox", Command: []string{"sh"}, Stdin: true, Stdout: true, TTY: true})
	if q := u.Query(); q.Get("tty") != "true" || q.Get("stdout") != "true" || q.Has("stderr") {
		t.Fatalf("tty exec query %q", u.RawQuery)
	}
}

func TestConfig(t *testing.T) {
	// https: client-go reads a user's credentials for https servers only.
	const server = "https://127.0.0.1:6443"
	kc := filepath.Join(t.TempDir(), "config")
	os.WriteFile(kc, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: %q}
users:
- name: u
  user: {token: tok}
contexts:
- name: x
  context: {cluster: c, user: u, namespace: agents}
current-context: x
`, server)), 0o600)
	cfg, err := Config(kc, false)
	if err != nil || cfg.Host != server || cfg.BearerToken != "tok" {
		t.Fatalf("Config = %+v, %v", cfg, err)
	}
	if _, err := Config(filepath.Join(t.TempDir(), "missing"), false); err == nil {
		t.Fatal("Config of a missing kubeconfig: no error")
	}
}
