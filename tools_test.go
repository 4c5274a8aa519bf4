package toolhost

// The agent tools of issue 20 end to end: the embedded plugins, the real host, real
// bubblewrap sandboxes under a session that rotates.

import (
	"context"
	"encoding/json"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/internal/testenv"
)

// toolsSession opens a session on the local provider, with the bash plugin keeping
// exported variables.
func toolsSession(t *testing.T, project string) *Session {
	t.Helper()
	testenv.NeedBwrap(t)
	cfg := testConfig(t)
	for i := range cfg.Plugins {
		if cfg.Plugins[i].Path == "bash.wasm" {
			cfg.Plugins[i].Env = map[string]string{"TOOLHOST_BASH_KEEP_ENV": "1"}
		}
	}
	return open(t, newToolhost(t, cfg), SessionOptions{Project: project})
}

func TestShellRemembersAcrossRotations(t *testing.T) {
	s := toolsSession(t, "shell")
	ctx := context.Background()
	expect(t, s, "bash", `{"command":"mkdir -p src && cd src && export X=1"}`, false, "[cwd is now /home/user/src]")
	expect(t, s, "bash", `{"command":"pwd; echo $X"}`, false, "/home/user/src\n1\n[exit 0]")
	for range 2 {
		if err := s.Sandbox().Rotate(ctx); err != nil {
			t.Fatal(err)
		}
		res := expect(t, s, "bash", `{"command":"pwd; echo $X"}`, false, "/home/user/src\n1\n")
		if strings.Contains(resultText(res), "cwd is now") {
			t.Errorf("the directory did not change: %q", resultText(res))
		}
	}
	// Another session of the same project starts afresh: the state is the session's.
	th := s.th
	other := open(t, th, SessionOptions{Project: "shell-other"})
	expect(t, other, "bash", `{"command":"pwd; echo \"[$X]\""}`, false, "/home/user\n[]\n")
}

func TestBackgroundOutputAndKill(t *testing.T) {
	s := toolsSession(t, "background")
	res := expect(t, s, "bash", `{"command":"for i in 1 2 3; do echo line$i; done; sleep 1000","background":true}`, false, "Started in background")
	id := regexp.MustCompile(`id (bg-[0-9a-f]+)`).FindStringSubmatch(resultText(res))
	if id == nil {
		t.Fatalf("no id in %q", resultText(res))
	}
	in := `{"id":"` + id[1] + `"}`
	waitFor(t, "the command's output", func() bool {
		r, _ := s.Dispatch(context.Background(), "bash_output", json.RawMessage(in))
		return strings.Contains(resultText(r), "line3")
	})
	expect(t, s, "bash_output", in, false, "running, pid", "[no new output]")
	expect(t, s, "bash_kill", in, false, "stopped with SIGTERM")
	expect(t, s, "bash_output", in, false, "no longer running")
	// A stopped command is not started again by a rotation.
	if err := s.Sandbox().Rotate(context.Background()); err != nil {
		t.Fatal(err)
	}
	res = expect(t, s, "bash_output", in, false, "no longer running")
	if strings.Contains(resultText(res), "were restarted") {
		t.Errorf("a stopped command was restarted: %q", resultText(res))
	}
	expect(t, s, "bash_output", `{"id":"bg-0123456789abcdef"}`, true, "there is no background command bg-0123456789abcdef")
}

// sessionID finds the session id in an exec_command result.
func sessionID(t *testing.T, text string) string {
	t.Helper()
	m := regexp.MustCompile(`\[session (term-[0-9a-f]+): running`).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("no running session in %q", text)
	}
	return m[1]
}

// typeUntil writes chars to a session, then reads until its output holds want.
func typeUntil(t *testing.T, s *Session, id, chars, want string) string {
	t.Helper()
	var all strings.Builder
	deadline := time.Now().Add(90 * time.Second)
	for {
		in, _ := json.Marshal(map[string]any{"session_id": id, "chars": chars, "yield_time_ms": 3000})
		chars = ""
		res := expect(t, s, "write_stdin", string(in), false)
		all.WriteString(resultText(res))
		if strings.Contains(all.String(), want) {
			return all.String()
		}
		if strings.Contains(resultText(res), "exited with code") || time.Now().After(deadline) {
			t.Fatalf("session %s never said %q; it said %q", id, want, all.String())
		}
	}
}

func TestPythonREPLThroughTheTerminalTools(t *testing.T) {
	s := toolsSession(t, "repl")
	res := expect(t, s, "exec_command", `{"cmd":"python3 -q","yield_time_ms":20000}`, false)
	id := sessionID(t, resultText(res))
	if !strings.Contains(resultText(res), ">>> ") {
		typeUntil(t, s, id, "", ">>> ")
	}
	typeUntil(t, s, id, "def double(x):\n    return 2 * x\n\n", ">>> ")
	typeUntil(t, s, id, "double(21)\n", "42")
	// A loop that never ends, interrupted with Ctrl-C.
	expect(t, s, "write_stdin", `{"session_id":"`+id+`","chars":"while True: pass\n","yield_time_ms":500}`, false, "running")
	typeUntil(t, s, id, "\u0003", "KeyboardInterrupt")
	typeUntil(t, s, id, "print('after', double(4))\n", "after 8")

	// After a rotation the program runs again, empty, and says so.
	if err := s.Sandbox().Rotate(context.Background()); err != nil {
		t.Fatal(err)
	}
	out := typeUntil(t, s, id, "print('alive')\n", "alive")
	if !strings.Contains(out, "started again") {
		t.Errorf("the restart was not said: %q", out)
	}
	typeUntil(t, s, id, "double(1)\n", "NameError")
	out = typeUntil(t, s, id, "exit(5)\n", "exited with code 5")
	expect(t, s, "write_stdin", `{"session_id":"`+id+`","chars":"x"}`, true, "there is no open session")
	_ = out
}

func TestNpmInitThroughStdin(t *testing.T) {
	if _, err := exec.LookPath("npm"); err != nil {
		testenv.Skipf(t, "npm (Node.js) is not installed")
	}
	s := toolsSession(t, "npminit")
	expect(t, s, "bash", `{"command":"mkdir -p app && cd app"}`, false)
	res := expect(t, s, "exec_command", `{"cmd":"npm init","yield_time_ms":30000}`, false)
	id := sessionID(t, resultText(res))
	answers := []struct{ prompt, answer string }{
		{"package name:", "demo-app"}, {"version:", "0.2.0"}, {"description:", "made through stdin"},
		{"entry point:", ""}, {"test command:", ""}, {"git repository:", ""}, {"keywords:", ""},
		{"author:", "toolhost"}, {"license:", "MIT"}, {"type:", ""}, // npm 11 asks for the module type
	}
	out := output(resultText(res))
	start := time.Now()
	for _, a := range answers {
		if a.prompt == "type:" && !strings.Contains(out, a.prompt) && strings.Contains(out, "Is this OK?") {
			break // an npm that does not ask it
		}
		// Read until npm asks this question, then answer it.
		out = readUntil(t, s, id, out, a.prompt)
		out = readUntil(t, s, id, "", "", a.answer+"\n")
	}
	t.Logf("answered npm init in %s", time.Since(start))
	readUntil(t, s, id, out, "Is this OK?")
	typeUntil(t, s, id, "yes\n", "exited with code 0")
	expect(t, s, "bash", `{"command":"cat package.json"}`, false, `"name": "demo-app"`, `"version": "0.2.0"`, `"description": "made through stdin"`, `"license": "MIT"`)
}

// output is what a terminal tool's result holds of the program's output (its first line
// is the session's state).
func output(text string) string {
	_, out, _ := strings.Cut(text, "\n")
	if out == "[no output]" {
		return ""
	}
	return out
}

// readUntil types chars (if any), then reads until the output so far holds want, and
// returns the output after it.
func readUntil(t *testing.T, s *Session, id, out, want string, chars ...string) string {
	t.Helper()
	typed := strings.Join(chars, "")
	deadline := time.Now().Add(90 * time.Second)
	for typed != "" || !strings.Contains(out, want) {
		in, _ := json.Marshal(map[string]any{"session_id": id, "chars": typed, "yield_time_ms": 3000})
		typed = ""
		res := expect(t, s, "write_stdin", string(in), false)
		out += output(resultText(res))
		if strings.Contains(resultText(res), "exited with code") || time.Now().After(deadline) {
			t.Fatalf("session %s never said %q; it said %q", id, want, out)
		}
		if want == "" {
			return out
		}
	}
	_, after, _ := strings.Cut(out, want)
	return after
}
