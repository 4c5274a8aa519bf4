package main

import (
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/pdk"
)

const description = `Runs a bash command in the sandbox and returns its output.

- Each call is a new bash -c process started in the workspace root (/home/user): the working directory and environment variables do not carry over between calls, so chain dependent steps with && or cd in the same command. Stdin is closed; do not start interactive programs.
- The output shows the command, its stdout, its stderr under a [stderr] line, and [exit CODE]. A non-zero exit code is reported, not treated as a failure of the tool.
- timeout is in seconds (default 60; the maximum is set by the host, 600 unless configured). A command that runs out of time is killed with its whole process group, and you get its output so far.
- Long output keeps its beginning and end; the middle is cut, and the result says how much.
- background: true starts a long-running process (a dev server, a watcher) and returns at once with its id, pid and a log file holding its output; it runs until the sandbox closes. Read the log with bash (tail -n 50 LOG), stop it with kill PID.
- Prefer the dedicated tools for files: read_file, write_file and edit_file to read and change files, grep and glob to search.`

const schema = `{
  "type": "object",
  "properties": {
    "command": {"type": "string", "minLength": 1, "description": "The bash command to run."},
    "timeout": {"type": "integer", "minimum": 1, "default": 60, "description": "Timeout in seconds (default 60, at most the configured maximum, 600 unless set otherwise); ignored with background."},
    "background": {"type": "boolean", "default": false, "description": "Start the command in the background and return at once with its id, pid and log file."}
  },
  "required": ["command"],
  "additionalProperties": false
}`

const (
	defaultTimeout    = 60
	defaultMaxTimeout = 600
	// outputBudget keeps a result under the host's 50,000-character cut, so the host never
	// drops the stderr or the exit line from the middle of a long result.
	outputBudget = 40_000
	stderrBudget = 12_000
)

// maxTimeout is the configured ceiling in seconds.
func maxTimeout() int {
	if n, err := strconv.Atoi(strings.TrimSpace(pdk.Config("TOOLHOST_BASH_MAX_TIMEOUT"))); err == nil && n > 0 {
		return n
	}
	return defaultMaxTimeout
}

func run(in pdk.Input) abi.Result {
	command := in.String("command")
	if strings.TrimSpace(command) == "" {
		return abi.ErrorText("Error: command is empty")
	}
	bg := in.Bool("background")
	limit := maxTimeout()
	timeout := in.Int("timeout", min(defaultTimeout, limit))
	if timeout < 1 {
		return abi.ErrorText("Error: timeout must be at least 1 second")
	}
	if timeout > limit && !bg {
		return abi.ErrorText("Error: timeout " + strconv.Itoa(timeout) + " s is above the maximum of " +
			strconv.Itoa(limit) + " s; use at most " + strconv.Itoa(limit) + ", or background: true for long-running processes")
	}
	req := abi.ExecRequest{Argv: []string{"bash", "-c", command}, Background: bg}
	if !bg {
		req.TimeoutMS = int64(timeout) * 1000
	}
	res, err := pdk.Exec(req)
	if err != nil {
		return abi.ErrorText("Error: could not run the command: " + err.Error())
	}
	if bg {
		return background(res)
	}
	return format(command, timeout, res)
}

func background(res abi.ExecResult) abi.Result {
	if res.ID == "" && res.LogPath == "" { // it did not start: the reply is a normal exit
		return format("", 0, res)
	}
	pid := strconv.Itoa(res.PID)
	return abi.Text("Started in background: id " + res.ID + ", pid " + pid + ", log " + res.LogPath +
		"\nIt runs until the sandbox closes. Read its output with bash `tail -n 50 " + res.LogPath +
		"`; stop it with `kill " + pid + "`.")
}

// format renders a finished command: "$ COMMAND", stdout, "[stderr]" and stderr when there
// is any, then "[exit CODE]", or "[timed out after N s]" or "[killed: ... out of memory]"
// (error results).
func format(command string, timeout int, res abi.ExecResult) abi.Result {
	stdout, stderr := res.Stdout, res.Stderr
	if len(stdout)+len(stderr) > outputBudget {
		errMax := min(len(stderr), stderrBudget)
		stdout = cutMiddle(stdout, outputBudget-errMax)
		stderr = cutMiddle(stderr, errMax)
	}
	var b strings.Builder
	b.Grow(len(command) + len(stdout) + len(stderr) + 200)
	if command != "" {
		b.WriteString("$ ")
		b.WriteString(command)
		b.WriteByte('\n')
	}
	writeStream(&b, "stdout", stdout, res.StdoutCut)
	if stderr != "" || res.StderrCut > 0 {
		b.WriteString("[stderr]\n")
		writeStream(&b, "stderr", stderr, res.StderrCut)
	}
	if res.TimedOut {
		b.WriteString("[timed out after " + strconv.Itoa(timeout) + " s]")
		return abi.ErrorText(b.String())
	}
	if res.OOMKilled {
		b.WriteString("[killed: the sandbox ran out of memory (it reached its memory limit); use less memory, or free some (files in /tmp and /dev/shm count)]")
		return abi.ErrorText(b.String())
	}
	b.WriteString("[exit " + strconv.Itoa(res.ExitCode))
	if res.ExitCode == -1 {
		b.WriteString(", killed by a signal")
	}
	b.WriteByte(']')
	return abi.Text(b.String())
}

// writeStream writes one stream, ending it with a newline, and says how many bytes the host
// cut between the head and the tail it kept (the plugin's own cut is marked in place).
func writeStream(b *strings.Builder, name, s string, hostCut int64) {
	b.WriteString(s)
	if s != "" && !strings.HasSuffix(s, "\n") {
		b.WriteByte('\n')
	}
	if hostCut > 0 {
		b.WriteString("[" + name + ": " + strconv.FormatInt(hostCut, 10) +
			" bytes were cut from the middle by the host; what is shown is the beginning and the end]\n")
	}
}

// cutMiddle keeps the head and tail of s within max bytes, cut at line boundaries when
// one is near, with a marker line saying how many bytes were left out.
func cutMiddle(s string, max int) string {
	if len(s) <= max {
		return s
	}
	half := max / 2
	head, tail := s[:half], s[len(s)-half:]
	if i := strings.LastIndexByte(head, '\n'); i >= half/2 {
		head = head[:i+1]
	}
	if i := strings.IndexByte(tail, '\n'); i >= 0 && i < half/2 {
		tail = tail[i+1:]
	}
	head, tail = trimRunes(head, tail)
	cut := len(s) - len(head) - len(tail)
	if !strings.HasSuffix(head, "\n") {
		head += "\n"
	}
	return head + "[... " + strconv.Itoa(cut) + " bytes cut here ...]\n" + tail
}

// trimRunes keeps a multi-byte character whole at both cuts.
func trimRunes(head, tail string) (string, string) {
	for len(head) > 0 {
		if r, n := utf8.DecodeLastRuneInString(head); r != utf8.RuneError || n > 1 {
			break
		}
		head = head[:len(head)-1]
	}
	for len(tail) > 0 && !utf8.RuneStart(tail[0]) {
		tail = tail[1:]
	}
	return head, tail
}
