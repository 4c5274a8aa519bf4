// Package anthropic connects toolhost's tools to the Anthropic Messages API through the
// official Go SDK (github.com/anthropics/anthropic-sdk-go): the tools' definitions as the
// SDK's tool params, a tool's abi.Result as a tool_result block (text and image blocks,
// is_error), and the tool_use blocks of a model's message dispatched through a session and
// answered with the user message of their tool_result blocks.
//
// The package is an adapter at the edge: the host and the root package never link the SDK;
// a program that talks to Claude imports this package beside package toolhost. Its name
// is the SDK's, so import it under another:
//
//	import (
//		"github.com/anthropics/anthropic-sdk-go"
//		toolanthropic "github.com/toolhost/toolhost/adapters/anthropic"
//	)
//
//	tools, err := toolanthropic.Tools(sess.Tools())
//	...
//	for {
//		msg, err := client.Messages.New(ctx, anthropic.MessageNewParams{Model: model,
//			MaxTokens: 4096, Messages: msgs, Tools: tools})
//		...
//		msgs = append(msgs, msg.ToParam())
//		if msg.StopReason != anthropic.StopReasonToolUse {
//			break
//		}
//		results, err := toolanthropic.ToolResults(ctx, sess, msg.Content)
//		... // err: host failures to log; the model sees them as is_error results
//		msgs = append(msgs, results)
//	}
//
// examples/agent-loop is that loop as a whole program.
package anthropic

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/anthropics/anthropic-sdk-go"

	"github.com/toolhost/toolhost/abi"
)

// Dispatcher runs one tool call: a tool_use block's name and input in, a tool_result's
// content and is_error out. A tool's own failure is a Result with IsError set and a nil
// error; a non-nil error means the host could not run the tool, and the Result then
// still holds an is_error text written for the model. *toolhost.Session is a Dispatcher.
type Dispatcher interface {
	Dispatch(ctx context.Context, tool string, input json.RawMessage) (abi.Result, error)
}

// Tools returns tool definitions (a toolhost Session's Tools) as the "tools" of a
// Messages API request: each a ToolParam with the tool's name, description and JSON
// Schema, the schema's members other than properties and required kept as they are. It
// fails on a schema that is not a JSON object of type "object" (the API takes no other).
// WithBuiltinTools presents bash and the file tools as Anthropic's built-in tool types
// instead.
func Tools(tools []abi.Tool, opts ...Option) ([]anthropic.ToolUnionParam, error) {
	out := make([]anthropic.ToolUnionParam, 0, len(tools))
	for _, t := range tools {
		p, err := Tool(t)
		if err != nil {
			return nil, err
		}
		out = append(out, anthropic.ToolUnionParam{OfTool: p})
	}
	if o := collect(opts); o.builtin {
		out = builtinTools(tools, out, o)
	}
	return out, nil
}

// Tool returns one tool definition as the SDK's ToolParam (see Tools). The schema's
// members travel as their raw JSON, so the properties keep the plugin's order (the order
// the model reads them in).
func Tool(t abi.Tool) (*anthropic.ToolParam, error) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(t.InputSchema, &members); err != nil || members == nil {
		return nil, fmt.Errorf("tool %s: its input schema is not a JSON object (%.60q)", t.Name, t.InputSchema)
	}
	if typ, ok := members["type"]; ok {
		var s string
		if json.Unmarshal(typ, &s); s != "object" {
			return nil, fmt.Errorf("tool %s: its input schema has type %s; the Messages API takes only \"object\"", t.Name, typ)
		}
	}
	// type is the SDK's own field, always set (a zero schema, {}, would be left out of the
	// request); a copy among the extra fields would be a second "type" member.
	schema := anthropic.ToolInputSchemaParam{Type: "object"}
	for k, v := range members {
		switch k {
		case "type":
		case "properties":
			schema.Properties = v
		case "required":
			if err := json.Unmarshal(v, &schema.Required); err != nil {
				return nil, fmt.Errorf("tool %s: its input schema's required is not a list of names: %w", t.Name, err)
			}
		default:
			if schema.ExtraFields == nil {
				schema.ExtraFields = map[string]any{}
			}
			schema.ExtraFields[k] = v
		}
	}
	p := &anthropic.ToolParam{Name: t.Name, InputSchema: schema}
	if t.Description != "" {
		p.Description = anthropic.String(t.Description)
	}
	return p, nil
}

// MaxImageBytes is the largest image a tool_result carries: the Messages API refuses a
// request with a larger one (5 MB).
const MaxImageBytes = 5 << 20

// ToolResult returns a tool's result as the tool_result block answering the tool_use
// block toolUseID: its text blocks as text blocks (empty ones left out: the API refuses
// them), its images as base64 image blocks with their media type (take_screenshot's
// image/webp), and is_error. A block the API cannot carry (an image of another media
// type, over MaxImageBytes or not base64; a block of an unknown type) becomes a text
// block saying what was left out.
func ToolResult(toolUseID string, res abi.Result) anthropic.ContentBlockParamUnion {
	return anthropic.ContentBlockParamUnion{OfToolResult: ToolResultBlock(toolUseID, res)}
}

// ToolResultBlock is ToolResult's block itself.
func ToolResultBlock(toolUseID string, res abi.Result) *anthropic.ToolResultBlockParam {
	b := &anthropic.ToolResultBlockParam{ToolUseID: toolUseID, IsError: anthropic.Bool(res.IsError)}
	for _, c := range res.Content {
		if u, ok := resultContent(c); ok {
			b.Content = append(b.Content, u)
		}
	}
	return b
}

func resultContent(c abi.Content) (anthropic.ToolResultBlockParamContentUnion, bool) {
	text := func(s string) (anthropic.ToolResultBlockParamContentUnion, bool) {
		return anthropic.ToolResultBlockParamContentUnion{OfText: &anthropic.TextBlockParam{Text: s}}, true
	}
	switch c.Type {
	case abi.ContentText:
		if c.Text == "" {
			return anthropic.ToolResultBlockParamContentUnion{}, false
		}
		return text(c.Text)
	case abi.ContentImage:
		if c.Source == nil {
			return text("[an image without its data was left out]")
		}
		mt := anthropic.Base64ImageSourceMediaType(c.Source.MediaType)
		switch mt {
		case anthropic.Base64ImageSourceMediaTypeImageJPEG, anthropic.Base64ImageSourceMediaTypeImagePNG,
			anthropic.Base64ImageSourceMediaTypeImageGIF, anthropic.Base64ImageSourceMediaTypeImageWebP:
		default:
			return text(fmt.Sprintf("[an image of type %q was left out: only JPEG, PNG, GIF and WebP images can be shown]", c.Source.MediaType))
		}
		data := c.Source.Data
		if data == "" && len(c.Source.Raw) > 0 {
			data = base64.StdEncoding.EncodeToString(c.Source.Raw)
		}
		if data == "" {
			return text("[an image without its data was left out]")
		}
		// One bad image would make the API refuse the whole request, and with it the
		// conversation: whatever a plugin says is checked first.
		raw, err := base64.StdEncoding.DecodeString(data)
		if err != nil {
			return text("[an image whose data is not base64 was left out]")
		}
		if len(raw) > MaxImageBytes {
			return text(fmt.Sprintf("[an image of %d bytes was left out: images of at most %d MB can be shown]", len(raw), MaxImageBytes>>20))
		}
		return anthropic.ToolResultBlockParamContentUnion{OfImage: &anthropic.ImageBlockParam{
			Source: anthropic.ImageBlockParamSourceUnion{OfBase64: &anthropic.Base64ImageSourceParam{
				Data: data, MediaType: mt,
			}},
		}}, true
	default:
		return text(fmt.Sprintf("[a result block of type %q was left out]", c.Type))
	}
}

// ToolResults dispatches every tool_use block of content (a Message's) through d, one
// after another in their order, and returns the user message of their tool_result
// blocks, in the same order and with their tool_use ids, and how many there were (0: the
// message asked for no tool, and the returned message is empty, not to be sent).
//
// Every tool_use block gets its tool_result, as the API requires: a tool's failure is an
// is_error result; so is a call the host could not run, and a call left when ctx ended
// (it is not run), whose errors are also joined into err, wrapped with the tool's name and
// block id, for the program's log.
// The message is complete and ready to send even when err is not nil.
//
// Calls of Anthropic's built-in tools (see WithBuiltinTools) run as calls of the tools
// they are made of, with or without the option; give it the options given to Tools.
func ToolResults(ctx context.Context, d Dispatcher, content []anthropic.ContentBlockUnion, opts ...Option) (anthropic.MessageParam, int, error) {
	o := collect(opts)
	var blocks []anthropic.ContentBlockParamUnion
	var errs []error
	for _, blk := range content {
		use, ok := blk.AsAny().(anthropic.ToolUseBlock)
		if !ok {
			continue
		}
		input := use.Input
		if len(input) == 0 {
			input = json.RawMessage("{}")
		}
		if err := ctx.Err(); err != nil {
			// Stopped: the calls left are answered, not run.
			errs = append(errs, fmt.Errorf("tool %s (tool_use %s) not run: %w", use.Name, use.ID, err))
			blocks = append(blocks, ToolResult(use.ID, abi.ErrorText(fmt.Sprintf("The tool %s was not run: the agent was stopped.", use.Name))))
			continue
		}
		res, builtin, err := builtinCall(ctx, d, use.Name, input, o)
		if !builtin {
			res, err = d.Dispatch(ctx, use.Name, input)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("tool %s (tool_use %s): %w", use.Name, use.ID, err))
			if len(res.Content) == 0 {
				res = abi.ErrorText(fmt.Sprintf("The tool %s could not be run; try again.", use.Name))
			}
			res.IsError = true
		}
		blocks = append(blocks, ToolResult(use.ID, res))
	}
	if len(blocks) == 0 {
		return anthropic.MessageParam{}, 0, nil
	}
	return anthropic.NewUserMessage(blocks...), len(blocks), errors.Join(errs...)
}
