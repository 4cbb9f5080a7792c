package broker

import (
	"errors"
	"net/http"
	"testing"
)

// stateTools is a tool gateway that also takes the run's state, as
// broker/tools.Handler does (UseRunState).
type stateTools struct {
	accountTools
	failed func() error
	fatal  func(reason string, err error)
}

func (s *stateTools) UseRunState(failed func() error, fatal func(string, error)) {
	s.failed, s.fatal = failed, fatal
}

// TestToolsShareRunState: the broker tells the gateway its fatal event
// (so that no tool call follows an inference reflection or the refusal
// limit) and takes the gateway's (so that no inference, service request
// or tunnel follows a reflected tool result). Control: before either, the
// gateway sees a run that has not failed.
func TestToolsShareRunState(t *testing.T) {
	fp := newFakeProvider(t, false)
	gw := &stateTools{accountTools: accountTools{Handler: http.NotFoundHandler()}}
	h := startBroker(t, fp, testPolicy(fp.srv.URL, 10), nil, func(c *Config) { c.Tools = gw })
	if gw.failed == nil || gw.fatal == nil {
		t.Fatal("the broker did not share the run's state with the tool gateway")
	}
	if err := gw.failed(); err != nil {
		t.Fatalf("control: the run failed before anything happened: %v", err)
	}
	if r := h.raw(post("/v1/messages", anthropicBody)); r.status != 200 {
		t.Fatalf("control: inference %d", r.status)
	}
	gw.fatal("credential_reflected", errors.New("test: a tool result carried a credential"))
	expectFatal(t, h, ReasonCredentialReflect)
	if !h.b.failed.Load() {
		t.Error("the broker goes on after the gateway's fatal event")
	}
	if err := gw.failed(); err == nil {
		t.Error("the gateway does not see the run's fatal event")
	}
	if r := h.raw(post("/v1/messages", anthropicBody)); r.status != 503 {
		t.Errorf("inference after the gateway's fatal event: %d, want 503", r.status)
	}
}
