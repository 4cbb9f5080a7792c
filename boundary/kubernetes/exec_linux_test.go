package kubernetes

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/internal/reexec"
	"github.com/moat-sandbox/moat/internal/reexec/reexectest"
	"github.com/moat-sandbox/moat/internal/testenv"
)

// procDirEnv gives the stage that the tests run (this test binary) a
// procDir of the test's own instead of /tmp/.moat-procs.
const procDirEnv = "MOAT_TEST_K8S_PROCDIR"

func TestMain(m *testing.M) {
	if d := os.Getenv(procDirEnv); d != "" {
		procDir = d
	}
	reexectest.Main(m, reexec.Helper{Name: StageHelper, Main: StageMain})
}

// podExec stands in for the exec API: each request it is given is
// recorded, and streaming it runs the command with this test binary as
// moat's binary in the image (so the stage is the real StageMain) and the
// stream's stdin, stdout and stderr as the process's.
type podExec struct {
	procDir string
	mu      sync.Mutex
	reqs    []corev1.PodExecOptions
}

func newPodExec(t *testing.T) *podExec { return &podExec{procDir: t.TempDir()} }

func (x *podExec) sandbox() *sandbox {
	return &sandbox{gone: make(chan struct{}), stopWatch: make(chan struct{}), newExecutor: x.executor}
}

func (x *podExec) executor(o *corev1.PodExecOptions) (remotecommand.Executor, error) {
	x.mu.Lock()
	x.reqs = append(x.reqs, *o)
	x.mu.Unlock()
	return &childExec{x: x, o: *o}, nil
}

func (x *podExec) requests() []corev1.PodExecOptions {
	x.mu.Lock()
	defer x.mu.Unlock()
	return slices.Clone(x.reqs)
}

type childExec struct {
	x *podExec
	o corev1.PodExecOptions
}

func (c *childExec) Stream(opts remotecommand.StreamOptions) error {
	return c.StreamWithContext(context.Background(), opts)
}

func (c *childExec) StreamWithContext(ctx context.Context, opts remotecommand.StreamOptions) error {
	if len(c.o.Command) < 2 || c.o.Command[0] != MoatInImage {
		return errors.New("not moat's binary in the image")
	}
	cmd := exec.CommandContext(ctx, reexectest.Self(), c.o.Command[1:]...)
	cmd.Env = append(os.Environ(), procDirEnv+"="+c.x.procDir)
	if c.o.Stdin != (opts.Stdin != nil) || c.o.Stdout != (opts.Stdout != nil) || c.o.Stderr != (opts.Stderr != nil) || c.o.TTY != opts.Tty {
		return errors.New("the streams do not match the request")
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = opts.Stdin, opts.Stdout, opts.Stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return utilexec.CodeExitError{Err: err, Code: ee.ExitCode()}
	}
	return err
}

// secretEnv is a workload environment with a broker key in it (as the
// SDK variables carry it) and the words that must stay out of every
// exec's command.
func secretEnv() (env, secrets []string) {
	key := "mk-0123456789abcdef0123456789abcdef0123456789abcdef"
	env = []string{"PATH=/usr/bin:/bin", "MOAT_BROKER_KEY=" + key, "ANTHROPIC_API_KEY=" + key, "MOAT_OTHER=visible-only-inside"}
	return env, []string{key, "MOAT_BROKER_KEY", "ANTHROPIC_API_KEY", "visible-only-inside", "PATH="}
}

// checkCommands fails t when an exec's command holds any of secrets or
// anything but moat's binary, the stage and (for a terminal) the
// stage's load arguments.
func checkCommands(t *testing.T, reqs []corev1.PodExecOptions, secrets []string) {
	t.Helper()
	if len(reqs) == 0 {
		t.Fatal("no exec request made")
	}
	for _, r := range reqs {
		joined := strings.Join(r.Command, "\x00")
		for _, s := range secrets {
			if strings.Contains(joined, s) {
				t.Errorf("exec command %q holds %q", r.Command, s)
			}
		}
		if !r.Stdin {
			t.Errorf("exec %q without stdin: the stage's configuration has no way in", r.Command)
		}
		switch c := r.Command; {
		case slices.Equal(c, []string{MoatInImage, StageHelper}), slices.Equal(c, []string{MoatInImage, StageHelper, stageSave}):
		case len(c) == 5 && c[0] == MoatInImage && c[1] == StageHelper && c[2] == stageLoad && validID(c[3]) && len(c[4]) == 64:
		default:
			t.Errorf("exec command %q", c)
		}
	}
}

func waitCode(t *testing.T, r boundary.Running) int {
	t.Helper()
	code, err := r.Wait()
	if err != nil {
		t.Fatalf("wait: %v", err)
	}
	return code
}

// TestExecCommandCarriesNoSecret (red team F11): the exec request's
// command holds neither the broker key nor any other environment value
// nor name; the control in the same runs: the workload sees its
// environment, working directory and the caller's stdin byte for byte
// after the frame, and /dev/null when the caller gave none.
func TestExecCommandCarriesNoSecret(t *testing.T) {
	env, secrets := secretEnv()
	script := `printf '%s|%s|%s|' "$MOAT_BROKER_KEY" "$MOAT_OTHER" "$PWD"; cat; printf '|end'`
	wantEnv := env[1][len("MOAT_BROKER_KEY="):] + "|visible-only-inside|/usr|"
	for _, tt := range []struct {
		name  string
		stdin []byte
	}{
		{"stdin", []byte("the workload's own\x00stdin moatstg1\n")},
		{"no stdin", nil},
		{"stdin empty", []byte{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			x := newPodExec(t)
			var out, errb bytes.Buffer
			p := boundary.Process{Argv: []string{"/bin/sh", "-c", script}, Env: env, Dir: "/usr", Stdout: &out, Stderr: &errb}
			if tt.stdin != nil {
				p.Stdin = bytes.NewReader(tt.stdin)
			}
			r, err := x.sandbox().Start(context.Background(), p)
			if err != nil {
				t.Fatal(err)
			}
			if code := waitCode(t, r); code != 0 {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			if want := wantEnv + string(tt.stdin) + "|end"; out.String() != want {
				t.Errorf("the workload printed %q, want %q (stderr %q)", out.String(), want, errb.String())
			}
			checkCommands(t, x.requests(), secrets)
		})
	}
	t.Run("helper", func(t *testing.T) {
		x := newPodExec(t)
		var out bytes.Buffer
		r, err := x.sandbox().StartHelper(context.Background(), []string{"__moat-measure"}, boundary.Process{Env: env, Stdout: &out, Stderr: &out})
		if err != nil {
			t.Fatal(err)
		}
		// The stage decoded the frame and tried moat's binary in the
		// image, which this host does not have.
		if code := waitCode(t, r); code != boundary.ExitNotFound || !strings.Contains(out.String(), MoatInImage) {
			t.Errorf("helper: exit %d: %s", code, out.String())
		}
		checkCommands(t, x.requests(), secrets)
	})
}

// TestExecTTYCarriesNoSecret: a terminal exec's configuration is saved
// in the Pod by an exec of its own (stdin, no terminal) and the
// terminal's exec names it by id and digest only; the workload on the
// terminal sees its environment.
func TestExecTTYCarriesNoSecret(t *testing.T) {
	master, slave := openPTY(t)
	env, secrets := secretEnv()
	x := newPodExec(t)
	r, err := x.sandbox().Start(context.Background(), boundary.Process{
		Argv: []string{"/bin/sh", "-c", `[ -t 0 ] && printf 'tty|'; printf '%s|done\n' "$MOAT_BROKER_KEY"`},
		Env:  env, Dir: "/", TTY: slave,
	})
	if err != nil {
		t.Fatal(err)
	}
	slave.Close()
	got := readUntil(master, "|done")
	if code := waitCode(t, r); code != 0 {
		t.Fatalf("exit %d", code)
	}
	select {
	case s := <-got:
		if want := "tty|" + env[1][len("MOAT_BROKER_KEY="):] + "|done"; !strings.Contains(s, want) {
			t.Errorf("the terminal showed %q, want %q", s, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("nothing on the terminal")
	}
	reqs := x.requests()
	checkCommands(t, reqs, secrets)
	if len(reqs) != 2 || !slices.Equal(reqs[0].Command, []string{MoatInImage, StageHelper, stageSave}) || reqs[0].TTY || !reqs[1].TTY || reqs[1].Command[2] != stageLoad {
		t.Errorf("requests: %+v", reqs)
	}
	if left, _ := filepath.Glob(filepath.Join(x.procDir, "*.stage")); len(left) != 0 {
		t.Errorf("saved configurations left: %v", left)
	}
}

// readUntil reads master until what it read holds end, or until a read
// fails, and then sends all it read.
func readUntil(master *os.File, end string) <-chan string {
	got := make(chan string, 1)
	go func() {
		var acc []byte
		b := make([]byte, 4096)
		for !bytes.Contains(acc, []byte(end)) {
			n, err := master.Read(b)
			if err != nil {
				break
			}
			acc = append(acc, b[:n]...)
		}
		got <- string(acc)
	}()
	return got
}

func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	testenv.Need(t, err == nil, "no /dev/ptmx")
	t.Cleanup(func() { master.Close() })
	if err := unix.IoctlSetPointerInt(int(master.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(master.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	slave, err = os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	return master, slave
}

// TestStageRefusesBadFraming: the stage refuses (exit 125, nothing run)
// stdin that is not a frame, a frame cut short, a frame over the bound,
// and the configuration as an argument (an older moat's exec); the
// control in the same setup: a well-formed frame runs.
func TestStageRefusesBadFraming(t *testing.T) {
	cfg := stageConfig{ID: "p1", Argv: []string{"/bin/sh", "-c", "echo ran"}, Env: []string{}, Dir: "/"}
	good, err := encodeStageFrame(cfg)
	if err != nil {
		t.Fatal(err)
	}
	big := append([]byte(stageMagic), 0, 2, 0, 0) // 128 KiB declared
	big = append(big, bytes.Repeat([]byte{' '}, 200)...)
	for _, tt := range []struct {
		name  string
		args  []string
		stdin []byte
		code  int
		want  string
	}{
		{"control", nil, good, 0, "ran"},
		{"not a frame", nil, []byte(`{"id":"p1"}` + "\n"), boundary.ExitRefused, "does not start with a configuration frame"},
		{"empty", nil, nil, boundary.ExitRefused, "no configuration frame"},
		{"cut short", nil, good[:len(good)-3], boundary.ExitRefused, "cut short"},
		{"over the bound", nil, big, boundary.ExitRefused, "want 1 to"},
		{"zero length", nil, append([]byte(stageMagic), 0, 0, 0, 0), boundary.ExitRefused, "want 1 to"},
		{"argument", []string{string(good[stageHeaderLen:])}, good, boundary.ExitRefused, "unexpected arguments"},
		{"save without nonce", []string{stageSave}, good, boundary.ExitRefused, "no nonce"},
		{"load unsaved", []string{stageLoad, "p1", strings.Repeat("0", 64)}, nil, boundary.ExitRefused, "saved configuration"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cmd := reexectest.Command(StageHelper, tt.args...)
			cmd.Env = append(os.Environ(), procDirEnv+"="+t.TempDir())
			cmd.Stdin = bytes.NewReader(tt.stdin)
			out, _ := cmd.CombinedOutput()
			if code := cmd.ProcessState.ExitCode(); code != tt.code || !strings.Contains(string(out), tt.want) {
				t.Errorf("exit %d, output %q; want %d and %q", code, out, tt.code, tt.want)
			}
			if tt.code != 0 && strings.Contains(string(out), "ran") {
				t.Errorf("the command ran: %q", out)
			}
		})
	}
}

// TestLoadStageConfig: a saved frame loads once, with its digest and id;
// a changed, foreign, trailing, symlinked or missing one is refused.
func TestLoadStageConfig(t *testing.T) {
	cfg := stageConfig{ID: "p3", Argv: []string{"/bin/true"}, Env: []string{"K=v"}, Dir: "/", Stdin: true, Nonce: strings.Repeat("ab", 16)}
	frame, err := encodeStageFrame(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha(frame)
	save := func(t *testing.T, b []byte) string {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, stageFileName("p3")), b, 0o600); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	t.Run("control", func(t *testing.T) {
		dir := save(t, frame)
		got, err := loadStageConfig(dir, "p3", sum)
		if err != nil || !slices.Equal(got.Env, cfg.Env) || got.Nonce != cfg.Nonce {
			t.Fatalf("%+v %v", got, err)
		}
		if _, err := loadStageConfig(dir, "p3", sum); err == nil {
			t.Error("loaded twice")
		}
	})
	changed := bytes.Replace(frame, []byte("K=v"), []byte("K=w"), 1)
	noNonce, _ := encodeStageFrame(stageConfig{ID: "p3", Argv: []string{"/bin/true"}, Env: []string{}, Dir: "/"})
	other, _ := encodeStageFrame(stageConfig{ID: "p4", Argv: []string{"/bin/true"}, Env: []string{}, Dir: "/", Nonce: cfg.Nonce})
	trailing := append(slices.Clone(frame), 'x')
	for _, tt := range []struct {
		name string
		file []byte
		sum  string
	}{
		{"changed", changed, sum},
		{"no nonce", noNonce, sha(noNonce)},
		{"another id's", other, sha(other)},
		{"trailing", trailing, sha(trailing)},
		{"bad digest", frame, strings.ToUpper(sum)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := loadStageConfig(save(t, tt.file), "p3", tt.sum); err == nil {
				t.Error("accepted")
			}
		})
	}
	t.Run("symlink", func(t *testing.T) {
		dir := t.TempDir()
		real := filepath.Join(dir, "real")
		os.WriteFile(real, frame, 0o600)
		os.Symlink(real, filepath.Join(dir, stageFileName("p3")))
		if _, err := loadStageConfig(dir, "p3", sum); err == nil {
			t.Error("followed a symlink")
		}
	})
	t.Run("fifo", func(t *testing.T) {
		dir := t.TempDir()
		if err := unix.Mkfifo(filepath.Join(dir, stageFileName("p3")), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := loadStageConfig(dir, "p3", sum); err == nil {
			t.Error("read a fifo")
		}
	})
}
