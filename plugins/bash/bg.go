package main

import (
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/pdk"
)

// bash_output and bash_kill: the background commands bash started, as tool calls. What
// was already shown of a command's log is remembered per session (its offset), so each
// call shows only what is new.

const outputDescription = `Shows the new output of a background command started with bash (background: true): what it wrote to its log since the last bash_output call for it, and whether it still runs.

- id is the id bash gave when it started the command (bg-...).
- At most about 30,000 characters are shown per call; when there is more, the result says so and the next call continues where this one stopped.
- If the sandbox was replaced, the command was started again with the same id and an empty log: the output starts over, and the result says so.`

const outputSchema = `{
  "type": "object",
  "properties": {
    "id": {"type": "string", "minLength": 1, "description": "The id of the background command (bg-...)."}
  },
  "required": ["id"],
  "additionalProperties": false
}`

const killDescription = `Stops a background command started with bash (background: true), or ends an interactive session started with exec_command.

- id is the command's id (bg-...) or the session's id (term-...).
- A background command gets SIGTERM, and SIGKILL a few seconds later if it is still running; its whole process group is stopped. It is not started again when the sandbox is replaced.
- An interactive session's program is killed with its process group.`

const killSchema = `{
  "type": "object",
  "properties": {
    "id": {"type": "string", "minLength": 1, "description": "The id of the background command (bg-...) or interactive session (term-...)."}
  },
  "required": ["id"],
  "additionalProperties": false
}`

// maxShown bounds the log bytes one bash_output call shows.
const maxShown = 30_000

// logScript prints the size of the log ($1), then, after a newline, at most $3 bytes of
// it from offset $2. A log that is gone prints nothing.
const logScript = `s=$(stat -c %s -- "$1" 2>/dev/null) || exit 3
printf '%s\n' "$s"
tail -c +$(($2 + 1)) -- "$1" 2>/dev/null | head -c "$3"`

func bashOutput(in pdk.Input) abi.Result {
	id := strings.TrimSpace(in.String("id"))
	st, err := pdk.Process(abi.ProcessRequest{ID: id})
	if err != nil {
		return processError(id, err)
	}
	key := "bg/" + id + "/offset"
	var offset int64
	if b, err := pdk.SessionGet(key); err == nil {
		offset, _ = strconv.ParseInt(string(b), 10, 64)
	}
	res, err := pdk.Exec(abi.ExecRequest{Argv: []string{"bash", "-c", logScript, "log", st.LogPath, strconv.FormatInt(offset, 10), strconv.Itoa(maxShown)}, TimeoutMS: 30_000})
	if err != nil {
		return abi.ErrorText("Error: could not read the log of " + id + ": " + err.Error())
	}
	status := "[" + id + ": " + runState(st) + "]"
	if res.ExitCode == 3 {
		return abi.Text(status + "\n[its log " + st.LogPath + " is gone]")
	}
	sizeLine, data, _ := strings.Cut(res.Stdout, "\n")
	size, _ := strconv.ParseInt(sizeLine, 10, 64)
	var b strings.Builder
	b.WriteString(status + "\n")
	if size < offset { // a new log: the command was started again in a new sandbox
		b.WriteString("[the log started over: the command was started again after the sandbox was replaced]\n")
		offset = 0
		res, err = pdk.Exec(abi.ExecRequest{Argv: []string{"bash", "-c", logScript, "log", st.LogPath, "0", strconv.Itoa(maxShown)}, TimeoutMS: 30_000})
		if err != nil {
			return abi.ErrorText("Error: could not read the log of " + id + ": " + err.Error())
		}
		sizeLine, data, _ = strings.Cut(res.Stdout, "\n")
		size, _ = strconv.ParseInt(sizeLine, 10, 64)
	}
	offset += int64(len(data))
	_ = pdk.SessionSet(key, []byte(strconv.FormatInt(offset, 10)))
	if data == "" {
		b.WriteString("[no new output]")
		return abi.Text(b.String())
	}
	b.WriteString(data)
	if !strings.HasSuffix(data, "\n") {
		b.WriteByte('\n')
	}
	if more := size - offset; more > 0 {
		b.WriteString("[" + strconv.FormatInt(more, 10) + " more bytes in the log; call bash_output again for them]")
	}
	return abi.Text(strings.TrimSuffix(b.String(), "\n"))
}

func runState(st abi.ProcessReply) string {
	if st.Running {
		return "running, pid " + strconv.Itoa(st.PID)
	}
	return "no longer running"
}

func processError(id string, err error) abi.Result {
	if errors.Is(err, pdk.ErrNotFound) {
		return abi.ErrorText("Error: there is no background command " + id + " in this session; bash (background: true) gives the id when it starts one")
	}
	return abi.ErrorText("Error: " + id + ": " + err.Error())
}

func bashKill(in pdk.Input) abi.Result {
	id := strings.TrimSpace(in.String("id"))
	if strings.HasPrefix(id, termPrefix) {
		return killTerminal(id)
	}
	st, err := pdk.Process(abi.ProcessRequest{ID: id, Signal: "TERM"})
	if err != nil {
		return processError(id, err)
	}
	for deadline := time.Now().Add(3 * time.Second); st.Running && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
		if st, err = pdk.Process(abi.ProcessRequest{ID: id}); err != nil {
			return processError(id, err)
		}
	}
	how := "stopped with SIGTERM"
	if st.Running {
		if st, err = pdk.Process(abi.ProcessRequest{ID: id, Signal: "KILL"}); err != nil {
			return processError(id, err)
		}
		how = "killed with SIGKILL (it did not stop on SIGTERM)"
	}
	if st.Running {
		return abi.ErrorText("Error: " + id + " is still running after SIGKILL")
	}
	return abi.Text(id + " " + how + "; its log stays at " + st.LogPath)
}
