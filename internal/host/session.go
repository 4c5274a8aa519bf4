package host

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/egress"
	"github.com/toolhost/toolhost/internal/framedinput"
)

// Session dispatches tool calls into one sandbox. It is safe for concurrent use; calls
// run in parallel up to each plugin's pool size.
type Session struct {
	h           *Host
	sb          sandbox.Sandbox
	project     string
	defaultPort int

	state sessionState // the plugins' session state (state.go)
	owned owned        // the background processes and terminals they started (procfuncs.go)
}

// Sandbox returns the sandbox the session's tools act in.
func (s *Session) Sandbox() sandbox.Sandbox { return s.sb }

var imageMediaTypes = map[string]bool{"image/webp": true, "image/png": true, "image/jpeg": true, "image/gif": true}

// dispatch runs one tool call, as Dispatch (decide.go) says, once the call was admitted.
func (s *Session) dispatch(ctx context.Context, name string, input json.RawMessage) (abi.Result, error) {
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

	if err := t.plugin.await(ctx); err != nil {
		return hostFailure(name, err)
	}
	pool := t.plugin.pool
	inst, err := pool.acquire(ctx)
	if err != nil {
		return hostFailure(name, err)
	}
	raw, err := inst.call(ctx, req, s, t.plugin.callTimeout())
	refused := inst.takeRefused()
	if err != nil {
		pool.discard(ctx, inst)
		s.h.log.Warn("tool call failed", "tool", name, "plugin", t.plugin.name, "err", s.h.secrets.redact(err.Error()))
		return hostFailure(name, err)
	}
	pool.release(ctx, inst)

	var res abi.Result
	if bytes.HasPrefix(raw, []byte(abi.FramedMagic)) {
		if res, err = parseFramed(raw); err != nil {
			return hostFailure(name, fmt.Errorf("%w: plugin %s: %v", ErrPluginFailed, t.plugin, err))
		}
	} else if err := json.Unmarshal(raw, &res); err != nil {
		return hostFailure(name, fmt.Errorf("%w: plugin %s returned a result that is not valid JSON: %v", ErrPluginFailed, t.plugin, err))
	}
	if err := checkResult(&res); err != nil {
		return hostFailure(name, fmt.Errorf("%w: plugin %s returned an invalid result: %v", ErrPluginFailed, t.plugin, err))
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

func hostFailure(tool string, err error) (abi.Result, error) {
	return abi.ErrorText(fmt.Sprintf("[%s: the tool could not run: %v]", tool, err)), err
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
