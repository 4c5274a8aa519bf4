package abi

// RawJSON is raw JSON text, as encoding/json's RawMessage: it is its own encoding and
// decodes as the text it was. abi does not import encoding/json, so that a plugin built
// with the kit, which imports abi, does not link it (half a megabyte of module that the
// host decodes and validates at every load).
type RawJSON []byte

// MarshalJSON returns m, or null when m is nil.
func (m RawJSON) MarshalJSON() ([]byte, error) {
	if m == nil {
		return []byte("null"), nil
	}
	return m, nil
}

// UnmarshalJSON sets *m to a copy of data.
func (m *RawJSON) UnmarshalJSON(data []byte) error {
	*m = append((*m)[0:0], data...)
	return nil
}

// Manifest is what a plugin's describe export returns.
type Manifest struct {
	ABIVersion int    `json:"abi_version"`
	Name       string `json:"name"`
	Version    string `json:"version"`
	Tools      []Tool `json:"tools"`
	// InputForms lists the request forms the plugin reads besides JSON (ABI.md section
	// 9): with InputFramed1 the host sends framed requests.
	InputForms []string `json:"input_forms,omitempty"`
}

// Tool describes one tool: its name (what the model calls), a description written for the
// model, and the JSON Schema its input must satisfy.
type Tool struct {
	Name        string  `json:"name"`
	Description string  `json:"description"`
	InputSchema RawJSON `json:"input_schema"`
	// OutputSchema, optional, is the JSON Schema (an object schema, the input schema's
	// keywords) of the tool's structured results (ABI.md section 4.1): a tool that has one
	// returns Result.Structured with every result that is not an error, and the host
	// checks it against this schema before anyone sees it.
	OutputSchema RawJSON `json:"output_schema,omitempty"`
}

// Request is what the host writes into the input buffer before calling the call export.
type Request struct {
	Tool  string  `json:"tool"`
	Input RawJSON `json:"input"`
}

// Result is what a tool returns, and what Dispatch hands to the embedding program. Its JSON
// is the content and is_error of an Anthropic tool_result block.
type Result struct {
	Content []Content `json:"content"`
	IsError bool      `json:"is_error"`
	// Structured is the result as a JSON object following the tool's OutputSchema (an
	// exit code, the matches of a search), beside the content, which still says all of it
	// in words; nil for tools without an output schema and for errors. MCP serves it as
	// structuredContent. Not part of an Anthropic tool_result block: adapters leave it out.
	Structured RawJSON `json:"structured_content,omitempty"`
	// Stored lists what the call stored that a client may read back through the host (a
	// screenshot's images), named by URI (StoreURIPrefix + the store's key). Set by the
	// host, never by a plugin: it is not on the wire. MCP serves each as a resource_link
	// that resources/read answers for the session's own project only.
	Stored []StoredObject `json:"-"`
}

// StoreURIPrefix begins the URI of an object in the host's store (StoredObject.URI).
const StoreURIPrefix = "toolhost://store/"

// StoredObject is one object a call stored.
type StoredObject struct {
	URI      string // StoreURIPrefix + key
	Name     string // a short name: the key's last part
	MIMEType string
	Size     int64
}

// Content block types.
const (
	ContentText  = "text"
	ContentImage = "image"
)

// Content is one block of a result: text, or an image carried as base64.
type Content struct {
	Type   string       `json:"type"`
	Text   string       `json:"text,omitempty"`
	Source *ImageSource `json:"source,omitempty"`
	// Held names, inside a plugin, a host buffer of the call (ReadTextHeader.Buffer) whose
	// bytes come before Text in this text block: the framed result names the buffer and
	// the host puts its own bytes there, so they never pass through the plugin. 0 for
	// none. Never on the JSON wire.
	Held uint32 `json:"-"`
}

// ImageSource is an image's bytes, base64-encoded, with their media type (image/webp,
// image/png, image/jpeg or image/gif).
type ImageSource struct {
	Type      string `json:"type"` // always "base64"
	MediaType string `json:"media_type"`
	Data      string `json:"data"`
	// Raw holds the image's bytes instead of Data inside a plugin: the framed result
	// carries them as they are and the host does the base64. Never on the JSON wire.
	Raw []byte `json:"-"`
}

// FramedMagic starts a framed result: the binary form of a Result that needs no JSON
// escaping (ABI.md section 5). A JSON result never starts with a NUL byte.
const FramedMagic = "\x00thr1"

// FramedHeld is the kind byte of a framed result's text block that begins with a host
// buffer's bytes: 'h', u32le buffer id, u32le length, then text that follows them.
const FramedHeld = 'h'

// MaxHostBuffers is the most host buffers one call may hold; MaxHeldBytes the most bytes
// they hold together. Past either a host call that would hold one more answers
// StatusTooLarge.
const (
	MaxHostBuffers = 64
	MaxHeldBytes   = 64 << 20
)

// Text returns a result holding one text block.
func Text(s string) Result { return Result{Content: []Content{{Type: ContentText, Text: s}}} }

// Errorf-style helpers live in the plugin kit; the host builds error results with this.

// ErrorText returns an is_error result holding one text block.
func ErrorText(s string) Result {
	r := Text(s)
	r.IsError = true
	return r
}

// ExecRequest is the JSON request of toolhost_sandbox_exec.run.
type ExecRequest struct {
	// Argv is the program and its arguments, run directly (no shell). Use
	// ["bash", "-c", script] for a shell.
	Argv []string `json:"argv"`
	// Cwd is the working directory inside the sandbox; empty means the workspace root.
	Cwd string `json:"cwd,omitempty"`
	// Env adds variables to the sandbox's default environment.
	Env map[string]string `json:"env,omitempty"`
	// TimeoutMS bounds a foreground command; the host clamps it to its own maximum and
	// kills the command's whole process group when it runs out. Zero means the host default.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Background starts the command and returns at once; it lives until the sandbox closes
	// and its output goes to a log file inside the sandbox.
	Background bool `json:"background,omitempty"`
}

// ExecResult is the reply of toolhost_sandbox_exec.run. On the wire it is a one-line JSON
// header (this struct without Stdout and Stderr, with StdoutLen and StderrLen set), a
// newline, then the raw stdout bytes and the raw stderr bytes, so no output is escaped.
type ExecResult struct {
	ExitCode  int    `json:"exit_code"`
	Stdout    string `json:"-"`
	Stderr    string `json:"-"`
	StdoutLen int    `json:"stdout_len"`
	StderrLen int    `json:"stderr_len"`
	// StdoutCut and StderrCut count the bytes dropped from the middle of each stream to
	// keep the captured output within the host's limit.
	StdoutCut int64 `json:"stdout_cut,omitempty"`
	StderrCut int64 `json:"stderr_cut,omitempty"`
	TimedOut  bool  `json:"timed_out,omitempty"`
	// OOMKilled: the command was killed because the sandbox reached its memory limit.
	OOMKilled  bool  `json:"oom_killed,omitempty"`
	DurationMS int64 `json:"duration_ms"`
	// For background commands: the process id and the log file inside the sandbox.
	ID      string `json:"id,omitempty"`
	PID     int    `json:"pid,omitempty"`
	LogPath string `json:"log_path,omitempty"`
}

// ReadTextRequest is the JSON request of toolhost_sandbox_files.read_text: a window of
// the lines of a text file, cut by the host so the file never has to enter the plugin.
type ReadTextRequest struct {
	Path string `json:"path"`
	// Offset is the 1-based first line (default 1); Limit the most lines (default 2000).
	Offset int `json:"offset,omitempty"`
	Limit  int `json:"limit,omitempty"`
	// MaxLineChars cuts longer lines (default 2000 characters), marking the cut.
	MaxLineChars int `json:"max_line_chars,omitempty"`
	// MaxBytes stops the window early, after at least one line, once the text passes it
	// (default 48,000).
	MaxBytes int `json:"max_bytes,omitempty"`
	// Number prefixes each line with its number right-aligned in 6 columns and a tab.
	Number bool `json:"number,omitempty"`
	// Version asks for the file's version (as read_versioned gives it) in the header.
	Version bool `json:"version,omitempty"`
	// Hold keeps the window's text in a host buffer of the call instead of sending it:
	// the header's Buffer names it, no text follows the header, and a text block of the
	// result may name the buffer (Content.Held). A host that predates host buffers ignores
	// Hold and sends the text (Buffer is then 0).
	Hold bool `json:"hold,omitempty"`
}

// ReadTextHeader is the first line of a read_text reply; the window's text follows it,
// after a newline. When Binary is set, or Offset is past the end, the text is empty.
type ReadTextHeader struct {
	Size       int64 `json:"size"`
	TotalLines int   `json:"total_lines"`
	First      int   `json:"first"`     // first line in the window (0 when none)
	Last       int   `json:"last"`      // last line in the window (0 when none)
	Binary     bool  `json:"binary"`    // the file looks binary: NUL bytes or not text
	CutLines   int   `json:"cut_lines"` // lines cut at MaxLineChars
	Full       bool  `json:"full"`      // the window stopped at MaxBytes before Limit
	// Version is the file's version (the hex SHA-256 of all of it), when asked for.
	Version string `json:"version,omitempty"`
	// Buffer is the host buffer holding the window's text when the request asked to Hold
	// it (ABI.md section 5.1); 0 when the text follows the header.
	Buffer uint32 `json:"buffer,omitempty"`
}

// FileInfo is one entry of toolhost_sandbox_files.stat and .list replies.
type FileInfo struct {
	// Path is relative to the listed directory for list, and as given for stat.
	Path    string `json:"path"`
	Type    string `json:"type"` // "file", "dir", "symlink" or "other"
	Size    int64  `json:"size"`
	Mode    uint32 `json:"mode"`
	ModTime int64  `json:"mtime_unix_ms"`
}

// File types in FileInfo.Type.
const (
	TypeFile    = "file"
	TypeDir     = "dir"
	TypeSymlink = "symlink"
	TypeOther   = "other"
)

// ListRequest is the JSON request of toolhost_sandbox_files.list.
type ListRequest struct {
	Path string `json:"path"`
	// Recursive walks the whole tree below Path; otherwise only its direct entries.
	Recursive bool `json:"recursive,omitempty"`
	// Skip names directories (by base name) not to descend into, such as ".git".
	Skip []string `json:"skip,omitempty"`
	// Limit stops the listing after this many entries; the reply says it was cut.
	Limit int `json:"limit,omitempty"`
}

// ListResult is the JSON reply of toolhost_sandbox_files.list. Entries are sorted by path.
type ListResult struct {
	Entries   []FileInfo `json:"entries"`
	Truncated bool       `json:"truncated,omitempty"`
}

// CaptureRequest is the JSON request of toolhost_capture.capture. It names a port in the
// sandbox and a path, never a URL: the host builds the URL from the sandbox's preview.
type CaptureRequest struct {
	// Port in the sandbox; 0 means the session's default (the dev server it last saw
	// start, or the configured port).
	Port int    `json:"port,omitempty"`
	Path string `json:"path,omitempty"` // default "/"
}

// CaptureReply is the header line of a capture reply; the desktop image's bytes and then
// the mobile image's bytes (WebP) follow it, after a newline.
type CaptureReply struct {
	Port       int      `json:"port"`
	Page       string   `json:"page"` // the path captured, as the browser saw it
	Desktop    Shot     `json:"desktop"`
	Mobile     Shot     `json:"mobile"`
	Blocked    []string `json:"blocked,omitempty"`     // requests to other origins refused
	PageErrors []string `json:"page_errors,omitempty"` // uncaught JavaScript errors
	StoreError string   `json:"store_error,omitempty"` // why the images could not be stored
}

// Shot describes one captured viewport in a CaptureReply.
type Shot struct {
	Width  int    `json:"width"`
	Height int    `json:"height"`
	Bytes  int    `json:"bytes"`  // length of its WebP image in the reply
	Status int    `json:"status"` // HTTP status of the page
	Idle   bool   `json:"idle"`   // the network went idle before the shot
	Key    string `json:"key,omitempty"`
	URL    string `json:"url,omitempty"` // where the stored image can be fetched
}

// StoreObject is one entry of a toolhost_store.list reply.
type StoreObject struct {
	Key  string `json:"key"` // relative to the plugin's own prefix
	Size int64  `json:"size"`
}

// ProcessRequest is the JSON request of toolhost_sandbox_exec.process: the state of a
// background command the plugin started in this session (ExecResult.ID), and a signal to
// send its whole process group first, when Signal is set.
type ProcessRequest struct {
	ID string `json:"id"`
	// Signal is "" (none), "TERM" or "KILL".
	Signal string `json:"signal,omitempty"`
}

// ProcessReply is the JSON reply of toolhost_sandbox_exec.process.
type ProcessReply struct {
	ID      string `json:"id"`
	LogPath string `json:"log_path"`
	// Running says the process still runs (after the signal, if one was sent: a process
	// that handles TERM may still be running).
	Running bool `json:"running"`
	PID     int  `json:"pid,omitempty"`
}

// TerminalStartRequest is the JSON request of toolhost_sandbox_exec.terminal_start: run a
// command on a pseudo-terminal that outlives the call, then wait for its first output as
// TerminalIORequest says.
type TerminalStartRequest struct {
	Argv []string          `json:"argv"`
	Cwd  string            `json:"cwd,omitempty"`
	Env  map[string]string `json:"env,omitempty"`
	// Cols and Rows size the terminal (default 120 x 40).
	Cols int `json:"cols,omitempty"`
	Rows int `json:"rows,omitempty"`
	TerminalWait
}

// TerminalWait says how long a terminal call waits for output: until the program has
// been quiet for QuietMS after its last output (default 250), WaitMS in all (default
// 10,000; the host caps it), the program's end, or MaxBytes of output (default 64 KiB).
type TerminalWait struct {
	WaitMS   int `json:"wait_ms,omitempty"`
	QuietMS  int `json:"quiet_ms,omitempty"`
	MaxBytes int `json:"max_bytes,omitempty"`
}

// TerminalIORequest is the JSON request of toolhost_sandbox_exec.terminal_io: write Input
// to a terminal the plugin started in this session (control keys as their bytes: Ctrl-C is
// "\u0003"), or send it Signal ("INT", "TERM", "KILL"; KILL also forgets it), then wait
// for output.
type TerminalIORequest struct {
	ID     string `json:"id"`
	Input  string `json:"input,omitempty"`
	Signal string `json:"signal,omitempty"`
	TerminalWait
}

// TerminalReply is the header line of a terminal_start or terminal_io reply; the output
// the program wrote since the last call follows it, after a newline, OutputLen raw bytes.
type TerminalReply struct {
	ID        string `json:"id"`
	PID       int    `json:"pid,omitempty"`
	OutputLen int    `json:"output_len"`
	// Dropped counts output bytes lost because nobody read them in time (the oldest go).
	Dropped int64 `json:"dropped,omitempty"`
	// Exited: the program ended (ExitCode is then its status, -1 for a signal); its
	// terminal is gone after this reply.
	Exited   bool `json:"exited,omitempty"`
	ExitCode int  `json:"exit_code,omitempty"`
	// Restarted: the sandbox was replaced since the last call and the program was started
	// again in the new one: what it held in memory is gone.
	Restarted bool `json:"restarted,omitempty"`
}

// FetchRequest is the JSON request of toolhost_web.fetch: a GET of an http or https URL
// through the host's egress gateway, within the plugin's egress scope.
type FetchRequest struct {
	URL string `json:"url"`
	// Accept is the request's Accept header (default "text/html, text/plain, */*;q=0.5").
	Accept string `json:"accept,omitempty"`
	// MaxBytes bounds the body kept (default and cap: the host's, 5 MiB by default); a
	// longer body is cut and Truncated set.
	MaxBytes int `json:"max_bytes,omitempty"`
	// TimeoutMS bounds the whole fetch (default and cap: the host's, 30 s).
	TimeoutMS int `json:"timeout_ms,omitempty"`
}

// FetchReply is the header line of a fetch reply; the body's raw bytes follow it, after a
// newline.
type FetchReply struct {
	// URL is the URL the body came from, after redirects.
	URL         string `json:"url"`
	Status      int    `json:"status"`
	ContentType string `json:"content_type"`
	BodyLen     int    `json:"body_len"`
	Truncated   bool   `json:"truncated,omitempty"`
}
