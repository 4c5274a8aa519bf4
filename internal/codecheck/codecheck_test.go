package codecheck

import (
	"path/filepath"
	"strings"
	"testing"
)

// The repository's code keeps every rule of Rules: each exec.Cmd has a WaitDelay, no init
// ends the process, no error is matched by its text.
func TestHouseRules(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	files, err := GoFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 100 {
		t.Fatalf("found only %d Go files under %s", len(files), root)
	}
	found, err := ReadAndCheck(files)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range found {
		t.Error(f)
	}
}

func TestExecWithoutWaitDelay(t *testing.T) {
	for _, c := range []struct {
		name, src string
		want      int
	}{
		{"command", `package p; import "os/exec"; func f() { c := exec.Command("x"); c.Run() }`, 1},
		{"context", `package p; import "os/exec"; func f() { exec.CommandContext(nil, "x").Run() }`, 1},
		{"literal", `package p; import "os/exec"; func f() *exec.Cmd { return &exec.Cmd{Path: "x"} }`, 1},
		{"renamed", `package p; import ex "os/exec"; func f() { ex.Command("x").Run() }`, 1},
		{"set", `package p; import ("os/exec"; "time"); func f() { c := exec.Command("x"); c.WaitDelay = time.Second; c.Run() }`, 0},
		{"set in literal", `package p; import ("os/exec"; "time"); func f() *exec.Cmd { return &exec.Cmd{Path: "x", WaitDelay: time.Second} }`, 0},
		{"in a closure", `package p; import ("os/exec"; "time"); func f() { g := func() { c := exec.Command("x"); c.WaitDelay = time.Second }; g() }`, 0},
		{"no exec", `package p; func f() {}`, 0},
	} {
		got, err := ExecWithoutWaitDelay(c.name+".go", []byte(strings.ReplaceAll(c.src, "; ", "\n")))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if len(got) != c.want {
			t.Errorf("%s: %d findings %v, want %d", c.name, len(got), got, c.want)
		}
	}
}

func TestExitInInit(t *testing.T) {
	for _, c := range []struct {
		name, src string
		want      int
	}{
		{"exit", `package p; import "os"; func init() { if os.Getenv("X") != "" { os.Exit(1) } }`, 1},
		{"fatal", `package p; import "log"; func init() { log.Fatalf("x") }`, 1},
		{"registered", `package p; import "os"; func init() { register(func() { os.Exit(1) }) }; func register(func()) {}`, 0},
		{"elsewhere", `package p; import "os"; func main() { os.Exit(1) }`, 0},
		{"method", `package p; import "os"; type T struct{}; func (T) init() { os.Exit(1) }`, 0},
	} {
		got, err := ExitInInit(c.name+".go", []byte(strings.ReplaceAll(c.src, "; ", "\n")))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if len(got) != c.want {
			t.Errorf("%s: %d findings %v, want %d", c.name, len(got), got, c.want)
		}
	}
}

func TestErrorText(t *testing.T) {
	for _, c := range []struct {
		name, src string
		want      int
	}{
		{"contains", `package p; import "strings"; func f(err error) bool { return strings.Contains(err.Error(), "x") }`, 1},
		{"prefix", `package p; import "strings"; func f(err error) bool { return strings.HasPrefix(err.Error(), "x") }`, 1},
		{"renamed", `package p; import s "strings"; func f(err error) bool { return s.HasSuffix(err.Error(), "x") }`, 1},
		{"equal", `package p; func f(err error) bool { return err.Error() == "x" }`, 1},
		{"not equal", `package p; func f(err error) bool { return "x" != err.Error() }`, 1},
		{"switch", `package p; func f(err error) int { switch err.Error() { case "x": return 1 }; return 0 }`, 1},
		{"marked above", `package p; import "strings"; func f(err error) bool {; // codecheck:errtext the SDK's error has no type; return strings.Contains(err.Error(), "x") }`, 0},
		{"marked on the line", `package p; import "strings"; func f(err error) bool { return strings.Contains(err.Error(), "x") /* codecheck:errtext why */ }`, 0},
		{"text kept", `package p; func f(err error) string { return "failed: " + err.Error() }`, 0},
		{"other text", `package p; import "strings"; func f(s string) bool { return strings.Contains(s, "x") }`, 0},
	} {
		got, err := ErrorText(c.name+".go", []byte(strings.ReplaceAll(c.src, "; ", "\n")))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if len(got) != c.want {
			t.Errorf("%s: %d findings %v, want %d", c.name, len(got), got, c.want)
		}
	}
}
