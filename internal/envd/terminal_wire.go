package envd

// Terminals (toolhost extensions, no envd counterpart; a real envd answers 404): a program
// on a pseudo-terminal that outlives the request that started it. The agent keeps what the
// program writes (bounded, the oldest bytes dropped and counted) until a request collects
// it, so no connection has to stay open between tool calls.
//
//   - POST /toolhost/terminal/start (TerminalStartRequest) starts the program on a new
//     terminal under Tag, then collects its first output as Wait says;
//   - POST /toolhost/terminal/io (TerminalIORequest) writes Input to the terminal (or sends
//     Signal to its program's process group), then collects output.
//
// Both answer TerminalOutput. A collection ends when the program has been quiet for
// QuietMs after its last output (and at least QuietMs after the request came), at WaitMs,
// at MaxBytes, or when the program ended and its output is drained; Reason says which. The
// agent keeps each wait under a bound of its own (MaxTerminalWaitMs), shorter than the
// client's idle bound: a client that wants to wait longer asks again while Reason is
// "wait". The terminal of a program that ended goes away once a response said so.

// Paths of the terminal endpoints.
const (
	PathTerminalStart = "/toolhost/terminal/start"
	PathTerminalIO    = "/toolhost/terminal/io"
)

// Bounds of the agent's terminals.
const (
	// MaxTerminals bounds the terminals an agent keeps (running, or ended and not yet
	// collected).
	MaxTerminals = 16
	// MaxTerminalBuffer bounds the output kept per terminal between collections.
	MaxTerminalBuffer = 1 << 20
	// MaxTerminalInput bounds the input of one request.
	MaxTerminalInput = 64 << 10
	// MaxTerminalWaitMs bounds one request's wait.
	MaxTerminalWaitMs = 20_000
	// TerminalTagPrefix starts every terminal's tag, so that the process list tells them
	// from background commands.
	TerminalTagPrefix = "term-"
)

// Reasons a collection ended.
const (
	ReasonQuiet  = "quiet"
	ReasonWait   = "wait"
	ReasonFull   = "full"
	ReasonExited = "exited"
)

// TerminalWaitSpec says how a request collects output.
type TerminalWaitSpec struct {
	WaitMs   int64 `json:"waitMs,omitempty"`
	QuietMs  int64 `json:"quietMs,omitempty"`
	MaxBytes int   `json:"maxBytes,omitempty"`
}

// TerminalStartRequest starts a program on a terminal.
type TerminalStartRequest struct {
	Process ProcessConfig    `json:"process"`
	Tag     string           `json:"tag"`
	Cols    int              `json:"cols,omitempty"`
	Rows    int              `json:"rows,omitempty"`
	Wait    TerminalWaitSpec `json:"wait"`
}

// TerminalIORequest writes to a terminal, or signals its program, then collects output.
type TerminalIORequest struct {
	Tag    string           `json:"tag"`
	Input  []byte           `json:"input,omitempty"`
	Signal string           `json:"signal,omitempty"` // "INT", "TERM" or "KILL"
	Wait   TerminalWaitSpec `json:"wait"`
}

// TerminalOutput is what a request collected.
type TerminalOutput struct {
	Tag      string `json:"tag"`
	Pid      int    `json:"pid"`
	Output   []byte `json:"output,omitempty"`
	Dropped  int64  `json:"dropped,omitempty"`
	Exited   bool   `json:"exited,omitempty"`
	ExitCode int    `json:"exitCode,omitempty"`
	Reason   string `json:"reason"`
}
