package audit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
)

// maxBuffered is how many bytes of lines a Writer holds before Record waits for the disk.
const maxBuffered = 4 << 20

// flushDelay is how long the Writer gathers lines before it writes them: one write for
// the lines of many calls, and lines on disk a moment after their calls.
const flushDelay = 20 * time.Millisecond

// Writer is a Sink that appends records to a file as JSON lines, one per record. Record
// only encodes the line into a buffer; a goroutine the Writer owns writes the buffer out,
// so a host call never waits for the disk (unless 4 MiB of lines are waiting). Lines reach
// the file in order, within 20 ms of their calls (written together); Close writes the
// rest. A process that is killed loses the lines of its last 20 ms.
type Writer struct {
	w    io.Writer
	file *os.File // when the Writer opened it (owned by the flusher once started)
	path string   // the file's path, when Create opened it
	opts FileOptions

	mu      sync.Mutex
	drained *sync.Cond // signalled when the buffer was taken
	buf     []byte     // lines not written yet
	spare   []byte     // the other buffer, reused
	closed  bool
	err     error // the first write error

	wake chan struct{} // a line is waiting (capacity 1)
	stop chan struct{} // closed by Close
	done chan struct{} // closed when the flusher has returned
}

// FileOptions configure the file of CreateFile.
type FileOptions struct {
	// MaxBytes rotates the file before a write would take it past this size: PATH becomes
	// PATH.1 (PATH.1 becomes PATH.2, and so on up to Keep; the oldest goes) and a new PATH
	// is started. Zero means DefaultMaxBytes; negative, never.
	MaxBytes int64
	// Keep is how many rotated files are kept; zero means DefaultKeep.
	Keep int
}

// Defaults of FileOptions.
const (
	DefaultMaxBytes = 64 << 20
	DefaultKeep     = 3
)

// Create is CreateFile with the default options.
func Create(path string) (*Writer, error) { return CreateFile(path, FileOptions{}) }

// CreateFile opens (or creates, 0600) the file at path for appending and starts its
// Writer. It does not follow a symbolic link at path. Several processes may append to
// one path: each line is one write(2) in append mode, one of them rotates the file
// (holding an flock of it meanwhile) and the others follow the path to the new file.
func CreateFile(path string, opts FileOptions) (*Writer, error) {
	if opts.MaxBytes == 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	if opts.Keep <= 0 {
		opts.Keep = DefaultKeep
	}
	f, err := openAudit(path)
	if err != nil {
		return nil, err
	}
	w := NewWriter(nil)
	w.mu.Lock()
	w.w, w.file, w.path, w.opts = f, f, path, opts
	w.mu.Unlock()
	return w, nil
}

// prepare makes the file ready for n more bytes: it follows a rotation another process
// made, and rotates when the file would grow past MaxBytes. Only the flusher calls it.
func (w *Writer) prepare(n int) error {
	if w.path == "" {
		return nil
	}
	if !isPath(w.file, w.path) {
		return w.reopen()
	}
	fi, err := w.file.Stat()
	if err != nil {
		return err
	}
	if size := fi.Size(); w.opts.MaxBytes < 0 || size == 0 || size+int64(n) <= w.opts.MaxBytes {
		return nil
	}
	unlock, err := lockFile(w.file)
	if err != nil {
		return err
	}
	err = w.rotateLocked()
	// Unlocked here, before reopen closes the file: never by a deferred unlock of the fd's
	// number after the close, which could unlock whatever file another open (another
	// Writer's reopen) was given that number meanwhile, and let two rotations run at once
	// (each renaming over the other's files: lines lost).
	unlock()
	if err != nil {
		return err
	}
	return w.reopen()
}

// rotateLocked moves PATH.N to PATH.N+1 (dropping what passes Keep) and PATH to PATH.1,
// unless another Writer already rotated the file w holds. The caller holds its flock.
func (w *Writer) rotateLocked() error {
	if !isPath(w.file, w.path) { // rotated by another process meanwhile
		return nil
	}
	for i := w.opts.Keep - 1; i >= 1; i-- {
		if err := os.Rename(fmt.Sprintf("%s.%d", w.path, i), fmt.Sprintf("%s.%d", w.path, i+1)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("rotating the audit: %w", err)
		}
	}
	if err := os.Rename(w.path, w.path+".1"); err != nil {
		return fmt.Errorf("rotating the audit: %w", err)
	}
	return nil
}

// reopen opens the file at the path again and writes there from now on.
func (w *Writer) reopen() error {
	f, err := openAudit(w.path)
	if err != nil {
		return err
	}
	old := w.file
	w.mu.Lock()
	w.w, w.file = f, f
	w.mu.Unlock()
	return old.Close()
}

// NewWriter starts a Writer that writes lines to w. Close stops it (and does not close w).
func NewWriter(w io.Writer) *Writer {
	aw := &Writer{w: w, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	aw.drained = sync.NewCond(&aw.mu)
	// The flusher: owned by the Writer, stopped by Close.
	go aw.flusher()
	return aw
}

// Record implements Sink.
func (w *Writer) Record(r *Record) {
	w.mu.Lock()
	for len(w.buf) > maxBuffered && !w.closed {
		w.drained.Wait()
	}
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.buf = AppendJSON(w.buf, r)
	w.buf = append(w.buf, '\n')
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *Writer) flusher() {
	defer close(w.done)
	delay := time.NewTimer(flushDelay)
	delay.Stop()
	for {
		select {
		case <-w.wake:
			delay.Reset(flushDelay) // gather the lines of the calls that follow
			select {
			case <-delay.C:
				w.flush()
			case <-w.stop:
				w.flush()
				return
			}
		case <-w.stop:
			w.flush()
			return
		}
	}
}

// flush writes the lines waiting, if any.
func (w *Writer) flush() {
	w.mu.Lock()
	b := w.buf
	w.buf, w.spare = w.spare[:0], nil
	w.drained.Broadcast()
	w.mu.Unlock()
	if len(b) == 0 {
		w.mu.Lock()
		w.spare = b
		w.mu.Unlock()
		return
	}
	err := w.write(b)
	w.mu.Lock()
	if err != nil && w.err == nil {
		w.err = fmt.Errorf("writing the audit: %w", err)
	}
	if cap(b) <= maxBuffered {
		w.spare = b[:0]
	}
	w.mu.Unlock()
}

// write writes a batch of whole lines. To a file with a size bound it writes them in
// pieces of whole lines no larger than the bound (each rotating first if it would not fit),
// so a batch gathered while the machine was busy never takes a file past its bound; only a
// single line longer than the bound stands alone in a file of its own.
func (w *Writer) write(b []byte) error {
	for len(b) > 0 {
		n := len(b)
		if max := w.opts.MaxBytes; w.path != "" && max > 0 && int64(n) > max {
			n = bytes.LastIndexByte(b[:max], '\n') + 1
			if n == 0 { // the first line alone is longer than the bound
				if n = bytes.IndexByte(b, '\n') + 1; n == 0 {
					n = len(b)
				}
			}
		}
		if err := w.prepare(n); err != nil {
			return err
		}
		if _, err := w.w.Write(b[:n]); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// Close writes the lines still waiting, stops the Writer and closes the file Create
// opened. It waits at most until ctx ends. It returns the first error writing met.
func (w *Writer) Close(ctx context.Context) error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		<-w.done
		return w.err
	}
	w.closed = true
	w.drained.Broadcast()
	w.mu.Unlock()
	close(w.stop)
	select {
	case <-w.done:
	case <-ctx.Done():
		return fmt.Errorf("closing the audit: %w", ctx.Err())
	}
	var errs []error
	w.mu.Lock()
	errs = append(errs, w.err)
	file := w.file
	w.mu.Unlock()
	if file != nil {
		errs = append(errs, file.Close())
	}
	return errors.Join(errs...)
}

// AppendJSON appends r as one line of JSON (without the newline) to b: the same JSON
// encoding/json makes of Capped(r), made without reflection because it runs in every host
// call of an audited plugin.
//
// The line is within the record's bounds (Capped): what does not fit is cut, and the
// line's "cut" says how many bytes.
func AppendJSON(b []byte, r *Record) []byte {
	r = Capped(r)
	b = append(b, `{"time":"`...)
	b = appendTime(b, r.Time.UTC())
	b = append(b, '"')
	b = appendField(b, "sandbox", r.Sandbox)
	b = append(b, `,"plugin":`...)
	b = appendString(b, r.Plugin)
	b = appendField(b, "tool", r.Tool)
	b = append(b, `,"cap":`...)
	b = appendString(b, r.Cap)
	b = append(b, `,"op":`...)
	b = appendString(b, r.Op)
	b = appendField(b, "path", r.Path)
	b = appendList(b, "argv", r.Argv)
	b = appendList(b, "env", r.Env)
	b = appendInt(b, "port", int64(r.Port))
	b = appendField(b, "key", r.Key)
	b = append(b, `,"decision":`...)
	b = appendString(b, r.Decision)
	b = appendField(b, "why", r.Why)
	b = appendInt(b, "status", r.Status)
	b = appendField(b, "error", r.Error)
	if r.IsError {
		b = append(b, `,"is_error":true`...)
	}
	b = append(b, `,"us":`...)
	b = strconv.AppendInt(b, r.Micros, 10)
	b = appendInt(b, "bytes_in", int64(r.In))
	b = appendInt(b, "bytes_out", int64(r.Out))
	b = appendInt(b, "cut", int64(r.Cut))
	b = appendField(b, "dest", r.Dest)
	b = appendField(b, "addr", r.Addr)
	b = appendField(b, "command", r.Command)
	b = appendField(b, "injected", r.Injected)
	return append(b, '}')
}

// appendTime appends t (UTC) as RFC 3339 with microseconds, 2026-11-21T10:15:00.123456Z:
// what time.AppendFormat makes of that layout, in a fifth of its time.
func appendTime(b []byte, t time.Time) []byte {
	y, mo, d := t.Date()
	h, mi, s := t.Clock()
	num := func(b []byte, v, width int) []byte {
		var d [6]byte
		for i := width - 1; i >= 0; i-- {
			d[i] = byte('0' + v%10)
			v /= 10
		}
		return append(b, d[:width]...)
	}
	b = num(b, y, 4)
	b = append(b, '-')
	b = num(b, int(mo), 2)
	b = append(b, '-')
	b = num(b, d, 2)
	b = append(b, 'T')
	b = num(b, h, 2)
	b = append(b, ':')
	b = num(b, mi, 2)
	b = append(b, ':')
	b = num(b, s, 2)
	b = append(b, '.')
	b = num(b, t.Nanosecond()/1000, 6)
	return append(b, 'Z')
}

// appendField appends ,"name":"s" unless s is empty (omitempty).
func appendField(b []byte, name, s string) []byte {
	if s == "" {
		return b
	}
	b = append(append(append(b, `,"`...), name...), `":`...)
	return appendString(b, s)
}

func appendInt(b []byte, name string, n int64) []byte {
	if n == 0 {
		return b
	}
	b = append(append(append(b, `,"`...), name...), `":`...)
	return strconv.AppendInt(b, n, 10)
}

func appendList(b []byte, name string, list []string) []byte {
	if len(list) == 0 {
		return b
	}
	b = append(append(append(b, `,"`...), name...), `":[`...)
	for i, s := range list {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, s)
	}
	return append(b, ']')
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string as encoding/json writes it: invalid UTF-8
// becomes U+FFFD, control characters and <, >, & and U+2028/9 are escaped.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	return append(append(b, s[start:]...), '"')
}
