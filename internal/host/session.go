package host

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/egress"
	"github.com/toolhost/toolhost/internal/framedinput"
	"github.com/toolhost/toolhost/internal/tracing"
)

// Dispatcher dispatches tool calls into one sandbox. It is safe for concurrent use; calls
// run in parallel up to each plugin's pool size.
type Dispatcher struct {
	h           *Host
	sb          sandbox.Sandbox
	project     string
	defaultPort int
	store       store.Store // the store capability's, when not the host's (WithStore)
	capturer    Capturer    // the capture capability's, when not the host's (WithCapturer)

	state sessionState // the plugins' session state (state.go)
	owned owned        // the background processes and terminals they started (procfuncs.go)
}

// Sandbox returns the sandbox the session's tools act in.
func (s *Dispatcher) Sandbox() sandbox.Sandbox { return s.sb }

var imageMediaTypes = map[string]bool{"image/webp": true, "image/png": true, "image/jpeg": true, "image/gif": true}

// dispatch runs one tool call, as Dispatch (decide.go) says, once the call was admitted.
func (s *Dispatcher) dispatch(ctx context.Context, name string, input json.RawMessage) (abi.Result, error) {
	t := s.h.tools[name]
	if t == nil {
		return abi.ErrorText(fmt.Sprintf("[%s: unknown tool]", name)), nil
	}
	input = bytes.TrimSpace(input)
	if len(input) == 0 || bytes.Equal(input, []byte("null")) {
		input = json.RawMessage("{}")
	}
	if len(input) > maxInputBytes {
		return abi.ErrorText(fmt.Sprintf("[%s: input is %d bytes, over the %d-byte limit]", name, len(input), maxInputBytes)), nil
	}
	if err := checkText(input); err != nil {
		return abi.ErrorText(fmt.Sprintf("[%s: invalid input: %v]", name, err)), nil
	}
	decoded, err := t.schema.validateInput(input)
	if err != nil {
		return abi.ErrorText(fmt.Sprintf("[%s: invalid input: %v]", name, err)), nil
	}
	if s.h.closed.Load() {
		return hostFailure(name, ErrClosed)
	}

	var req []byte
	if t.plugin.framedInput {
		// The input is an object: the schema says so, and it was checked.
		if req, err = framedinput.Encode(name, decoded.(map[string]any)); err != nil {
			return hostFailure(name, err)
		}
	} else {
		req = make([]byte, 0, len(name)+len(input)+22)
		req = append(req, `{"tool":"`...)
		req = append(req, name...) // tool names are [a-zA-Z0-9_-], nothing to escape
		req = append(req, `","input":`...)
		req = append(req, input...)
		req = append(req, '}')
	}

	pool := t.plugin.pool
	pctx, span := tracing.Child(ctx, trace.SpanKindInternal, tracing.SpanPlugin, t.plugin.name)
	inst, err := t.plugin.acquire(pctx)
	if err != nil {
		endPluginSpan(span, t, err)
		return hostFailure(name, err)
	}
	raw, err := inst.call(pctx, req, s, t.plugin.callTimeout())
	refused := inst.takeRefused()
	stored := inst.takeStored()
	bufs := inst.takeBuffers() // the call's host buffers, for its result only
	endPluginSpan(span, t, err)
	if err != nil {
		pool.discard(ctx, inst)
		s.h.log.Warn("tool call failed", "tool", name, "plugin", t.plugin.name, "err", s.h.secrets.redact(err.Error()))
		return hostFailure(name, err)
	}
	pool.release(ctx, inst)

	var res abi.Result
	if bytes.HasPrefix(raw, []byte(abi.FramedMagic)) {
		if res, err = parseFramed(raw, &bufs); err != nil {
			return hostFailure(name, fmt.Errorf("%w: plugin %s: %v", ErrPluginFailed, t.plugin, err))
		}
	} else if err := json.Unmarshal(raw, &res); err != nil {
		return hostFailure(name, fmt.Errorf("%w: plugin %s returned a result that is not valid JSON: %v", ErrPluginFailed, t.plugin, err))
	}
	if err := checkResult(&res); err != nil {
		return hostFailure(name, fmt.Errorf("%w: plugin %s returned an invalid result: %v", ErrPluginFailed, t.plugin, err))
	}
	if err := t.checkStructured(&res); err != nil {
		// The words stay (they are the tool's answer); the structure the plugin broke is
		// not passed on, and the result says why, as an error, so no client trusts it.
		s.h.log.Warn("a plugin's structured result was refused", "tool", name, "plugin", t.plugin.name, "err", err)
		res.Structured, res.IsError = nil, true
		res.Content = append(res.Content, abi.Content{Type: abi.ContentText,
			Text: fmt.Sprintf("[%s: the tool's structured result was left out: %v; the text above is its answer]", name, err)})
	}
	if !res.IsError {
		res.Stored = stored
	}
	if note := egress.NoteOf(refused); note != "" {
		res.Content = append(res.Content, abi.Content{Type: abi.ContentText, Text: note})
	}
	if n, ok := sandbox.As[sandbox.Noticer](s.sb); ok {
		if msg := n.Notice(); msg != "" {
			res.Content = append(res.Content, abi.Content{Type: abi.ContentText, Text: msg})
		}
	}
	return res, nil
}

// endPluginSpan ends the span of a plugin's run (when it records), saying how the run
// failed, if it did: in general words, never the error's text (a plugin's stderr, quoted
// in it, may hold what the plugin read).
func endPluginSpan(span trace.Span, t *tool, err error) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(tracing.Plugin.String(t.plugin.name), tracing.ToolName.String(t.def.Name))
	if err != nil {
		kind, msg := tracing.ErrHostFailure, "the plugin could not run"
		switch {
		case errors.Is(err, ErrPluginTimeout):
			kind, msg = "timeout", "the plugin used more than its time budget"
		case errors.Is(err, ErrPluginFailed):
			kind, msg = "plugin_failed", "the plugin failed (trapped, or answered what the host refuses)"
		case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
			kind, msg = "cancelled", "the call was stopped"
		}
		span.SetAttributes(tracing.ErrorType.String(kind))
		span.SetStatus(codes.Error, msg)
	}
	span.End()
}

// HasTool reports whether a plugin gives the tool name.
func (s *Dispatcher) HasTool(name string) bool { return s.h.tools[name] != nil }

func hostFailure(tool string, err error) (abi.Result, error) {
	return abi.ErrorText(fmt.Sprintf("[%s: the tool could not run: %v]", tool, err)), err
}

// maxStructuredBytes bounds a structured result: it repeats what the text says, which is
// capped too.
const maxStructuredBytes = 1 << 20

// checkStructured checks a result's structured part against the tool's output schema: a
// plugin's output is untrusted, and a client may act on the structure without reading the
// text. A tool without an output schema has its structured part dropped (nothing says
// what it means); an error result carries none; a tool with one must give one with every
// other result, within maxStructuredBytes, valid against the schema.
func (t *tool) checkStructured(r *abi.Result) error {
	if t.output == nil || r.IsError {
		r.Structured = nil
		return nil
	}
	if len(r.Structured) == 0 {
		return errors.New("the plugin returned none, though its output schema promises one")
	}
	if len(r.Structured) > maxStructuredBytes {
		return fmt.Errorf("it is %d bytes, over the %d-byte limit", len(r.Structured), maxStructuredBytes)
	}
	if err := checkText(r.Structured); err != nil {
		return err
	}
	if _, err := t.output.validateInput(r.Structured); err != nil {
		return fmt.Errorf("it does not match the tool's output schema: %w", err)
	}
	return nil
}

// checkResult validates a plugin's result and post-processes its text: ANSI escapes out,
// each text capped at MaxTextChars.
func checkResult(r *abi.Result) error {
	if r.Content == nil {
		r.Content = []abi.Content{}
	}
	for i := range r.Content {
		c := &r.Content[i]
		switch c.Type {
		case abi.ContentText:
			if c.Source != nil {
				return fmt.Errorf("content[%d]: a text block has a source", i)
			}
			c.Text = capText(stripANSI(c.Text))
		case abi.ContentImage:
			if c.Source == nil || c.Source.Type != "base64" || c.Source.Data == "" {
				return fmt.Errorf("content[%d]: an image needs a base64 source with data", i)
			}
			if !imageMediaTypes[c.Source.MediaType] {
				return fmt.Errorf("content[%d]: media type %q is not one of image/webp, image/png, image/jpeg, image/gif", i, c.Source.MediaType)
			}
		default:
			return fmt.Errorf("content[%d]: unknown block type %q", i, strings.TrimSpace(c.Type))
		}
	}
	return nil
}

// checkText refuses a tool's input that is not text: bytes that are not UTF-8, or an
// escaped UTF-16 surrogate (\ud800-\udfff) that is not half of a pair. Decoding either
// would silently put U+FFFD in its place, so a path or a file's content would not be what
// the model sent. Tools carry text; the message says where the input stopped being it.
func checkText(input []byte) error {
	if !utf8.Valid(input) {
		i := 0
		for i < len(input) {
			r, size := utf8.DecodeRune(input[i:])
			if r == utf8.RuneError && size == 1 {
				break
			}
			i += size
		}
		return fmt.Errorf("byte %d of the input is not UTF-8 (tools take text, and it would reach the tool changed to U+FFFD); send the text as UTF-8", i)
	}
	hex4 := func(b []byte) (rune, bool) {
		if len(b) < 4 {
			return 0, false
		}
		var r rune
		for _, c := range b[:4] {
			switch {
			case c >= '0' && c <= '9':
				r = r<<4 | rune(c-'0')
			case c >= 'a' && c <= 'f':
				r = r<<4 | rune(c-'a'+10)
			case c >= 'A' && c <= 'F':
				r = r<<4 | rune(c-'A'+10)
			default:
				return 0, false
			}
		}
		return r, true
	}
	for i := 0; i < len(input); i++ {
		if input[i] != '\\' || i+1 >= len(input) {
			continue
		}
		if input[i+1] != 'u' {
			i++ // an escaped character: skip it (\\ included)
			continue
		}
		r, ok := hex4(input[i+2:])
		if !ok {
			continue // not JSON: the schema's check says so
		}
		switch {
		case r >= 0xd800 && r < 0xdc00: // a high surrogate: a low one must follow
			if i+12 <= len(input) && input[i+6] == '\\' && input[i+7] == 'u' {
				if lo, ok := hex4(input[i+8:]); ok && lo >= 0xdc00 && lo < 0xe000 {
					i += 11
					continue
				}
			}
			return fmt.Errorf("byte %d of the input is the escape of half a UTF-16 pair (\\u%04x without its other half), which is no character; send the text as UTF-8", i, r)
		case r >= 0xdc00 && r < 0xe000:
			return fmt.Errorf("byte %d of the input is the escape of half a UTF-16 pair (\\u%04x without its other half), which is no character; send the text as UTF-8", i, r)
		}
		i += 5
	}
	return nil
}
