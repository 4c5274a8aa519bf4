package main

import (
	"errors"
	"strconv"
	"strings"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/pdk"
)

// exec_command and write_stdin: programs that talk back (a REPL, the prompts of npm init,
// a test watcher), each on a pseudo-terminal of its own that outlives the call. The names
// and the shape are those of Codex's unified exec tools, which models are trained on.

const termPrefix = "term-"

const execCommandDescription = `Starts a command on an interactive terminal (a pseudo-terminal) in the sandbox and returns what it printed until it went quiet, or until yield_time_ms passed. Use it for programs that ask for input or keep running and talking: a REPL (python3, node), a prompt (npm init, git rebase -i with GIT_EDITOR unset), a test watcher. For ordinary commands prefer bash.

- The command runs with bash -c in the shell's current directory (the one bash calls left), or in workdir.
- If the program is still running when the call returns, the result gives its session id (term-...): send it input with write_stdin, and read what it prints next the same way. The program keeps running between calls; what it prints meanwhile is kept.
- The terminal is a plain one (TERM=dumb, 120x40): line editing and colours are off, so output is text.
- At most 8 sessions at once; end one by exiting the program (e.g. write_stdin with "exit\n" or Ctrl-D "\u0004"), or with bash_kill.
- If the sandbox is replaced, a running session's program is started again (its state is gone) and the next result says so.`

const execCommandSchema = `{
  "type": "object",
  "properties": {
    "cmd": {"type": "string", "minLength": 1, "description": "The command to run, e.g. \"python3\" or \"npm init\"."},
    "workdir": {"type": "string", "description": "The directory to run it in; default: the shell's current directory."},
    "yield_time_ms": {"type": "integer", "minimum": 100, "maximum": 300000, "default": 10000, "description": "The longest to wait for the program to go quiet, in milliseconds."},
    "max_output_bytes": {"type": "integer", "minimum": 1000, "maximum": 40000, "default": 30000, "description": "The most output to return; the rest is kept for the next call."}
  },
  "required": ["cmd"],
  "additionalProperties": false
}`

const writeStdinDescription = `Writes to an interactive session started with exec_command, then returns what the program printed until it went quiet, or until yield_time_ms passed.

- chars is sent as typed: end a line with "\n" to press Enter. Control keys are their characters: Ctrl-C "\u0003" (interrupts the running command), Ctrl-D "\u0004" (end of input), Ctrl-Z "\u001a", Esc "\u001b".
- chars may be empty: the call then only reads what the program printed since the last call.
- When the program has ended, the result says so with its exit code, and the session is gone.`

const writeStdinSchema = `{
  "type": "object",
  "properties": {
    "session_id": {"type": "string", "minLength": 1, "description": "The session id exec_command returned (term-...)."},
    "chars": {"type": "string", "default": "", "description": "What to type into the terminal; may be empty to just read."},
    "yield_time_ms": {"type": "integer", "minimum": 100, "maximum": 300000, "default": 2000, "description": "The longest to wait for the program to go quiet, in milliseconds."},
    "max_output_bytes": {"type": "integer", "minimum": 1000, "maximum": 40000, "default": 30000, "description": "The most output to return; the rest is kept for the next call."}
  },
  "required": ["session_id"],
  "additionalProperties": false
}`

// quietMS is how long a program must be silent for a call to return before its bound.
const quietMS = 300

func execCommand(in pdk.Input) abi.Result {
	cmd := in.String("cmd")
	if strings.TrimSpace(cmd) == "" {
		return abi.ErrorText("Error: cmd is empty")
	}
	st := loadShell()
	cwd := st.cwd
	if in.Has("workdir") && in.String("workdir") != "" {
		cwd = in.String("workdir")
	}
	// The directory is entered by the script, not given as the request's cwd: the shell's
	// directory may lie outside the workspace (/tmp), where a request's cwd may not.
	st.cwd = cwd
	req := abi.TerminalStartRequest{Argv: []string{"bash", "-c", backgroundScript(cmd, st)},
		TerminalWait: abi.TerminalWait{WaitMS: in.Int("yield_time_ms", 10_000), QuietMS: quietMS, MaxBytes: in.Int("max_output_bytes", 30_000)}}
	r, out, err := pdk.TerminalStart(req)
	if err != nil {
		if errors.Is(err, pdk.ErrTooLarge) {
			return abi.ErrorText("Error: " + err.Error())
		}
		return abi.ErrorText("Error: could not start " + cmd + ": " + err.Error())
	}
	return formatTerminal(r, out)
}

func writeStdin(in pdk.Input) abi.Result {
	id := strings.TrimSpace(in.String("session_id"))
	req := abi.TerminalIORequest{ID: id, Input: in.String("chars"),
		TerminalWait: abi.TerminalWait{WaitMS: in.Int("yield_time_ms", 2000), QuietMS: quietMS, MaxBytes: in.Int("max_output_bytes", 30_000)}}
	r, out, err := pdk.TerminalIO(req)
	if err != nil {
		return terminalError(id, err)
	}
	return formatTerminal(r, out)
}

func killTerminal(id string) abi.Result {
	r, out, err := pdk.TerminalIO(abi.TerminalIORequest{ID: id, Signal: "KILL", TerminalWait: abi.TerminalWait{WaitMS: 5000, QuietMS: 100}})
	if err != nil {
		return terminalError(id, err)
	}
	if !r.Exited {
		return abi.ErrorText("Error: session " + id + " is still running after SIGKILL")
	}
	res := formatTerminal(r, out)
	res.Content[0].Text = "Session " + id + " killed.\n" + res.Content[0].Text
	return res
}

func terminalError(id string, err error) abi.Result {
	if errors.Is(err, pdk.ErrNotFound) {
		return abi.ErrorText("Error: there is no open session " + id + " (its program ended, or it was never started in this session); start one with exec_command")
	}
	return abi.ErrorText("Error: session " + id + ": " + err.Error())
}

// formatTerminal renders a terminal reply: the session's state on the first line, then
// what the program printed, with the terminal's CR LF made plain newlines.
func formatTerminal(r abi.TerminalReply, out []byte) abi.Result {
	var b strings.Builder
	if r.Restarted {
		b.WriteString("[the sandbox was replaced and this session's program was started again: what it held (variables, history) is gone]\n")
	}
	switch {
	case r.Exited:
		b.WriteString("[session " + r.ID + ": the program exited with code " + strconv.Itoa(r.ExitCode) + "; the session is gone]\n")
	default:
		b.WriteString("[session " + r.ID + ": running; send input with write_stdin]\n")
	}
	if r.Dropped > 0 {
		b.WriteString("[" + strconv.FormatInt(r.Dropped, 10) + " bytes of earlier output were dropped: nobody read them in time]\n")
	}
	text := strings.ReplaceAll(string(out), "\r\n", "\n")
	if text == "" {
		b.WriteString("[no output]")
	} else {
		b.WriteString(text)
	}
	return abi.Text(strings.TrimSuffix(b.String(), "\n"))
}
