//go:build linux

package e2e

import (
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/reexec"
)

// helperArg makes the test binary act as an in-sandbox probe: each further
// argument is one action "kind=arg", and the probe prints one line per
// action, "kind=arg ok" or "kind=arg err <reason>". The tests judge these
// lines together with what host-side receivers observed.
const helperArg = reexec.Prefix + "test-e2e-probe"

func helperMain(actions []string) int {
	for _, a := range actions {
		kind, arg, _ := strings.Cut(a, "=")
		err := probeAction(kind, arg)
		if err != nil {
			fmt.Printf("%s err %v\n", a, err)
		} else {
			fmt.Printf("%s ok\n", a)
		}
	}
	return 0
}

const dialTimeout = 2 * time.Second

func probeAction(kind, arg string) error {
	switch kind {
	case "read":
		_, err := os.ReadFile(arg)
		return err
	case "write":
		return os.WriteFile(arg, []byte("written from inside\n"), 0o644)
	case "tcp":
		c, err := net.DialTimeout("tcp", arg, dialTimeout)
		if err == nil {
			_, err = c.Write([]byte("escape\n"))
			c.Close()
		}
		return err
	case "udp":
		c, err := net.Dial("udp", arg)
		if err == nil {
			_, err = c.Write([]byte("escape\n"))
			c.Close()
		}
		return err
	case "abstract", "unix":
		name := arg
		if kind == "abstract" {
			name = "@" + arg
		}
		c, err := net.DialTimeout("unix", name, dialTimeout)
		if err == nil {
			_, err = c.Write([]byte("escape\n"))
			c.Close()
		}
		return err
	case "unixgram":
		c, err := net.Dial("unixgram", arg)
		if err == nil {
			_, err = c.Write([]byte("escape\n"))
			c.Close()
		}
		return err
	case "broker":
		// The broker's address comes from the environment moat sets.
		u := os.Getenv("MOAT_BROKER_URL")
		hostport := strings.TrimPrefix(u, "http://")
		c, err := net.DialTimeout("tcp", hostport, dialTimeout)
		if err == nil {
			c.Close()
		}
		return err
	case "wait-file":
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if _, err := os.Stat(arg); err == nil {
				return nil
			}
			time.Sleep(10 * time.Millisecond)
		}
		return fmt.Errorf("timed out")
	case "unshare-user":
		// clone(CLONE_NEWUSER) in a fresh child, as `unshare -U` does:
		// unshare(2) from a multi-threaded Go process is always EINVAL.
		cmd := exec.Command("/bin/true")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER}
		return cmd.Run()
	case "io_uring":
		var params [120]byte
		fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, 4, uintptr(unsafe.Pointer(&params[0])), 0)
		if errno != 0 {
			return errno
		}
		unix.Close(int(fd))
		return nil
	case "keyctl":
		_, err := unix.KeyctlJoinSessionKeyring("moat-e2e")
		return err
	case "ptrace":
		pid, _ := strconv.Atoi(arg)
		err := unix.PtraceAttach(pid)
		if err == nil {
			unix.PtraceDetach(pid)
		}
		return err
	case "ptrace-child":
		// A sibling process at the same uid: only the seccomp filter stands
		// between the workload and ptrace here.
		p, err := os.StartProcess("/bin/sleep", []string{"sleep", "5"}, &os.ProcAttr{Files: []*os.File{nil, nil, nil}})
		if err != nil {
			return fmt.Errorf("control: cannot start a child: %v", err)
		}
		defer func() { p.Kill(); p.Wait() }()
		err = unix.PtraceAttach(p.Pid)
		if err == nil {
			unix.PtraceDetach(p.Pid)
		}
		return err
	case "mcp":
		return mcpProbe(arg) // tools_test.go
	case "sdk-anthropic", "sdk-anthropic-stream", "sdk-openai-chat", "sdk-openai-responses":
		out, err := sdkCall(kind, arg)
		if err == nil {
			fmt.Printf("answer %s=%s %q\n", kind, arg, out)
		}
		return err
	case "raw":
		// arg: base64 of raw bytes sent to the broker on a new connection;
		// prints the status code the broker answered, or how it ended.
		b, err := base64.StdEncoding.DecodeString(arg)
		if err != nil {
			return err
		}
		hostport := strings.TrimPrefix(os.Getenv("MOAT_BROKER_URL"), "http://")
		c, err := net.DialTimeout("tcp", hostport, dialTimeout)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write(b); err != nil {
			fmt.Printf("rawresult %s\n", "write-failed")
			return nil
		}
		resp, err := io.ReadAll(c)
		status := "closed-without-response"
		if l, _, ok := strings.Cut(string(resp), "\r\n"); ok && strings.HasPrefix(l, "HTTP/1.1 ") && len(l) >= 12 {
			status = l[9:12]
		} else if err != nil {
			status = "error: " + err.Error()
		}
		fmt.Printf("rawresult %s\n", status)
		return nil
	case "socket":
		// arg: family,type,proto
		f := strings.Split(arg, ",")
		if len(f) != 3 {
			return fmt.Errorf("bad socket arg %q", arg)
		}
		fam, typ, proto := sockConst(f[0]), sockConst(f[1]), sockConst(f[2])
		fd, err := unix.Socket(fam, typ, proto)
		if err == nil {
			unix.Close(fd)
		}
		return err
	case "kill0":
		pid, _ := strconv.Atoi(arg)
		return unix.Kill(pid, 0)
	case "fds":
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			return err
		}
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		fmt.Printf("fds: %s\n", strings.Join(names, " "))
		return nil
	case "pids":
		ents, err := os.ReadDir("/proc")
		if err != nil {
			return err
		}
		var pids []string
		for _, e := range ents {
			if _, err := strconv.Atoi(e.Name()); err == nil {
				pids = append(pids, e.Name())
			}
		}
		fmt.Printf("pids: %s\n", strings.Join(pids, " "))
		return nil
	case "env":
		fmt.Printf("env: %s\n", strings.Join(os.Environ(), " "))
		return nil
	case "fork":
		pid, err := os.StartProcess("/bin/true", []string{"true"}, &os.ProcAttr{Files: []*os.File{nil, nil, nil}})
		if err != nil {
			return err
		}
		st, err := pid.Wait()
		if err != nil {
			return err
		}
		if !st.Success() {
			return fmt.Errorf("true: %v", st)
		}
		return nil
	}
	return fmt.Errorf("unknown action %q", kind)
}

func sockConst(s string) int {
	switch s {
	case "inet":
		return unix.AF_INET
	case "inet6":
		return unix.AF_INET6
	case "unix":
		return unix.AF_UNIX
	case "packet":
		return unix.AF_PACKET
	case "vsock":
		return unix.AF_VSOCK
	case "netlink":
		return unix.AF_NETLINK
	case "stream":
		return unix.SOCK_STREAM
	case "dgram":
		return unix.SOCK_DGRAM
	case "raw":
		return unix.SOCK_RAW
	case "mptcp":
		return unix.IPPROTO_MPTCP
	}
	n, _ := strconv.Atoi(s)
	return n
}
