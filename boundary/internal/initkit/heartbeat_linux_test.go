package initkit

import (
	"testing"
	"time"
)

// TestHeartbeat: an init end armed with a timeout keeps receiving while
// the supervisor end beats (for several timeouts), and reports the
// supervisor lost within about the timeout once no message comes.
func TestHeartbeat(t *testing.T) {
	sup, in := pair(t)
	// The positive control's timeout leaves a beat (every timeout/4)
	// 1.5 s of scheduling delay on a loaded machine under -race; the
	// silent case below needs no such room and uses a short one.
	const beatTimeout = 2 * time.Second
	const timeout = 400 * time.Millisecond
	go sup.Heartbeats(testMsg{Op: HeartbeatOp}, beatTimeout)
	// Positive control: beats for three timeouts, every Recv in time.
	end := time.Now().Add(3 * beatTimeout)
	beats := 0
	for time.Now().Before(end) {
		if err := in.ArmHeartbeat(beatTimeout); err != nil {
			t.Fatal(err)
		}
		var m testMsg
		if _, err := in.Recv(&m); err != nil {
			t.Fatalf("with the supervisor beating: %v", err)
		}
		if m.Op != HeartbeatOp {
			t.Fatalf("got op %q", m.Op)
		}
		beats++
	}
	if beats < 6 {
		t.Errorf("%d beats in %s, want about 12", beats, 3*beatTimeout)
	}

	// No beats at all (a second channel, whose supervisor end sends
	// nothing, as a stopped supervisor): lost after the timeout.
	_, quiet := pair(t)
	start := time.Now()
	if err := quiet.ArmHeartbeat(timeout); err != nil {
		t.Fatal(err)
	}
	var m testMsg
	_, err := quiet.Recv(&m)
	if !SupervisorLost(err) {
		t.Fatalf("silent supervisor: got %v, want a lost supervisor", err)
	}
	if d := time.Since(start); d < timeout || d > timeout+2*time.Second {
		t.Errorf("lost after %s, want about %s", d, timeout)
	}
	// A closed channel is not a lost heartbeat but the supervisor's end.
	if err := in.ArmHeartbeat(0); err != nil {
		t.Fatal(err)
	}
	sup.Close()
	for {
		if _, err := in.Recv(&m); err != nil {
			if SupervisorLost(err) || err != ErrClosed {
				t.Errorf("closed supervisor end: got %v, want ErrClosed", err)
			}
			break
		}
	}
}
