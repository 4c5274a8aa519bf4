package e2b

import (
	"path"
	"strconv"
	"time"
)

// E2B's envd starts a command as its own child and, when the command's Connect deadline
// passes or SendSignal arrives, signals that child alone: whatever the command started
// lives on. So every foreground command runs under coreutils' timeout(1), which makes
// itself and the command a process group of their own; at the timeout it sends SIGKILL
// to the whole group, and a SIGTERM sent to it (what the client sends a command it gives
// up on) is passed to the group, then SIGKILL follows killGrace later. envd's own
// deadline is set a margin after the timeout (client.Config.TimeoutMargin), so
// timeout(1) acts first.

const killGrace = "2" // seconds between the SIGTERM timeout(1) passes on and its SIGKILL

// wrapTimeout runs argv under timeout(1); a zero timeout sets no time limit but keeps the
// process group and the passing on of signals.
func wrapTimeout(argv []string, timeout time.Duration) []string {
	secs := "0"
	if timeout > 0 {
		secs = strconv.FormatFloat(max(timeout.Seconds(), 0.001), 'f', 3, 64)
	}
	return append([]string{"timeout", "-k", killGrace, "-s", "KILL", secs}, argv...)
}

// BackgroundLogDir is where background commands log inside an E2B sandbox (as in a local
// one).
const BackgroundLogDir = "/tmp/toolhost"

// wrapBackground appends a background command's stdout and stderr to a log file named
// after its tag (tags are [a-z0-9-]), with stdin from /dev/null.
func wrapBackground(argv []string, tag string) ([]string, string) {
	logPath := path.Join(BackgroundLogDir, tag+".log")
	script := `l=$1; shift; mkdir -p "${l%/*}" && exec "$@" >>"$l" 2>&1 </dev/null`
	return append([]string{"/bin/sh", "-c", script, "sh", logPath}, argv...), logPath
}
