package codecheck

import (
	"path/filepath"
	"strings"
	"testing"
)

// The repository's code keeps every rule of Rules: each exec.Cmd has a WaitDelay, no init
// ends the process.
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
