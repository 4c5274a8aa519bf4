package pdk

import (
	"slices"
	"strconv"

	"github.com/toolhost/toolhost/abi"
)

// Session state, removing files, background processes and terminals: the host functions
// of ABI.md sections 3.3 to 3.5 that the agent tools added.

// SessionGet returns the value this plugin stored under key in this session with
// SessionSet; an error matching ErrNotFound when there is none. Session state needs no
// grant: it is the plugin's own, lives as long as the session (through every replacement
// of its sandbox) and is never seen by another plugin or session.
func SessionGet(key string) ([]byte, error) {
	b, owned, err := reply("session get", func(out []byte) int64 { return rawSessionGet(key, out) })
	if err != nil {
		return nil, err
	}
	if !owned {
		b = append([]byte(nil), b...)
	}
	return b, nil
}

// SessionSet stores value under key for the rest of the session; an empty value deletes
// the key. Keys are 1 to 512 letters, digits and . _ / : @ + = -; a value is at most 1 MiB
// and all of a plugin's at most 4 MiB (ErrTooLarge past that).
func SessionSet(key string, value []byte) error {
	if n := rawSessionSet(key, value); n < 0 {
		return statusError("session set", n)
	}
	return nil
}

// Remove removes a file (or a symbolic link, never what it points to) from the workspace
// (capability sandbox_files). A directory is refused with ErrIsDir.
func Remove(path string) error {
	if n := rawRemove(path); n < 0 {
		return statusError("remove", n)
	}
	return nil
}

// Process reports whether a background command this plugin started in this session
// (ExecResult.ID) still runs, after sending it req.Signal when set ("TERM" or "KILL": to
// its whole process group) (capability sandbox_exec). ErrNotFound for an id the plugin was
// not given.
func Process(req abi.ProcessRequest) (abi.ProcessReply, error) {
	b := append(reqBuf[:0], `{"id":`...)
	b = appendString(b, req.ID)
	if req.Signal != "" {
		b = append(b, `,"signal":`...)
		b = appendString(b, req.Signal)
	}
	enc := requestBuf(append(b, '}'))
	out, _, err := reply("process", func(out []byte) int64 { return rawProcess(enc, out) })
	if err != nil {
		return abi.ProcessReply{}, err
	}
	var r abi.ProcessReply
	fields, ok := members(out)
	if !ok {
		return r, decodeError("process")
	}
	for _, f := range fields {
		switch string(f.key) {
		case "id":
			r.ID, _ = jsonString(f.val)
		case "log_path":
			r.LogPath, _ = jsonString(f.val)
		case "running":
			r.Running = string(f.val) == "true"
		case "pid":
			n, _ := jsonInt(f.val)
			r.PID = int(n)
		}
	}
	return r, nil
}

// TerminalStart runs a program on a pseudo-terminal that outlives the call and returns
// its first output, once it has been quiet for a moment or at a bound (capability
// sandbox_exec). Keep the reply's ID for TerminalIO.
func TerminalStart(req abi.TerminalStartRequest) (abi.TerminalReply, []byte, error) {
	b := append(reqBuf[:0], `{"argv":[`...)
	for i, a := range req.Argv {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, a)
	}
	b = append(b, ']')
	if req.Cwd != "" {
		b = append(b, `,"cwd":`...)
		b = appendString(b, req.Cwd)
	}
	if len(req.Env) > 0 {
		keys := make([]string, 0, len(req.Env))
		for k := range req.Env {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b = append(b, `,"env":{`...)
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, k)
			b = append(b, ':')
			b = appendString(b, req.Env[k])
		}
		b = append(b, '}')
	}
	b = appendMember(appendMember(b, "cols", req.Cols), "rows", req.Rows)
	b = appendWait(b, req.TerminalWait)
	enc := requestBuf(append(b, '}'))
	return terminalReply("terminal_start", func(out []byte) int64 { return rawTerminalStart(enc, out) })
}

// TerminalIO writes req.Input to a terminal this plugin started (control keys as their
// bytes: Ctrl-C is "\x03", Ctrl-D "\x04"), or sends its program req.Signal ("INT",
// "TERM", "KILL"), then returns what the program wrote since the last call, once it has
// been quiet for a moment or at a bound (capability sandbox_exec). ErrNotFound once the
// program has ended and its end was reported.
func TerminalIO(req abi.TerminalIORequest) (abi.TerminalReply, []byte, error) {
	b := append(reqBuf[:0], `{"id":`...)
	b = appendString(b, req.ID)
	if req.Input != "" {
		b = append(b, `,"input":`...)
		b = appendString(b, req.Input)
	}
	if req.Signal != "" {
		b = append(b, `,"signal":`...)
		b = appendString(b, req.Signal)
	}
	b = appendWait(b, req.TerminalWait)
	enc := requestBuf(append(b, '}'))
	return terminalReply("terminal_io", func(out []byte) int64 { return rawTerminalIO(enc, out) })
}

// appendMember appends ,"key":v unless v is 0.
func appendMember(b []byte, key string, v int) []byte {
	if v == 0 {
		return b
	}
	b = append(b, ',', '"')
	b = append(b, key...)
	b = append(b, '"', ':')
	return strconv.AppendInt(b, int64(v), 10)
}

func appendWait(b []byte, w abi.TerminalWait) []byte {
	b = appendMember(b, "wait_ms", w.WaitMS)
	b = appendMember(b, "quiet_ms", w.QuietMS)
	return appendMember(b, "max_bytes", w.MaxBytes)
}

// terminalReply reads a terminal reply: a header line, then output_len raw bytes.
func terminalReply(op string, fn func(out []byte) int64) (abi.TerminalReply, []byte, error) {
	var r abi.TerminalReply
	b, owned, err := reply(op, fn)
	if err != nil {
		return r, nil, err
	}
	i := indexNewline(b)
	if i < 0 {
		return r, nil, decodeError(op)
	}
	fields, ok := members(b[:i])
	if !ok {
		return r, nil, decodeError(op)
	}
	for _, f := range fields {
		v := f.val
		switch string(f.key) {
		case "id":
			r.ID, _ = jsonString(v)
		case "pid":
			n, _ := jsonInt(v)
			r.PID = int(n)
		case "output_len":
			n, _ := jsonInt(v)
			r.OutputLen = int(n)
		case "dropped":
			r.Dropped, _ = jsonInt(v)
		case "exited":
			r.Exited = string(v) == "true"
		case "exit_code":
			n, _ := jsonInt(v)
			r.ExitCode = int(n)
		case "restarted":
			r.Restarted = string(v) == "true"
		}
	}
	out := b[i+1:]
	if r.OutputLen != len(out) {
		return r, nil, decodeError(op)
	}
	if !owned {
		out = append([]byte(nil), out...)
	}
	return r, out, nil
}
