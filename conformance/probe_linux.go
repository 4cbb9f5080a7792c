package conformance

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// EUIDMain prints the effective uid (run setuid-root).
func EUIDMain([]string) int { fmt.Printf("euid=%d\n", os.Geteuid()); return 0 }

const probeTimeout = 2 * time.Second

// ProbeMain: each argument is "kind=arg"; prints "kind=arg ok [detail]" or
// "kind=arg err <reason>". It claims nothing else.
func ProbeMain(actions []string) int {
	for _, a := range actions {
		kind, arg, _ := strings.Cut(a, "=")
		detail, err := probeAction(kind, arg)
		if err != nil {
			fmt.Printf("%s err %v\n", a, err)
		} else if detail != "" {
			fmt.Printf("%s ok %s\n", a, detail)
		} else {
			fmt.Printf("%s ok\n", a)
		}
	}
	return 0
}

func probeAction(kind, arg string) (string, error) {
	switch kind {
	case "read":
		b, err := os.ReadFile(arg)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%d bytes", len(b)), nil
	case "write":
		return "", os.WriteFile(arg, []byte("written by the conformance probe\n"), 0o644)
	case "tcp":
		c, err := net.DialTimeout("tcp", arg, probeTimeout)
		if err != nil {
			return "", err
		}
		defer c.Close()
		_, err = c.Write([]byte("conformance escape attempt\n"))
		return "", err
	case "udp":
		c, err := net.Dial("udp", arg)
		if err != nil {
			return "", err
		}
		defer c.Close()
		_, err = c.Write([]byte("conformance escape attempt"))
		return "", err
	case "dns-udp":
		return dnsUDP(arg)
	case "infer":
		return infer()
	case "unshare-user":
		// A new process in a new user namespace (clone with
		// CLONE_NEWUSER, as `unshare -U` does). unshare(2) itself cannot
		// serve here: a multi-threaded Go process always gets EINVAL.
		exe, err := os.Executable()
		if err != nil {
			return "", err
		}
		cmd := exec.Command(exe, EUIDHelper)
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER}
		out, err := cmd.Output()
		return strings.TrimSpace(string(out)), err
	case "fork":
		exe, err := os.Executable()
		if err != nil {
			return "", err
		}
		out, err := exec.Command(exe, EUIDHelper).Output()
		return strings.TrimSpace(string(out)), err
	case "ids":
		return fmt.Sprintf("uid=%d euid=%d gid=%d egid=%d", os.Getuid(), os.Geteuid(), os.Getgid(), os.Getegid()), nil
	case "caps":
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			return "", err
		}
		eff := uint64(data[1].Effective)<<32 | uint64(data[0].Effective)
		prm := uint64(data[1].Permitted)<<32 | uint64(data[0].Permitted)
		inh := uint64(data[1].Inheritable)<<32 | uint64(data[0].Inheritable)
		amb := 0
		for c := 0; c <= unix.CAP_LAST_CAP; c++ {
			if v, _ := unix.PrctlRetInt(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_IS_SET, uintptr(c), 0, 0); v == 1 {
				amb++
			}
		}
		return fmt.Sprintf("eff=%x prm=%x inh=%x amb=%d", eff, prm, inh, amb), nil
	case "exec-euid":
		out, err := exec.Command(arg, EUIDHelper).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("%v: %s", err, out)
		}
		return strings.TrimSpace(string(out)), nil
	case "plant":
		// plant=DIR>TARGET: rename DIR aside and put a symlink to TARGET
		// in its place (the attack on a nested grant's parent).
		dir, target, _ := strings.Cut(arg, ">")
		if err := os.Rename(dir, dir+".old"); err != nil {
			return "", err
		}
		return "", os.Symlink(target, dir)
	case "chmod":
		// chmod=PATH:MODE (octal), on a file the probe creates.
		path, m, _ := strings.Cut(arg, ":")
		mode, err := strconv.ParseUint(m, 8, 32)
		if err != nil {
			return "", err
		}
		if err := os.WriteFile(path, []byte("x"), 0o644); err != nil {
			return "", err
		}
		if err := unix.Chmod(path, uint32(mode)); err != nil {
			return "", err
		}
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil {
			return "", err
		}
		return fmt.Sprintf("mode %#o", st.Mode&0o7777), nil
	case "dgram":
		// dgram=PATH: send a datagram to a pathname socket, from a
		// datagram socketpair (no socket(2)) or else from socket(2).
		to := &unix.SockaddrUnix{Name: arg}
		if fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err == nil {
			err = unix.Sendto(fds[0], []byte("conformance escape attempt"), 0, to)
			unix.Close(fds[0])
			unix.Close(fds[1])
			if err == nil {
				return "sent from a socketpair", nil
			}
		}
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return "", fmt.Errorf("no datagram socket: %w", err)
		}
		defer unix.Close(fd)
		return "sent from socket(2)", unix.Sendto(fd, []byte("conformance escape attempt"), 0, to)
	case "fifo":
		return "", unix.Mknod(arg, unix.S_IFIFO|0o666, 0)
	case "sleep":
		n, _ := strconv.Atoi(arg)
		time.Sleep(time.Duration(n) * time.Second)
		return "", nil
	}
	return "", fmt.Errorf("unknown action %q", kind)
}

// dnsQuery is a minimal DNS query for "moat-conformance.invalid." A.
var dnsQuery = []byte{0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0,
	16, 'm', 'o', 'a', 't', '-', 'c', 'o', 'n', 'f', 'o', 'r', 'm', 'a', 'n', 'c', 'e',
	7, 'i', 'n', 'v', 'a', 'l', 'i', 'd', 0, 0, 1, 0, 1}

func dnsUDP(addr string) (string, error) {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if _, err := c.Write(dnsQuery); err != nil {
		return "", err
	}
	c.SetReadDeadline(time.Now().Add(probeTimeout))
	buf := make([]byte, 512)
	n, err := c.Read(buf)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("answer of %d bytes", n), nil
}

// infer makes one allowed request through the broker, configured only by
// the environment that moat set.
func infer() (string, error) {
	base := os.Getenv("ANTHROPIC_BASE_URL")
	if base == "" {
		return "", fmt.Errorf("ANTHROPIC_BASE_URL is not set")
	}
	body := fmt.Sprintf(`{"model":%q,"max_tokens":16,"messages":[{"role":"user","content":"conformance"}]}`, providerModel)
	req, err := http.NewRequest("POST", base+"/v1/messages", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("anthropic-version", "2023-06-01")
	req.Header.Set("x-api-key", os.Getenv("ANTHROPIC_API_KEY"))
	cl := &http.Client{Timeout: 10 * time.Second}
	resp, err := cl.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("status %d: %s", resp.StatusCode, strings.TrimSpace(b.String()))
	}
	return "status 200", nil
}

// ReceiverMain: `__moat-conf-receiver LOG tcp:ADDR… udp:ADDR…` listens and
// appends one line per arrival to LOG; it prints "ready" once listening.
func ReceiverMain(args []string) int {
	if len(args) < 2 {
		return 125
	}
	logf, err := os.OpenFile(args[0], os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 125
	}
	event := func(s string) { fmt.Fprintf(logf, "%s\n", s) }
	for _, a := range args[1:] {
		proto, addr, _ := strings.Cut(a, ":")
		switch proto {
		case "tcp":
			l, err := net.Listen("tcp", addr)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 125
			}
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					event("tcp " + l.Addr().String() + " from " + c.RemoteAddr().String())
					c.Close()
				}
			}()
		case "udp":
			pc, err := net.ListenPacket("udp", addr)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 125
			}
			go func() {
				buf := make([]byte, 1024)
				for {
					n, from, err := pc.ReadFrom(buf)
					if err != nil {
						return
					}
					event(fmt.Sprintf("udp %s from %v (%d bytes)", pc.LocalAddr(), from, n))
					pc.WriteTo(buf[:n], from) // answer, so that a reachable resolver would be seen to answer
				}
			}()
		}
	}
	fmt.Println("ready")
	select {}
}
