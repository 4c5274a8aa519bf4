package main

import (
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/pdk"
)

// descriptionText is the tool's description; %s are the default and the maximum timeout.
const descriptionText = `Runs a bash command in the sandbox and returns its output.

- Each call is a new bash process, but the shell remembers its place: a call starts in the directory where the last one ended (cd carries over, also when the sandbox is replaced; the first call starts in the workspace root, /home/user), and the result says when the directory changed. %s Stdin is closed: for programs that ask for input or keep talking (a REPL, npm init), use exec_command and write_stdin.
- The output shows the command, its stdout, its stderr under a [stderr] line, and [exit CODE]. A non-zero exit code is reported, not treated as a failure of the tool.
- timeout is in seconds (default %s, at most %s). A command that runs out of time is killed with its whole process group, and you get its output so far.
- Long output keeps its beginning and end; the middle is cut, and the result says how much.
- background: true starts a long-running process (a dev server, a watcher) in the current directory and returns at once with its id, pid and a log file holding its output; it runs until the sandbox closes, and if the sandbox is replaced it is started again (same id and log file, a new pid). Read its new output with bash_output, stop it with bash_kill.
- Prefer the dedicated tools for files: read_file, write_file and edit_file to read and change files, grep and glob to search.`

// schemaText is the input schema; the %ds are the maximum and the default timeout in whole
// seconds (the largest timeout run accepts), the %ss the default and the maximum as said in
// words.
const schemaText = `{
  "type": "object",
  "properties": {
    "command": {"type": "string", "minLength": 1, "description": "The bash command to run."},
    "timeout": {"type": "integer", "minimum": 1, "maximum": %d, "default": %d, "description": "Timeout in seconds (default %s, at most %s); ignored with background."},
    "background": {"type": "boolean", "default": false, "description": "Start the command in the background and return at once with its id, pid and log file."}
  },
  "required": ["command"],
  "additionalProperties": false
}`

const (
	// Used when the host does not say (an older host): its own defaults.
	fallbackDefaultMS = 60_000
	fallbackMaxMS     = 600_000
	// outputBudget keeps a result under the host's 50,000-character cut, so the host never
	// drops the stderr or the exit line from the middle of a long result.
	outputBudget = 40_000
	stderrBudget = 12_000
)

// Environment the plugin reads. The host sets the first two for every plugin that may
// run commands (host.EnvExecTimeoutDefault, host.EnvExecTimeoutMax): the timeouts it
// enforces, in milliseconds. TOOLHOST_BASH_MAX_TIMEOUT (seconds) may lower the maximum
// for this plugin alone.
const (
	envDefaultMS  = "TOOLHOST_EXEC_TIMEOUT_DEFAULT_MS"
	envMaxMS      = "TOOLHOST_EXEC_TIMEOUT_MAX_MS"
	envMaxSeconds = "TOOLHOST_BASH_MAX_TIMEOUT"
)

// limits are the timeouts in effect, in milliseconds.
type limits struct{ defaultMS, maxMS int64 }

func positive(key string, unit int64) (int64, bool) {
	n, err := strconv.ParseInt(strings.TrimSpace(pdk.Config(key)), 10, 64)
	if err != nil || n <= 0 {
		return 0, false
	}
	return n * unit, true
}

// currentLimits reads the configuration: the host's timeouts, the plugin's own cap.
func currentLimits() limits {
	l := limits{defaultMS: fallbackDefaultMS, maxMS: fallbackMaxMS}
	if v, ok := positive(envMaxMS, 1); ok {
		l.maxMS = v
	}
	if v, ok := positive(envDefaultMS, 1); ok {
		l.defaultMS = v
	}
	if v, ok := positive(envMaxSeconds, 1000); ok {
		l.maxMS = min(l.maxMS, v)
	}
	l.defaultMS = min(l.defaultMS, l.maxMS)
	return l
}

// seconds says a duration in milliseconds as seconds: "60", "1.5".
func seconds(ms int64) string {
	if ms%1000 == 0 {
		return strconv.FormatInt(ms/1000, 10)
	}
	return strconv.FormatFloat(float64(ms)/1000, 'f', -1, 64)
}

func description(l limits) string {
	env := "Environment variables do not carry over: set them in the command that needs them (VAR=x cmd, or export and the command in one call)."
	if keepEnv() {
		env = "Exported variables carry over too (export X=1 in one call, $X in the next); variables that are not exported do not."
	}
	return fill(descriptionText, env, seconds(l.defaultMS), seconds(l.maxMS))
}

func schema(l limits) string {
	return fill(schemaText, strconv.FormatInt(l.maxMS/1000, 10), strconv.FormatInt(max(1, l.defaultMS/1000), 10),
		seconds(l.defaultMS), seconds(l.maxMS))
}

func run(in pdk.Input) abi.Result {
	command := in.String("command")
	if strings.TrimSpace(command) == "" {
		return abi.ErrorText("Error: command is empty")
	}
	bg := in.Bool("background")
	l := currentLimits()
	st := loadShell()
	if bg {
		res, err := pdk.Exec(abi.ExecRequest{Argv: []string{"bash", "-c", backgroundScript(command, st)}, Background: true})
		if err != nil {
			return abi.ErrorText("Error: could not run the command: " + err.Error())
		}
		return background(res)
	}
	// No timeout given: the configured default, sent as it is, so the host enforces
	// exactly what a timeout report will say.
	ms := l.defaultMS
	if in.Has("timeout") {
		t := int64(in.Int("timeout", 0))
		if t < 1 {
			return abi.ErrorText("Error: timeout must be at least 1 second")
		}
		if t*1000 > l.maxMS {
			return abi.ErrorText("Error: timeout " + strconv.FormatInt(t, 10) + " s is above the maximum of " +
				seconds(l.maxMS) + " s; use at most " + seconds(l.maxMS) + ", or background: true for long-running processes")
		}
		ms = t * 1000
	}
	marker := newMarker()
	res, err := pdk.Exec(abi.ExecRequest{Argv: shellArgv(command, marker, st), TimeoutMS: ms})
	if err != nil {
		return abi.ErrorText("Error: could not run the command: " + err.Error())
	}
	out, errOut, start, cwd, base, final, gone, ok := endState(res.Stdout, res.Stderr, marker)
	res.Stdout, res.Stderr = out, errOut
	note := ""
	if ok {
		note = saveShell(st, start, cwd, base, final, gone)
	}
	r := formatNote(command, seconds(ms), res, note)
	if !r.IsError {
		var o pdk.JSONObject
		o.Int("exit_code", int64(res.ExitCode)).Str("stdout", res.Stdout).Str("stderr", res.Stderr)
		if ok && cwd != "" {
			o.Str("cwd", cwd)
		}
		r.Structured = o.Bytes()
	}
	return r
}

// resultSchema is bash's output schema: what its structured result holds beside the text.
const resultSchema = `{
  "type": "object",
  "properties": {
    "exit_code": {"type": "integer", "description": "The command's exit code; -1 when a signal killed it."},
    "stdout": {"type": "string", "description": "Its standard output (the middle cut when long, as in the text)."},
    "stderr": {"type": "string", "description": "Its standard error (the middle cut when long, as in the text)."},
    "cwd": {"type": "string", "description": "The directory the shell is in after the command; the next call starts there."},
    "background": {
      "type": "object",
      "description": "A background command that started: its id (for bash_output and bash_kill), pid and log file.",
      "properties": {"id": {"type": "string"}, "pid": {"type": "integer"}, "log": {"type": "string"}},
      "required": ["id", "pid", "log"],
      "additionalProperties": false
    }
  },
  "additionalProperties": false
}`

// backgroundScript starts a background command where the shell is, with its variables.
func backgroundScript(command string, st shellState) string {
	var b strings.Builder
	if st.cwd != "" {
		b.WriteString("cd -- " + shellQuote(st.cwd) + " 2>/dev/null\n")
	}
	if st.env != "" {
		b.WriteString(st.env)
	}
	b.WriteString(command)
	return b.String()
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func background(res abi.ExecResult) abi.Result {
	if res.ID == "" && res.LogPath == "" { // it did not start: the reply is a normal exit
		r := format("", "", res)
		if !r.IsError {
			var o pdk.JSONObject
			r.Structured = o.Int("exit_code", int64(res.ExitCode)).Str("stdout", res.Stdout).Str("stderr", res.Stderr).Bytes()
		}
		return r
	}
	pid := strconv.Itoa(res.PID)
	r := abi.Text("Started in background: id " + res.ID + ", pid " + pid + ", log " + res.LogPath +
		"\nIt runs until the sandbox closes (if the sandbox is replaced, it is started again under the same id and log). Read its new output with bash_output (id " +
		res.ID + "); stop it with bash_kill.")
	var bg pdk.JSONObject
	bg.Str("id", res.ID).Int("pid", int64(res.PID)).Str("log", res.LogPath)
	var o pdk.JSONObject
	r.Structured = o.Raw("background", bg.Bytes()).Bytes()
	return r
}

// format renders a finished command: "$ COMMAND", stdout, "[stderr]" and stderr when there
// is any, then "[exit CODE]", or "[timed out after N s]" or "[killed: ... out of memory]"
// (error results).
func format(command string, timeout string, res abi.ExecResult) abi.Result {
	return formatNote(command, timeout, res, "")
}

// formatNote is format with a note (the shell's new directory) before the last line.
func formatNote(command string, timeout string, res abi.ExecResult, note string) abi.Result {
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
	if note != "" {
		b.WriteString(note + "\n")
	}
	if res.TimedOut {
		b.WriteString("[timed out after " + timeout + " s]")
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

// fill replaces each %s or %d of tmpl by the next of args (without package fmt, which would
// add a third to the plugin's module).
func fill(tmpl string, args ...string) string {
	var b strings.Builder
	for _, a := range args {
		i := strings.IndexByte(tmpl, '%')
		for i >= 0 && i+1 < len(tmpl) && tmpl[i+1] != 's' && tmpl[i+1] != 'd' {
			j := strings.IndexByte(tmpl[i+1:], '%')
			if j < 0 {
				i = -1
				break
			}
			i += 1 + j
		}
		if i < 0 || i+1 >= len(tmpl) {
			break
		}
		b.WriteString(tmpl[:i])
		b.WriteString(a)
		tmpl = tmpl[i+2:]
	}
	b.WriteString(tmpl)
	return b.String()
}
