//go:build linux

package local

import (
	"bytes"
	"context"
	"log/slog"
	"strconv"
	"sync"
)

// Bounds of what a sandbox's output may cost the host.
const (
	outputTail     = 4 << 10  // kept for error messages
	outputLogged   = 64 << 10 // logged at debug level, at most, per sandbox
	outputLineSize = 512      // longest line logged
)

// sandboxOutput receives the stderr of bwrap and of the agent (their stdout is
// /dev/null). It is the sandbox speaking, so it is hostile input: it never reaches the
// host's log as the sandbox wrote it. It keeps the last few KiB (quoted into an error
// message when the sandbox fails to start or dies), logs lines at debug level, quoted and
// cut, up to a budget per sandbox, and drains the rest so that no writer ever blocks.
type sandboxOutput struct {
	log *slog.Logger

	mu     sync.Mutex
	tail   []byte
	line   []byte // incomplete line
	logged int
	muted  bool
}

func (o *sandboxOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.tail = append(o.tail, p...)
	if len(o.tail) > outputTail {
		o.tail = append(o.tail[:0], o.tail[len(o.tail)-outputTail:]...)
	}
	if o.muted || !o.log.Enabled(context.Background(), slog.LevelDebug) {
		return len(p), nil
	}
	o.line = append(o.line, p...)
	for {
		i := bytes.IndexByte(o.line, '\n')
		if i < 0 && len(o.line) < outputLineSize {
			break
		}
		n := i
		if i < 0 || i > outputLineSize {
			n = min(len(o.line), outputLineSize)
		}
		o.emit(o.line[:n])
		if i >= 0 && i <= outputLineSize {
			n++ // the newline
		}
		o.line = append(o.line[:0], o.line[n:]...)
		if o.muted {
			o.line = nil
			break
		}
	}
	return len(p), nil
}

func (o *sandboxOutput) emit(b []byte) {
	if o.logged+len(b) > outputLogged {
		o.muted = true
		o.log.Debug("sandbox output: more than the logging budget; the rest is dropped", "budget", outputLogged)
		return
	}
	o.logged += len(b)
	o.log.Debug("sandbox output", "line", strconv.Quote(string(b)))
}

// String is the tail, quoted: safe to put in a log record or an error.
func (o *sandboxOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return strconv.Quote(string(bytes.TrimSpace(o.tail)))
}
