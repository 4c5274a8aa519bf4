package reexec

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

const testEnv = "TOOLHOST_REEXEC_TEST"

func init() {
	Register(testEnv, func(v string) int {
		os.Stdout.WriteString("helper ran with " + v + "\n")
		return 7
	})
}

func TestMain(m *testing.M) {
	Main()
	os.Exit(m.Run())
}

// TestMainRunsTheHelper re-executes this test binary with the variable set: Main runs the
// helper, which gets the variable's value, and exits with its status before any test runs.
func TestMainRunsTheHelper(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run", "^$")
	cmd.Env = append(os.Environ(), testEnv+"=abc")
	out, err := cmd.Output()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("exit: %v (want status 7); output %q", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "helper ran with abc" {
		t.Errorf("output %q", got)
	}
}

func TestRunWithoutVariable(t *testing.T) {
	if _, ok := run(func(string) (string, bool) { return "", false }); ok {
		t.Error("a helper ran with no variable set")
	}
	if err := Check(); err != nil {
		t.Errorf("Check after Main: %v", err)
	}
}

func TestRegisterTwicePanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("registering a variable twice did not panic")
		}
	}()
	Register(testEnv, func(string) int { return 0 })
}
