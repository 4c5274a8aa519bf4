//go:build unix

package policytest_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/pdk"
	"github.com/toolhost/toolhost/pdk/policytest"
	"github.com/toolhost/toolhost/policy"
)

// A small plugin, registered natively: the tools a policy is about.
func init() {
	pdk.Plugin("docs-writer", "0.0.1")
	path := `{"type":"object","properties":{"path":{"type":"string"},"content":{"type":"string"}},"required":["path"]}`
	pdk.Register(pdk.Tool{Name: "write", Description: "Writes a file.", Schema: path, Run: func(in pdk.Input) abi.Result {
		if err := pdk.WriteFile(in.String("path"), []byte(in.String("content"))); err != nil {
			return pdk.Errorf("Error: %v", err)
		}
		return abi.Text("written")
	}})
	pdk.Register(pdk.Tool{Name: "read", Description: "Reads a file.", Schema: path, Run: func(in pdk.Input) abi.Result {
		b, err := pdk.ReadFile(in.String("path"))
		if err != nil {
			return pdk.Errorf("Error: %v", err)
		}
		return abi.Text(string(b))
	}})
	pdk.Register(pdk.Tool{Name: "ls", Description: "Lists the workspace.", Schema: `{"type":"object"}`, Run: func(pdk.Input) abi.Result {
		res, err := pdk.List(abi.ListRequest{Path: ".", Recursive: true})
		if err != nil {
			return pdk.Errorf("Error: %v", err)
		}
		var names []string
		for _, e := range res.Entries {
			names = append(names, e.Path)
		}
		return abi.Text(strings.Join(names, " "))
	}})
	pdk.Register(pdk.Tool{Name: "run", Description: "Runs argv.", Schema: `{"type":"object","properties":{"argv":{"type":"array","items":{"type":"string"}}}}`,
		Run: func(in pdk.Input) abi.Result {
			res, err := pdk.Exec(abi.ExecRequest{Argv: in.Strings("argv"), TimeoutMS: 60_000})
			if err != nil {
				return pdk.Errorf("Error: %v", err)
			}
			if res.TimedOut {
				return abi.Text("timed out")
			}
			return abi.Text(res.Stdout)
		}})
}

var docsWriter = policy.Scope{Files: &policy.Files{Read: []string{"**", "!**/.env"}, Write: []string{"docs/**"}}}

func TestFilesScope(t *testing.T) {
	h := policytest.New(t, docsWriter)
	h.Write("src/main.go", "package main\n")
	h.Write(".env", "TOKEN=1\n")

	if text, isErr := h.Call("write", `{"path":"docs/a.md","content":"hi"}`); isErr {
		t.Fatal(text)
	}
	h.MustAllow(policytest.Match{Tool: "write", Op: "write", Path: "docs/a.md"})

	for _, p := range []string{"src/main.go", "docs/../src/main.go", "/home/user/src/main.go"} {
		text, isErr := h.Call("write", `{"path":"`+p+`","content":"pwned"}`)
		if !isErr || !strings.Contains(text, "policy: plugin docs-writer may not write src/main.go (allowed: docs/**)") {
			t.Errorf("write %s: %q", p, text)
		}
	}
	h.MustDeny(policytest.Match{Op: "write", Path: "src/main.go"})
	if h.Read("src/main.go") != "package main\n" {
		t.Fatal("a refused write changed the file")
	}
	if text, _ := h.Call("read", `{"path":".env"}`); !strings.Contains(text, "may not read .env") {
		t.Errorf("read .env: %q", text)
	}
	os.Symlink("../src/main.go", filepath.Join(h.Root, "docs", "evil.md"))
	if text, _ := h.Call("write", `{"path":"docs/evil.md","content":"pwned"}`); !strings.Contains(text, "docs/evil.md is a symbolic link") {
		t.Errorf("write through a link: %q", text)
	}
	if text, _ := h.Call("ls", `{}`); strings.Contains(text, ".env") || !strings.Contains(text, "src/main.go") {
		t.Errorf("ls shows what it may not read: %q", text)
	}
	// A test can also say what must never have happened.
	h.MustNotAllow(policytest.Match{Op: "write", Path: "src/main.go"})
	if n := len(h.Calls()); n < 7 {
		t.Errorf("%d calls recorded", n)
	}
	h.Reset()
	if len(h.Calls()) != 0 {
		t.Error("Reset kept calls")
	}
}

func TestExecScope(t *testing.T) {
	// max_timeout is a hang bound here: echo under a 200 ms cap timed out at load 40.
	h := policytest.New(t, policy.Scope{Exec: &policy.Exec{Programs: []string{"echo", "sleep"}, MaxTimeout: 5 * time.Second}})
	if text, _ := h.Call("run", `{"argv":["echo","hi"]}`); text != "hi\n" {
		t.Errorf("echo: %q", text)
	}
	h.MustAllow(policytest.Match{Op: "run", Program: "echo"})
	if text, _ := h.Call("run", `{"argv":["cat","/etc/passwd"]}`); !strings.Contains(text, "policy: plugin docs-writer may not run cat (allowed: echo, sleep)") {
		t.Errorf("cat: %q", text)
	}
	h.MustDeny(policytest.Match{Program: "cat"})
	// The plugin asked for 60 s; the policy's max_timeout cuts it.
	if text, _ := h.Call("run", `{"argv":["sleep","30"]}`); text != "timed out" {
		t.Errorf("sleep past max_timeout: %q", text)
	}
}
