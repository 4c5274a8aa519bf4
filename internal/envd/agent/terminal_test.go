//go:build linux

package agent

import (
	"context"
	"errors"
	"github.com/toolhost/toolhost/internal/envd"
	"github.com/toolhost/toolhost/internal/envd/client"
	"github.com/toolhost/toolhost/internal/testenv"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
)

// talk writes input to the terminal id and collects until quiet (or the hang bound).
func talk(t *testing.T, c *client.Client, id, input string) sandbox.TerminalOutput {
	t.Helper()
	out, err := c.TerminalIO(context.Background(), id, []byte(input), "", sandbox.TerminalWait{Wait: 30 * time.Second, Quiet: 300 * time.Millisecond})
	if err != nil {
		t.Fatalf("terminal io %q: %v", input, err)
	}
	return out
}

// until collects from the terminal until its output holds want, or the hang bound passes.
func until(t *testing.T, c *client.Client, id, input, want string) string {
	t.Helper()
	var got strings.Builder
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		out := talk(t, c, id, input)
		input = ""
		got.Write(out.Output)
		if strings.Contains(got.String(), want) {
			return got.String()
		}
		if out.Exited {
			break
		}
	}
	t.Fatalf("terminal %s never said %q; it said %q", id, want, got.String())
	return ""
}

func TestTerminalPythonREPL(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed")
	}
	_, c, _ := agent(t, nil)
	ctx := context.Background()
	out, err := c.StartTerminal(ctx, sandbox.TerminalRequest{Argv: []string{py, "-q", "-i"}, Env: map[string]string{"PYTHONSTARTUP": ""}},
		sandbox.TerminalWait{Wait: 30 * time.Second, Quiet: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	id := out.ID
	if !strings.HasPrefix(id, envd.TerminalTagPrefix) || out.PID == 0 {
		t.Fatalf("start: %+v", out)
	}
	if !strings.Contains(string(out.Output), ">>> ") {
		until(t, c, id, "", ">>> ")
	}
	until(t, c, id, "def double(x):\n    return 2 * x\n\n", ">>> ")
	if got := until(t, c, id, "double(21)\n", "42"); !strings.Contains(got, "double(21)") {
		t.Errorf("the terminal did not echo the input: %q", got)
	}
	// A loop that never ends, then Ctrl-C as a byte.
	talk(t, c, id, "while True: pass\n")
	until(t, c, id, "\x03", "KeyboardInterrupt")
	until(t, c, id, "print('still', double(2))\n", "still 4")
	// exit() ends it: the reply says so, with the status, and the terminal is gone.
	deadline := time.Now().Add(60 * time.Second)
	input := "exit(3)\n"
	for {
		o := talk(t, c, id, input)
		input = ""
		if o.Exited {
			if o.ExitCode != 3 {
				t.Errorf("exit code %d, want 3", o.ExitCode)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("python never ended")
		}
	}
	if _, err := c.TerminalIO(ctx, id, []byte("x"), "", sandbox.TerminalWait{Wait: time.Second}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("io after the end: %v, want not found", err)
	}
}

func TestTerminalBoundsAndSignals(t *testing.T) {
	ws, c, _ := agent(t, nil)
	ctx := context.Background()
	w := sandbox.TerminalWait{Wait: 30 * time.Second, Quiet: 200 * time.Millisecond}

	// A program that talks more than the buffer holds while nobody reads: the oldest
	// bytes go and are counted; its end is still reported.
	out, err := c.StartTerminal(ctx, sandbox.TerminalRequest{Argv: []string{"sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' x; touch written; sleep 1; echo END"}},
		sandbox.TerminalWait{Wait: 100 * time.Millisecond, Quiet: 50 * time.Millisecond, MaxBytes: 10})
	if err != nil {
		t.Fatal(err)
	}
	out0 := out.Output // what the start call collected, before the buffer filled
	testenv.WaitFor(t, "the talker to finish writing", func() bool {
		_, err := os.Stat(filepath.Join(ws, "written"))
		return err == nil
	})
	var total int
	var dropped int64
	var tail string
	for deadline := time.Now().Add(60 * time.Second); !out.Exited; {
		if time.Now().After(deadline) {
			t.Fatal("the talker never ended")
		}
		if out, err = c.TerminalIO(ctx, out.ID, nil, "", w); err != nil {
			t.Fatal(err)
		}
		total += len(out.Output)
		dropped += out.Dropped
		tail += string(out.Output)
		if len(tail) > 100 {
			tail = tail[len(tail)-100:]
		}
	}
	if dropped == 0 || int64(total)+dropped+int64(len(out0)) < 3_000_000 || total > envd.MaxTerminalBuffer+100 || !strings.Contains(tail, "END") {
		t.Errorf("collected %d bytes, %d dropped, tail %q", total, dropped, tail)
	}

	// KILL ends the program's whole group.
	out, err = c.StartTerminal(ctx, sandbox.TerminalRequest{Argv: []string{"sh", "-c", "sleep 1000 & sleep 1000"}}, sandbox.TerminalWait{Wait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); !out.Exited; {
		if time.Now().After(deadline) {
			t.Fatal("KILL did not end the program")
		}
		if out, err = c.TerminalIO(ctx, out.ID, nil, "KILL", w); err != nil {
			t.Fatal(err)
		}
	}
	if out.ExitCode != -1 {
		t.Errorf("a killed program's exit code %d, want -1", out.ExitCode)
	}

	// At most envd.MaxTerminals at once.
	var ids []string
	for range envd.MaxTerminals {
		o, err := c.StartTerminal(ctx, sandbox.TerminalRequest{Argv: []string{"cat"}}, sandbox.TerminalWait{})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, o.ID)
	}
	if _, err := c.StartTerminal(ctx, sandbox.TerminalRequest{Argv: []string{"cat"}}, sandbox.TerminalWait{}); err == nil || !strings.Contains(err.Error(), "terminals are open") {
		t.Errorf("terminal %d: %v, want refused", envd.MaxTerminals+1, err)
	}
	// Ctrl-D ends cat; then there is room again.
	for deadline, input := time.Now().Add(60*time.Second), "\x04"; ; input = "" {
		o := talk(t, c, ids[0], input)
		if o.Exited {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("cat did not end on Ctrl-D")
		}
	}
	if _, err := c.StartTerminal(ctx, sandbox.TerminalRequest{Argv: []string{"cat"}}, sandbox.TerminalWait{}); err != nil {
		t.Errorf("after one ended: %v", err)
	}

	// The terminals' programs are listed, under their terminal ids, so that a session
	// knows which to start again after a rotation.
	running, err := c.BackgroundProcesses(ctx)
	if err != nil || len(running) != envd.MaxTerminals || !strings.HasPrefix(running[0].ID, envd.TerminalTagPrefix) {
		t.Errorf("BackgroundProcesses = %v, %v; want the %d terminals", running, err, envd.MaxTerminals)
	}
}

// A child that keeps the terminal open after its program ended cannot hold the agent: the
// end is reported after a bound, and the server closes.
func TestTerminalHeldOpenByAChild(t *testing.T) {
	_, c, _ := agent(t, nil)
	ctx := context.Background()
	out, err := c.StartTerminal(ctx, sandbox.TerminalRequest{Argv: []string{"sh", "-c", "echo start; setsid sleep 2 & exit 0"}},
		sandbox.TerminalWait{Wait: 30 * time.Second, Quiet: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); !out.Exited; {
		if time.Now().After(deadline) {
			t.Fatal("the end was never reported")
		}
		if out, err = c.TerminalIO(ctx, out.ID, nil, "", sandbox.TerminalWait{Wait: 5 * time.Second, Quiet: 100 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
	}
}
