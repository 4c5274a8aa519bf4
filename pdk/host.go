package pdk

import (
	"math"
	"slices"
	"strconv"
	"syscall"
	"unsafe"

	"github.com/toolhost/toolhost/abi"
)

// Error is a failed host function: the operation, the negative status it returned and the
// host's message from toolhost.last_error.
type Error struct {
	Op     string     // "exec", "read", "write", "stat", "list"
	Status abi.Status // the negative status
	Msg    string     // the host's message, e.g. "read notes.txt: no such file or directory"
}

func (e *Error) Error() string {
	if e.Msg != "" {
		return e.Msg
	}
	return e.Op + ": " + e.Status.String()
}

// Is matches the sentinels of this package by status, and the io/fs ones where they mean
// the same, so errors.Is(err, fs.ErrNotExist) works as it does with package os. The io/fs
// sentinels are recognised by their text: the kit does not import io/fs, which would link
// package time into every plugin.
func (e *Error) Is(target error) bool {
	if t, ok := target.(*Error); ok {
		return t.Op == "" && t.Msg == "" && t.Status == e.Status
	}
	if target == nil {
		return false
	}
	switch target.Error() { // codecheck:errtext see above: no io/fs in a plugin
	case "file does not exist": // fs.ErrNotExist
		return e.Status == abi.StatusNotFound
	case "file already exists": // fs.ErrExist
		return e.Status == abi.StatusExists
	case "permission denied": // fs.ErrPermission
		return e.Status == abi.StatusPermission
	}
	return false
}

// Sentinels for errors.Is, one per status of ABI.md section 3.1.
var (
	ErrPermission = &Error{Status: abi.StatusPermission}
	ErrNotFound   = &Error{Status: abi.StatusNotFound}
	ErrIO         = &Error{Status: abi.StatusIO}
	ErrBadPointer = &Error{Status: abi.StatusBadPointer}
	ErrExists     = &Error{Status: abi.StatusExists}
	ErrOutside    = &Error{Status: abi.StatusOutside}
	ErrNotDir     = &Error{Status: abi.StatusNotDir}
	ErrIsDir      = &Error{Status: abi.StatusIsDir}
	ErrInvalid    = &Error{Status: abi.StatusInvalid}
	ErrTooLarge   = &Error{Status: abi.StatusTooLarge}
	ErrTimeout    = &Error{Status: abi.StatusTimeout}
	ErrChanged    = &Error{Status: abi.StatusChanged}
)

// statusError builds the Error of a negative status, fetching the host's message.
func statusError(op string, n int64) *Error {
	e := &Error{Op: op, Status: abi.Status(n)}
	var small [256]byte
	buf := small[:]
	for range 2 { // the second round only if the message did not fit
		m := rawLastError(buf)
		if m <= 0 {
			break
		}
		if m <= int64(len(buf)) {
			e.Msg = string(buf[:m])
			break
		}
		buf = make([]byte, m)
	}
	return e
}

// The reusable reply buffer of the two-call protocol: it starts at 4 KiB and grows up to
// 64 KiB, so most replies cost one host call; bigger ones get their own allocation.
const (
	scratchMin = 4 << 10
	scratchMax = 64 << 10
)

var scratch []byte

// reqBuf holds the request of the host call under way: an allocation in a guest costs
// about 1.5 µs (mallocgc is branchy code, and every branch pays an exit check), and
// building a request from nil took five.
var reqBuf []byte

// requestBuf keeps b's array for the next request, unless it has grown past 64 KiB, and
// returns b.
func requestBuf(b []byte) []byte {
	if cap(b) <= scratchMax {
		reqBuf = b[:0]
	}
	return b
}

// reply calls fn with the reply buffer and takes a parked reply if it was too short. The
// result aliases scratch (owned false) unless it needed its own allocation; either way it
// is valid only until the next host call.
func reply(op string, fn func(out []byte) int64) (b []byte, owned bool, err error) {
	if scratch == nil {
		scratch = make([]byte, scratchMin)
	}
	n := fn(scratch)
	if n < 0 {
		return nil, false, statusError(op, n)
	}
	if n <= int64(len(scratch)) {
		return scratch[:n], false, nil
	}
	if n <= scratchMax {
		size := len(scratch)
		for int64(size) < n {
			size *= 2
		}
		scratch = make([]byte, size)
		b = scratch[:n]
	} else {
		b, owned = make([]byte, n), true
	}
	if m := rawTake(b); m != n {
		if m < 0 {
			return nil, false, statusError(op, m)
		}
		return nil, false, &Error{Op: op, Status: abi.StatusIO, Msg: op + ": take returned " +
			strconv.FormatInt(m, 10) + " bytes, want " + strconv.FormatInt(n, 10)}
	}
	return b, owned, nil
}

func decodeError(op string) error {
	return &Error{Op: op, Status: abi.StatusInvalid, Msg: op + ": could not decode the host's reply"}
}

// Exec runs a command in the session's sandbox (capability sandbox_exec). A command that
// runs and fails is not an error: look at ExitCode and TimedOut. Stdout and Stderr hold the
// bytes the command wrote, which need not be UTF-8.
func Exec(req abi.ExecRequest) (abi.ExecResult, error) {
	enc := requestBuf(appendExecRequest(reqBuf[:0], req))
	b, _, err := reply("exec", func(out []byte) int64 { return rawExec(enc, out) })
	if err != nil {
		return abi.ExecResult{}, err
	}
	res, ok := decodeExecResult(b)
	if !ok {
		return res, decodeError("exec")
	}
	return res, nil
}

// ReadText returns a window of the lines of a text file (capability sandbox_files): the
// host counts lines, sniffs for binary data, cuts long lines and numbers them, so a large
// file never has to enter the plugin. See abi.ReadTextRequest for the options.
func ReadText(req abi.ReadTextRequest) (abi.ReadTextHeader, string, error) {
	enc := requestBuf(appendReadTextRequest(reqBuf[:0], req))
	b, _, err := reply("read_text", func(out []byte) int64 { return rawReadText(enc, out) })
	if err != nil {
		return abi.ReadTextHeader{}, "", err
	}
	h, text, ok := decodeReadText(b)
	if !ok {
		return h, "", decodeError("read_text")
	}
	return h, text, nil
}

// HeldText is the text of a read_text window that stayed on the host (ReadTextHeld). A
// result shows it with Block, and the host puts its own bytes there: the text never
// enters the plugin and never leaves it again. It is valid until the tool call returns.
type HeldText struct {
	id   uint32 // the host buffer; 0 when the host sent the text
	text string // the text, from a host that predates host buffers
}

// Block is a text block of the held text followed by suffix.
func (t HeldText) Block(suffix string) abi.Content {
	if t.id == 0 {
		return abi.Content{Type: abi.ContentText, Text: t.text + suffix}
	}
	return abi.Content{Type: abi.ContentText, Held: t.id, Text: suffix}
}

// ReadTextHeld is ReadText for a plugin that returns the window's text as it is, perhaps
// with a note after it: the text stays on the host, in a buffer of the call (ABI.md
// section 5.1), and the plugin gets the header only. The header's Buffer names the buffer
// (0 from a host that sent the text, which HeldText then carries).
func ReadTextHeld(req abi.ReadTextRequest) (abi.ReadTextHeader, HeldText, error) {
	req.Hold = true
	h, text, err := ReadText(req)
	return h, HeldText{id: h.Buffer, text: text}, err
}

// ReadFile returns the contents of a file in the workspace (capability sandbox_files).
func ReadFile(path string) ([]byte, error) {
	b, owned, err := reply("read", func(out []byte) int64 { return rawRead(path, out) })
	if err != nil {
		return nil, err
	}
	if !owned {
		b = append([]byte(nil), b...)
	}
	return b, nil
}

// ReadFileString is ReadFile returning a string, copying the host's reply once, where
// string(ReadFile(path)) copies it twice (capability sandbox_files).
func ReadFileString(path string) (string, error) {
	b, owned, err := reply("read", func(out []byte) int64 { return rawRead(path, out) })
	if err != nil {
		return "", err
	}
	if owned { // a buffer of its own, which nothing else holds
		return unsafe.String(unsafe.SliceData(b), len(b)), nil
	}
	return string(b), nil
}

// WriteFile creates or replaces a file in the workspace, creating its parent directories
// (capability sandbox_files).
func WriteFile(path string, data []byte) error {
	if n := rawWrite(path, data); n < 0 {
		return statusError("write", n)
	}
	return nil
}

// ReadFileVersioned reads a file of the workspace like ReadFile and returns its version
// too, for WriteFileVersioned (capability sandbox_files).
func ReadFileVersioned(path string) (data []byte, version string, err error) {
	b, owned, err := reply("read_versioned", func(out []byte) int64 { return rawReadVersioned(path, out) })
	if err != nil {
		return nil, "", err
	}
	if len(b) < abi.VersionLen+1 || b[abi.VersionLen] != '\n' {
		return nil, "", decodeError("read_versioned")
	}
	version = string(b[:abi.VersionLen])
	b = b[abi.VersionLen+1:]
	if !owned {
		b = append([]byte(nil), b...)
	}
	return b, version, nil
}

// WriteFileVersioned replaces a file only if it still has version (from
// ReadFileVersioned; "" for a file that must not exist yet). When another call changed it
// meanwhile, it returns an error matching ErrChanged: read it again and redo the change
// (capability sandbox_files).
func WriteFileVersioned(path string, data []byte, version string) error {
	if n := rawWriteVersioned(path, data, version); n < 0 {
		return statusError("write", n)
	}
	return nil
}

// Stat describes a path in the workspace without following a final symbolic link
// (capability sandbox_files).
func Stat(path string) (abi.FileInfo, error) {
	b, _, err := reply("stat", func(out []byte) int64 { return rawStat(path, out) })
	if err != nil {
		return abi.FileInfo{}, err
	}
	fi, ok := decodeFileInfo(b)
	if !ok {
		return fi, decodeError("stat")
	}
	return fi, nil
}

// List returns the entries below a directory of the workspace, sorted by path
// (capability sandbox_files).
func List(req abi.ListRequest) (abi.ListResult, error) {
	enc := requestBuf(appendListRequest(reqBuf[:0], req))
	b, _, err := reply("list", func(out []byte) int64 { return rawList(enc, out) })
	if err != nil {
		return abi.ListResult{}, err
	}
	res, ok := decodeListResult(b)
	if !ok {
		return res, decodeError("list")
	}
	return res, nil
}

// Log writes a message to the host's log at a level of abi.LevelDebug .. abi.LevelError
// (capability log).
func Log(level int32, msg string) { rawLog(level, msg) }

// Config returns the plugin configuration value key (ABI.md section 6), or "".
func Config(key string) string {
	v, _ := syscall.Getenv(key) // os.Getenv without package os, which a plugin need not link
	return v
}

// Encoders and decoders of the wire types in abi/wire.go.

func appendExecRequest(b []byte, r abi.ExecRequest) []byte {
	b = append(b, `{"argv":[`...)
	for i, a := range r.Argv {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, a)
	}
	b = append(b, ']')
	if r.Cwd != "" {
		b = append(b, `,"cwd":`...)
		b = appendString(b, r.Cwd)
	}
	if len(r.Env) > 0 {
		keys := make([]string, 0, len(r.Env))
		for k := range r.Env {
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
			b = appendString(b, r.Env[k])
		}
		b = append(b, '}')
	}
	if r.TimeoutMS != 0 {
		b = append(b, `,"timeout_ms":`...)
		b = strconv.AppendInt(b, r.TimeoutMS, 10)
	}
	if r.Background {
		b = append(b, `,"background":true`...)
	}
	return append(b, '}')
}

func appendListRequest(b []byte, r abi.ListRequest) []byte {
	b = append(b, `{"path":`...)
	b = appendString(b, r.Path)
	if r.Recursive {
		b = append(b, `,"recursive":true`...)
	}
	if len(r.Skip) > 0 {
		b = append(b, `,"skip":[`...)
		for i, s := range r.Skip {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, s)
		}
		b = append(b, ']')
	}
	if r.Limit != 0 {
		b = append(b, `,"limit":`...)
		b = strconv.AppendInt(b, int64(r.Limit), 10)
	}
	return append(b, '}')
}

var replyFields []field

// members parses a reply object, reusing one field slice.
func members(b []byte) ([]field, bool) {
	f, ok := objectFields(replyFields[:0], b)
	replyFields = f[:0]
	return f, ok
}

// decodeExecResult reads a JSON header line, then stdout_len bytes of stdout and
// stderr_len bytes of stderr, raw. A reply without a newline is the whole-JSON form of
// earlier hosts, with the streams as JSON strings.
func decodeExecResult(b []byte) (r abi.ExecResult, ok bool) {
	header, rest := b, []byte(nil)
	framed := false
	if i := indexNewline(b); i >= 0 {
		header, rest, framed = b[:i], b[i+1:], true
	}
	if fr, ok := fastExecHeader(header); ok {
		r = fr
	} else if r, ok = slowExecHeader(header); !ok {
		return r, false
	}
	if framed {
		if r.StdoutLen < 0 || r.StderrLen < 0 || r.StdoutLen+r.StderrLen != len(rest) {
			return r, false
		}
		r.Stdout = string(rest[:r.StdoutLen])
		r.Stderr = string(rest[r.StdoutLen:])
	} else {
		r.StdoutLen, r.StderrLen = len(r.Stdout), len(r.Stderr)
	}
	return r, true
}

// fastExecHeader reads an exec header in exactly the shape encoding/json gives it (the
// host's): its keys in order, those with omitempty only when set, no whitespace, strings
// without escapes. A generic JSON scan of the same header costs a guest about 25 µs
// (every branch of Go wasm under CloseOnContextDone pays an exit check); this is a few.
// Anything else is left to slowExecHeader (ok false).
func fastExecHeader(b []byte) (r abi.ExecResult, ok bool) {
	var n int64
	i := 0
	if n, i = digits(b, lit(b, i, `{"exit_code":`)); i < 0 {
		return r, false
	}
	r.ExitCode = int(n)
	if n, i = digits(b, lit(b, i, `,"stdout_len":`)); i < 0 {
		return r, false
	}
	r.StdoutLen = int(n)
	if n, i = digits(b, lit(b, i, `,"stderr_len":`)); i < 0 {
		return r, false
	}
	r.StderrLen = int(n)
	if j := lit(b, i, `,"stdout_cut":`); j > 0 {
		if r.StdoutCut, i = digits(b, j); i < 0 {
			return r, false
		}
	}
	if j := lit(b, i, `,"stderr_cut":`); j > 0 {
		if r.StderrCut, i = digits(b, j); i < 0 {
			return r, false
		}
	}
	if j := lit(b, i, `,"timed_out":true`); j > 0 {
		r.TimedOut, i = true, j
	}
	if j := lit(b, i, `,"oom_killed":true`); j > 0 {
		r.OOMKilled, i = true, j
	}
	if r.DurationMS, i = digits(b, lit(b, i, `,"duration_ms":`)); i < 0 {
		return r, false
	}
	if j := lit(b, i, `,"id":`); j > 0 {
		if r.ID, i = plainString(b, j); i < 0 {
			return r, false
		}
	}
	if j := lit(b, i, `,"pid":`); j > 0 {
		if n, i = digits(b, j); i < 0 {
			return r, false
		}
		r.PID = int(n)
	}
	if j := lit(b, i, `,"log_path":`); j > 0 {
		if r.LogPath, i = plainString(b, j); i < 0 {
			return r, false
		}
	}
	return r, i == len(b)-1 && b[i] == '}'
}

// plainString reads a JSON string without escapes at b[i]; -1 if there is none.
func plainString(b []byte, i int) (string, int) {
	if i < 0 || i >= len(b) || b[i] != '"' {
		return "", -1
	}
	end, esc := scanString(b, i)
	if end < 0 || esc {
		return "", -1
	}
	return string(b[i+1 : end-1]), end
}

// slowExecHeader reads an exec header in any shape, including the whole-JSON reply of
// earlier hosts with the streams as JSON strings.
func slowExecHeader(header []byte) (r abi.ExecResult, ok bool) {
	fields, ok := members(header)
	if !ok {
		return r, false
	}
	for _, f := range fields {
		v := f.val
		switch string(f.key) {
		case "exit_code":
			n, _ := jsonInt(v)
			r.ExitCode = int(n)
		case "stdout":
			r.Stdout, _ = jsonString(v)
		case "stderr":
			r.Stderr, _ = jsonString(v)
		case "stdout_len":
			n, _ := jsonInt(v)
			r.StdoutLen = int(n)
		case "stderr_len":
			n, _ := jsonInt(v)
			r.StderrLen = int(n)
		case "stdout_cut":
			r.StdoutCut, _ = jsonInt(v)
		case "stderr_cut":
			r.StderrCut, _ = jsonInt(v)
		case "timed_out":
			r.TimedOut = string(v) == "true"
		case "oom_killed":
			r.OOMKilled = string(v) == "true"
		case "duration_ms":
			r.DurationMS, _ = jsonInt(v)
		case "id":
			r.ID, _ = jsonString(v)
		case "pid":
			n, _ := jsonInt(v)
			r.PID = int(n)
		case "log_path":
			r.LogPath, _ = jsonString(v)
		}
	}
	return r, true
}

// indexNewline finds the end of a JSON header line: JSON text holds no raw newline outside
// whitespace, and the hosts write none.
func indexNewline(b []byte) int {
	for i := 0; i < len(b); i++ {
		if i+8 <= len(b) && !hasZero8(load8(unsafe.Pointer(&b[i]))^(lo8*'\n')) {
			i += 7 // no newline in these eight bytes
			continue
		}
		if b[i] == '\n' {
			return i
		}
	}
	return -1
}

func decodeReadText(b []byte) (h abi.ReadTextHeader, text string, ok bool) {
	i := indexNewline(b)
	if i < 0 {
		return h, "", false
	}
	if h, ok := fastReadTextHeader(b[:i]); ok {
		return h, string(b[i+1:]), true
	}
	fields, ok := members(b[:i])
	if !ok {
		return h, "", false
	}
	for _, f := range fields {
		v := f.val
		switch string(f.key) {
		case "size":
			h.Size, _ = jsonInt(v)
		case "total_lines":
			n, _ := jsonInt(v)
			h.TotalLines = int(n)
		case "first":
			n, _ := jsonInt(v)
			h.First = int(n)
		case "last":
			n, _ := jsonInt(v)
			h.Last = int(n)
		case "binary":
			h.Binary = string(v) == "true"
		case "cut_lines":
			n, _ := jsonInt(v)
			h.CutLines = int(n)
		case "full":
			h.Full = string(v) == "true"
		case "version":
			h.Version, _ = jsonString(v)
		case "buffer":
			n, _ := jsonInt(v)
			if n > 0 && n <= math.MaxUint32 {
				h.Buffer = uint32(n)
			}
		}
	}
	return h, string(b[i+1:]), true
}

// fastReadTextHeader reads a read_text header in exactly the shape encoding/json gives it
// (see fastExecHeader); ok false leaves it to the generic reader.
func fastReadTextHeader(b []byte) (h abi.ReadTextHeader, ok bool) {
	var n int64
	i := 0
	if h.Size, i = digits(b, lit(b, i, `{"size":`)); i < 0 {
		return h, false
	}
	if n, i = digits(b, lit(b, i, `,"total_lines":`)); i < 0 {
		return h, false
	}
	h.TotalLines = int(n)
	if n, i = digits(b, lit(b, i, `,"first":`)); i < 0 {
		return h, false
	}
	h.First = int(n)
	if n, i = digits(b, lit(b, i, `,"last":`)); i < 0 {
		return h, false
	}
	h.Last = int(n)
	if h.Binary, i = boolean(b, lit(b, i, `,"binary":`)); i < 0 {
		return h, false
	}
	if n, i = digits(b, lit(b, i, `,"cut_lines":`)); i < 0 {
		return h, false
	}
	h.CutLines = int(n)
	if h.Full, i = boolean(b, lit(b, i, `,"full":`)); i < 0 {
		return h, false
	}
	// Then the members omitted when empty, in order: "version" (64 hex characters) and
	// "buffer".
	if j := lit(b, i, `,"version":"`); j > 0 {
		if j+abi.VersionLen >= len(b) || b[j+abi.VersionLen] != '"' {
			return h, false
		}
		for _, c := range b[j : j+abi.VersionLen] {
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return h, false
			}
		}
		h.Version, i = string(b[j:j+abi.VersionLen]), j+abi.VersionLen+1
	}
	if j := lit(b, i, `,"buffer":`); j > 0 {
		if n, i = digits(b, j); i < 0 || n < 1 || n > math.MaxUint32 {
			return h, false
		}
		h.Buffer = uint32(n)
	}
	return h, i == len(b)-1 && b[i] == '}'
}

// boolean reads true or false at b[i]; -1 if neither.
func boolean(b []byte, i int) (bool, int) {
	if j := lit(b, i, "true"); j > 0 {
		return true, j
	}
	return false, lit(b, i, "false")
}

func appendReadTextRequest(b []byte, r abi.ReadTextRequest) []byte {
	b = append(b, `{"path":`...)
	b = appendString(b, r.Path)
	for _, kv := range [...]struct {
		k string
		v int
	}{{"offset", r.Offset}, {"limit", r.Limit}, {"max_line_chars", r.MaxLineChars}, {"max_bytes", r.MaxBytes}} {
		if kv.v != 0 {
			b = append(b, ',', '"')
			b = append(b, kv.k...)
			b = append(b, '"', ':')
			b = strconv.AppendInt(b, int64(kv.v), 10)
		}
	}
	if r.Number {
		b = append(b, `,"number":true`...)
	}
	if r.Version {
		b = append(b, `,"version":true`...)
	}
	if r.Hold {
		b = append(b, `,"hold":true`...)
	}
	return append(b, '}')
}

func decodeFileInfo(b []byte) (fi abi.FileInfo, ok bool) {
	d := cursor{b: b}
	fi, ok = d.fileInfo()
	return fi, ok && d.end()
}

// decodeListResult decodes a list reply in one pass: a listing of a large tree is megabytes
// of JSON, and every extra pass over it costs tens of milliseconds in a guest.
func decodeListResult(b []byte) (r abi.ListResult, ok bool) {
	d := cursor{b: b}
	ok = d.object(func(key []byte) bool {
		switch string(key) {
		case "entries":
			if d.null() {
				return true
			}
			return d.array(func() bool {
				fi, ok := d.fileInfo()
				r.Entries = append(r.Entries, fi)
				return ok
			})
		case "truncated":
			r.Truncated = d.boolean()
			return true
		}
		return d.skip()
	})
	return r, ok && d.end()
}

// cursor is a one-pass reader of a JSON value, for the replies that can be large.
type cursor struct {
	b []byte
	i int
}

func (d *cursor) peek() byte {
	d.i = skipWS(d.b, d.i)
	if d.i < len(d.b) {
		return d.b[d.i]
	}
	return 0
}

func (d *cursor) end() bool { return skipWS(d.b, d.i) == len(d.b) }

func (d *cursor) skip() bool {
	d.i = skipValue(d.b, d.i)
	return d.i >= 0
}

func (d *cursor) null() bool {
	if d.peek() == 'n' && literal(d.b, d.i, "null") > 0 {
		d.i += 4
		return true
	}
	return false
}

func (d *cursor) boolean() bool {
	switch d.peek() {
	case 't':
		d.i = literal(d.b, d.i, "true")
		return d.i > 0
	case 'f':
		d.i = literal(d.b, d.i, "false")
	default:
		d.skip()
	}
	return false
}

// object calls member with each key (raw, unescaped only when needed); member must
// consume the value.
func (d *cursor) object(member func(key []byte) bool) bool {
	if d.peek() != '{' {
		return false
	}
	d.i++
	if d.peek() == '}' {
		d.i++
		return true
	}
	for {
		if d.peek() != '"' {
			return false
		}
		end, esc := scanString(d.b, d.i)
		if end < 0 {
			return false
		}
		key := d.b[d.i+1 : end-1]
		if esc {
			key = unescape(nil, key)
		}
		d.i = end
		if d.peek() != ':' {
			return false
		}
		d.i++
		if !member(key) || d.i < 0 {
			return false
		}
		switch d.peek() {
		case ',':
			d.i++
		case '}':
			d.i++
			return true
		default:
			return false
		}
	}
}

func (d *cursor) array(elem func() bool) bool {
	if d.peek() != '[' {
		return false
	}
	d.i++
	if d.peek() == ']' {
		d.i++
		return true
	}
	for {
		if !elem() || d.i < 0 {
			return false
		}
		switch d.peek() {
		case ',':
			d.i++
		case ']':
			d.i++
			return true
		default:
			return false
		}
	}
}

func (d *cursor) str() string {
	if d.peek() != '"' {
		d.skip()
		return ""
	}
	end, esc := scanString(d.b, d.i)
	if end < 0 {
		d.i = -1
		return ""
	}
	tok := d.b[d.i:end]
	d.i = end
	return unquote(tok, esc)
}

func (d *cursor) int() int64 {
	start := skipWS(d.b, d.i)
	if !d.skip() {
		return 0
	}
	n, _ := jsonInt(d.b[start:d.i])
	return n
}

// fileInfo reads one FileInfo object; the type names are interned, not allocated.
func (d *cursor) fileInfo() (fi abi.FileInfo, ok bool) {
	if fi, ok := d.fastFileInfo(); ok {
		return fi, true
	}
	ok = d.object(func(key []byte) bool {
		switch string(key) {
		case "path":
			fi.Path = d.str()
		case "type":
			if d.peek() == '"' {
				if end, esc := scanString(d.b, d.i); end > 0 && !esc {
					switch string(d.b[d.i+1 : end-1]) {
					case abi.TypeFile:
						fi.Type, d.i = abi.TypeFile, end
						return true
					case abi.TypeDir:
						fi.Type, d.i = abi.TypeDir, end
						return true
					}
				}
			}
			fi.Type = d.str()
		case "size":
			fi.Size = d.int()
		case "mode":
			fi.Mode = uint32(d.int())
		case "mtime_unix_ms":
			fi.ModTime = d.int()
		default:
			return d.skip()
		}
		return d.i >= 0
	})
	return fi, ok
}

// fastFileInfo reads a FileInfo in exactly the shape encoding/json gives it (the host's):
// its keys in order, no whitespace, a path without escapes. Function calls are costly in a
// guest, and a listing holds thousands of these; anything else is left to the generic
// reader (ok false, cursor unmoved).
func (d *cursor) fastFileInfo() (fi abi.FileInfo, ok bool) {
	b, i := d.b, d.i
	if i = lit(b, i, `{"path":`); i < 0 || i >= len(b) || b[i] != '"' {
		return fi, false
	}
	end, esc := scanString(b, i)
	if end < 0 || esc {
		return fi, false
	}
	fi.Path = string(b[i+1 : end-1])
	if i = lit(b, end, `,"type":"`); i < 0 {
		return fi, false
	}
	switch {
	case lit(b, i, `file"`) > 0:
		fi.Type, i = abi.TypeFile, i+5
	case lit(b, i, `dir"`) > 0:
		fi.Type, i = abi.TypeDir, i+4
	case lit(b, i, `symlink"`) > 0:
		fi.Type, i = abi.TypeSymlink, i+8
	case lit(b, i, `other"`) > 0:
		fi.Type, i = abi.TypeOther, i+6
	default:
		return fi, false
	}
	var mode int64
	if fi.Size, i = digits(b, lit(b, i, `,"size":`)); i < 0 {
		return fi, false
	}
	if mode, i = digits(b, lit(b, i, `,"mode":`)); i < 0 {
		return fi, false
	}
	fi.Mode = uint32(mode)
	if fi.ModTime, i = digits(b, lit(b, i, `,"mtime_unix_ms":`)); i < 0 || i >= len(b) || b[i] != '}' {
		return fi, false
	}
	d.i = i + 1
	return fi, true
}

// lit returns the index after s if b holds s at i, else -1 (also for i < 0).
func lit(b []byte, i int, s string) int {
	if i < 0 || len(b)-i < len(s) || string(b[i:i+len(s)]) != s {
		return -1
	}
	return i + len(s)
}

// digits reads an optionally negative decimal integer that ends at ',' or '}'; -1 if
// there is none (a fraction or an exponent is left to the generic reader).
func digits(b []byte, i int) (int64, int) {
	if i < 0 || i >= len(b) {
		return 0, -1
	}
	neg := b[i] == '-'
	if neg {
		i++
	}
	start := i
	var n int64
	for i < len(b) && b[i] >= '0' && b[i] <= '9' && i-start < 18 {
		n = n*10 + int64(b[i]-'0')
		i++
	}
	if i == start || i >= len(b) || (b[i] != ',' && b[i] != '}') || (b[start] == '0' && i-start > 1) {
		return 0, -1
	}
	if neg {
		n = -n
	}
	return n, i
}
