package native

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/boundary/internal/initkit"
)

func FuzzDecodeCtl(f *testing.F) {
	f.Add([]byte(`{"op":"ready","port":4242}`))
	f.Add([]byte(`{"op":"start","id":1,"argv":["sh","-c","true"],"env":["PATH=/bin"],"helper":true}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeCtl(b)
		if err == nil && m.Op == "" {
			t.Fatalf("accepted a message without op: %q", b)
		}
	})
}

func TestDecodeCtlRefuses(t *testing.T) {
	for name, in := range map[string]string{
		"unknown field": `{"op":"ready","port":1,"extra":1}`,
		"trailing":      `{"op":"ready"}{"op":"ready"}`,
		"no op":         `{"port":1}`,
		"not json":      `op=ready`,
		"too large":     `{"op":"x","err":"` + strings.Repeat("a", initkit.MaxMessage) + `"}`,
	} {
		t.Run(name, func(t *testing.T) {
			if m, err := decodeCtl([]byte(in)); err == nil {
				t.Errorf("decodeCtl(%.40q): got %+v, want an error", in, m)
			}
		})
	}
	if m, err := decodeCtl([]byte(`{"op":"exited","id":3,"code":7}`)); err != nil || m.ID != 3 || m.Code != 7 {
		t.Errorf("decodeCtl(valid): got %+v, %v", m, err)
	}
}

func FuzzParseFdinfoPid(f *testing.F) {
	f.Add([]byte("pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\nPid:\t4242\nNSpid:\t4242\t1\n"))
	f.Add([]byte("Pid:\t-1\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if pid := parseFdinfoPid(bytes.NewReader(b)); pid < 0 {
			t.Fatalf("negative pid %d from %q", pid, b)
		}
	})
}

func TestParseFdinfoPid(t *testing.T) {
	for in, want := range map[string]int{
		"pos:\t0\nPid:\t4242\nNSpid:\t4242\t1\n": 4242,
		"Pid:\t-1\n":                             0,
		"Pid:\tx\n":                              0,
		"":                                       0,
	} {
		if got := parseFdinfoPid(strings.NewReader(in)); got != want {
			t.Errorf("parseFdinfoPid(%q): got %d, want %d", in, got, want)
		}
	}
}

func FuzzParseCgroupPath(f *testing.F) {
	f.Add([]byte("4:memory:/process_api/5d00\n8:pids:/\n0::/\n"), "memory")
	f.Add([]byte("4:memory,pids:/a/../b\n"), "pids")
	f.Fuzz(func(t *testing.T, b []byte, ctrl string) {
		p := parseCgroupPath(bytes.NewReader(b), ctrl)
		if !filepath.IsAbs(p) || filepath.Clean(p) != p {
			t.Fatalf("parseCgroupPath returned %q, not a clean absolute path", p)
		}
	})
}

func TestParseCgroupPath(t *testing.T) {
	in := "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/5d00\n3:cpu,cpuacct:/x\n5:devices:../escape\n"
	for ctrl, want := range map[string]string{"memory": "/process_api/5d00", "pids": "/", "cpuacct": "/x", "devices": "/", "blkio": "/", "": "/"} {
		if got := parseCgroupPath(strings.NewReader(in), ctrl); got != want {
			t.Errorf("parseCgroupPath(%q): got %q, want %q", ctrl, got, want)
		}
	}
}
