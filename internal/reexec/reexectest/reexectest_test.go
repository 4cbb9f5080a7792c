package reexectest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
)

var echo = Helper("echo", func(args []string) int {
	fmt.Println(strings.Join(args, " "))
	return len(args)
})

func TestMain(m *testing.M) { Main(m, echo) }

// The helper runs in the test binary, with its arguments, and its exit code
// is the process's.
func TestCommand(t *testing.T) {
	out, err := Command(echo.Name, "a", "b").Output()
	if string(out) != "a b\n" {
		t.Fatalf("got %q (%v), want %q", out, err, "a b\n")
	}
	if err == nil || !strings.Contains(err.Error(), "exit status 2") {
		t.Fatalf("got %v, want exit status 2", err)
	}
	// Control: an unknown hidden name is refused, not run as tests.
	out, err = Command(echo.Name + "-not").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "unknown hidden helper") {
		t.Fatalf("got %q (%v), want a refusal", out, err)
	}
}

const parentEnv = "MOAT_REEXECTEST_PARENT"

// f runs in another process, a child of this one, and only there.
func TestRunInSubprocess(t *testing.T) {
	if !InSubprocess() {
		t.Setenv(parentEnv, strconv.Itoa(os.Getpid()))
	}
	ran := false
	RunInSubprocess(t, func() {
		ran = true
		parent, _ := strconv.Atoi(os.Getenv(parentEnv))
		if os.Getpid() == parent || os.Getppid() != parent {
			t.Fatalf("pid %d, parent %d: want a child of %d", os.Getpid(), os.Getppid(), parent)
		}
	})
	if ran != InSubprocess() {
		t.Fatalf("f ran here: %v, want %v", ran, InSubprocess())
	}
}

func TestRunPattern(t *testing.T) {
	for in, want := range map[string]string{
		"TestA":        "^TestA$",
		"TestA/b_c":    "^TestA$/^b_c$",
		"TestA/x.y(1)": `^TestA$/^x\.y\(1\)$`,
	} {
		if got := runPattern(in); got != want {
			t.Errorf("runPattern(%q): got %q, want %q", in, got, want)
		}
	}
}
