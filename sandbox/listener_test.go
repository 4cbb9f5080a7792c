package sandbox

import (
	"errors"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/broker"
	"github.com/moat-sandbox/moat/policy"
)

// TestAdmission: a connection the admission refuses is closed unread and
// reported; one it admits is served (the positive control, on the same
// listener); nil admission is the listener itself.
func TestAdmission(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if withAdmission(raw, nil, nil) != raw {
		t.Fatal("nil admission wrapped the listener")
	}
	var allowedPort atomic.Int64
	refusedCh := make(chan string, 4)
	ln := withAdmission(raw, func(a net.Addr) error {
		if int64(a.(*net.TCPAddr).Port) == allowedPort.Load() {
			return nil
		}
		return errors.New("not the sandbox's address")
	}, func(a net.Addr, why error) { refusedCh <- a.String() + ": " + why.Error() })
	defer ln.Close()
	served := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			served <- "accept: " + err.Error()
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(io.LimitReader(c, 5))
		served <- string(b)
	}()
	// Refused: a connection from a port that is not allowed.
	bad, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	bad.Write([]byte("hello"))
	select {
	case r := <-refusedCh:
		if r == "" {
			t.Error("empty refusal")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("refusal not reported")
	}
	bad.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := bad.Read(make([]byte, 1)); err == nil {
		t.Errorf("refused connection read %d bytes", n)
	}
	bad.Close()
	// Admitted: dial from a chosen local port.
	var d net.Dialer
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := probe.Addr().(*net.TCPAddr).Port
	allowedPort.Store(int64(port))
	probe.Close()
	d.LocalAddr = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}
	good, err := d.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	good.Write([]byte("hello"))
	good.Close()
	select {
	case got := <-served:
		if got != "hello" {
			t.Errorf("admitted connection served %q", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("admitted connection not served")
	}
}

// TestWorkloadKeyFor: a broker listener on a host address (the Kubernetes
// backend's) gets a random key per sandbox, which the workload's SDK
// variables carry in place of the placeholder; a loopback listener keeps
// the placeholder (the positive control of the same env builder).
func TestWorkloadKeyFor(t *testing.T) {
	pol := &policy.Policy{}
	pol.Inference.Providers = []policy.Provider{{Name: "a", API: "anthropic-messages"}, {Name: "o", API: "openai-chat"}}
	envOf := func(li boundary.ListenerInfo) (string, map[string]string) {
		s := &Session{pol: pol, BrokerPort: li.Port, brokerHost: li.Host, workloadKey: workloadKeyFor(li)}
		m := map[string]string{}
		for _, kv := range s.env(false) {
			k, v, _ := strings.Cut(kv, "=")
			m[k] = v
		}
		return s.workloadKey, m
	}
	off := boundary.ListenerInfo{Host: "10.244.0.1", Port: 9}
	k1, env1 := envOf(off)
	k2, env2 := envOf(off)
	if k1 == "" || k2 == "" || k1 == k2 || !strings.HasPrefix(k1, "moat-") || k1 == broker.Placeholder {
		t.Fatalf("off-sandbox listeners got keys %q and %q: want two different random moat- keys", k1, k2)
	}
	for i, c := range []struct {
		key string
		env map[string]string
	}{{k1, env1}, {k2, env2}} {
		for _, v := range []string{"ANTHROPIC_API_KEY", "OPENAI_API_KEY"} {
			if c.env[v] != c.key {
				t.Errorf("sandbox %d: %s = %q, want its key %q", i, v, c.env[v], c.key)
			}
		}
		if c.env[broker.BrokerURLEnv] != "http://10.244.0.1:9" {
			t.Errorf("sandbox %d: %s = %q, want the host address", i, broker.BrokerURLEnv, c.env[broker.BrokerURLEnv])
		}
	}
	k, env := envOf(boundary.ListenerInfo{Port: 9})
	if k != "" || env["ANTHROPIC_API_KEY"] != broker.Placeholder || env["OPENAI_API_KEY"] != broker.Placeholder {
		t.Errorf("loopback listener: key %q, ANTHROPIC_API_KEY %q, OPENAI_API_KEY %q; want no key and the placeholder", k, env["ANTHROPIC_API_KEY"], env["OPENAI_API_KEY"])
	}
}
