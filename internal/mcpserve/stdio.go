package mcpserve

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolhost/toolhost/internal/snapshot"
)

// MaxLine bounds one line of the stdio transport, one JSON-RPC message: the SDK's
// default (16 MiB).
const MaxLine = mcp.DefaultMaxLineLength

// idPrefix is how much of a line past MaxLine is kept to find its request's id in.
const idPrefix = 64 << 10

// StdioTransport is the transport of `toolhost mcp`: the SDK's newline-delimited JSON-RPC
// over in and out, except that a line the SDK would end the session on is answered with a
// JSON-RPC error and skipped, and the session goes on: a line longer than maxLine
// (MaxLine when 0), a line that is not JSON, and JSON that is not a JSON-RPC message. The
// error carries the request's id when it can be read from the line, else null (JSON-RPC
// 2.0, section 5).
func StdioTransport(in io.Reader, out io.WriteCloser, maxLine int, log *slog.Logger) mcp.Transport {
	if maxLine <= 0 {
		maxLine = MaxLine
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &stdioTransport{in: in, out: out, max: maxLine, log: log}
}

type stdioTransport struct {
	in  io.Reader
	out io.WriteCloser
	max int
	log *slog.Logger
}

func (t *stdioTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	w := &lockedWriter{w: t.out}
	lr := &lineReader{br: bufio.NewReaderSize(t.in, 64<<10), max: t.max, answer: w.answer, log: t.log}
	// Every line the SDK reads is within the bound already (its own cap is off).
	return (&mcp.IOTransport{Reader: io.NopCloser(lr), Writer: w, MaxLineLength: -1}).Connect(ctx)
}

// lockedWriter writes whole messages: the SDK's (one Write each) and the answers to the
// lines it never sees.
type lockedWriter struct {
	mu sync.Mutex
	w  io.WriteCloser
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}

func (w *lockedWriter) Close() error { return w.w.Close() }

// answer writes a JSON-RPC error response with id (raw JSON: a number, a string or null).
func (w *lockedWriter) answer(id json.RawMessage, code int64, msg string) error {
	b, err := json.Marshal(struct {
		Version string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   jsonrpc.Error   `json:"error"`
	}{"2.0", id, jsonrpc.Error{Code: code, Message: msg}})
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// lineReader hands the SDK's decoder one line at a time, each a JSON-RPC message (or a
// batch of them) no longer than max; every other line it answers itself and skips.
type lineReader struct {
	br     *bufio.Reader
	max    int
	answer func(id json.RawMessage, code int64, msg string) error
	log    *slog.Logger

	buf  []byte // the line being read, at most max+1 bytes of it
	line []byte // what is left of the current line to hand over
	err  error  // the input's end or failure, once the lines before it are handed over
}

func (r *lineReader) Read(p []byte) (int, error) {
	for len(r.line) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		if err := r.next(); err != nil {
			return 0, err
		}
	}
	n := copy(p, r.line)
	r.line = r.line[n:]
	return n, nil
}

// next reads the next line into r.line, or answers it and leaves r.line empty. Its error
// is the answer's: stdout failed.
func (r *lineReader) next() error {
	if cap(r.buf) > 1<<20 {
		r.buf = nil // a big line's buffer is not kept for the small ones after it
	}
	buf, total := r.buf[:0], 0
	for {
		chunk, err := r.br.ReadSlice('\n')
		total += len(chunk)
		if room := r.max + 1 - len(buf); room > 0 {
			buf = append(buf, chunk[:min(len(chunk), room)]...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			r.err = err
		}
		break
	}
	r.buf = buf
	if total > r.max {
		id := recoverID(buf[:min(len(buf), idPrefix)])
		r.log.Warn("mcp: a message past the line bound was answered with an error and skipped", "bytes", total, "bound", r.max, "id", string(id))
		return r.answer(id, jsonrpc.CodeInvalidRequest, fmt.Sprintf(
			"request too large: this message is %d bytes, past the limit of %d bytes (%s) for one message; it was not read. Send less in one request (for example, write a large file in parts)",
			total, r.max, snapshot.HumanBytes(int64(r.max))))
	}
	msg := bytes.TrimSpace(buf)
	if len(msg) == 0 {
		return nil
	}
	if code, why := checkMessage(msg); code != 0 {
		var id json.RawMessage
		if code != jsonrpc.CodeParseError {
			id = recoverID(msg)
		}
		r.log.Warn("mcp: a line that is not a JSON-RPC message was answered with an error and skipped", "why", why, "id", string(id))
		return r.answer(id, code, why)
	}
	if buf[len(buf)-1] != '\n' {
		buf = append(buf, '\n')
	}
	r.line = buf
	return nil
}

// checkMessage says why msg is not a JSON-RPC message or batch the SDK reads (a JSON-RPC
// error code and its message), or 0.
func checkMessage(msg []byte) (int64, string) {
	if !json.Valid(msg) { // the SDK's decoder would take the first of two values
		return decodeErr(msg, errors.New("not JSON"))
	}
	if msg[0] != '[' {
		_, err := jsonrpc.DecodeMessage(msg)
		return decodeErr(msg, err)
	}
	var batch []json.RawMessage
	if err := json.Unmarshal(msg, &batch); err != nil {
		return decodeErr(msg, err)
	}
	if len(batch) == 0 {
		return jsonrpc.CodeInvalidRequest, "invalid request: an empty batch"
	}
	for _, m := range batch {
		if _, err := jsonrpc.DecodeMessage(m); err != nil {
			return decodeErr(m, err)
		}
	}
	return 0, ""
}

// decodeErr is the JSON-RPC error of a message that failed to decode with err: a parse
// error when it is not JSON, else an invalid request; 0 when err is nil.
func decodeErr(msg []byte, err error) (int64, string) {
	switch {
	case err == nil:
		return 0, ""
	case !json.Valid(msg):
		return jsonrpc.CodeParseError, "parse error: the message is not JSON; send one JSON-RPC message per line"
	}
	return jsonrpc.CodeInvalidRequest, fmt.Sprintf("invalid request: not a JSON-RPC 2.0 message (%v)", err)
}

// recoverID reads the "id" of the object msg starts (msg may be cut short): its raw JSON
// when it is a number or a string found before msg ends, else null.
func recoverID(msg []byte) json.RawMessage {
	null := json.RawMessage("null")
	dec := json.NewDecoder(bytes.NewReader(msg))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return null
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return null
		}
		if k != "id" {
			var skip json.RawMessage
			if dec.Decode(&skip) != nil {
				return null
			}
			continue
		}
		var raw json.RawMessage
		if dec.Decode(&raw) != nil {
			return null
		}
		if id, err := jsonrpc.MakeID(rawID(raw)); err == nil && id.IsValid() {
			return raw
		}
		return null
	}
	return null
}

// rawID decodes an id as MakeID takes it (float64 or string); nil otherwise.
func rawID(raw json.RawMessage) any {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return nil
	}
	switch v.(type) {
	case float64, string:
		return v
	}
	return nil
}
