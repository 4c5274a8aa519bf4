// Package openai connects toolhost's tools to OpenAI's APIs through the official Go SDK
// (github.com/openai/openai-go/v3), both of them: Chat Completions (function tools, the
// assistant message's tool_calls answered by tool messages) and Responses (function tools,
// the response's function_call items answered by function_call_output items). apply_patch
// goes out as Codex offers it to OpenAI's models: a function tool of one string, input,
// holding the whole patch from *** Begin Patch to *** End Patch.
//
// The package is an adapter at the edge, like adapters/anthropic: the host and the root
// package never link the SDK. Its name is the SDK's, so import it under another:
//
//	import (
//		"github.com/openai/openai-go/v3"
//		"github.com/openai/openai-go/v3/responses"
//		toolopenai "github.com/toolhost/toolhost/adapters/openai"
//	)
//
// With Responses:
//
//	tools, err := toolopenai.ResponseTools(sess.Tools())
//	params := responses.ResponseNewParams{Model: model, Tools: tools,
//		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(task)}}
//	for {
//		resp, err := client.Responses.New(ctx, params)
//		...
//		outputs, n, err := toolopenai.FunctionCallOutputs(ctx, sess, resp.Output)
//		... // err: host failures to log; the model sees them as error outputs
//		if n == 0 {
//			break // resp.OutputText() is the answer
//		}
//		params.PreviousResponseID = openai.String(resp.ID)
//		params.Input = responses.ResponseNewParamsInputUnion{OfInputItemList: outputs}
//	}
//
// With Chat Completions, ChatTools and ToolMessages do the same for a message's
// tool_calls (see Example_chatCompletions).
//
// Neither API has an is_error flag: a tool's failure is its text, which toolhost's tools
// start with "Error: " (ToolResult adds it to one that does not).
package openai

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"

	"github.com/toolhost/toolhost/abi"
)

// Dispatcher runs one tool call: a function call's name and arguments in, the tool's
// result out. A tool's own failure is a Result with IsError set and a nil error; a non-nil
// error means the host could not run the tool, and the Result then still holds an
// is_error text written for the model. *toolhost.Session is a Dispatcher.
type Dispatcher interface {
	Dispatch(ctx context.Context, tool string, input json.RawMessage) (abi.Result, error)
}

// nameRe is what both APIs take as a function's name.
var nameRe = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// parameters returns a tool's input schema as a function's parameters: its members as
// their raw JSON (so the properties keep the plugin's order, the order the model reads
// them in), type "object" always. It fails on a name the APIs refuse and on a schema that
// is not a JSON object of type "object".
func parameters(t abi.Tool) (map[string]any, error) {
	if !nameRe.MatchString(t.Name) {
		return nil, fmt.Errorf("tool %q: OpenAI's APIs take function names of 1 to 64 letters, digits, _ and -", t.Name)
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(t.InputSchema, &members); err != nil || members == nil {
		return nil, fmt.Errorf("tool %s: its input schema is not a JSON object (%.60q)", t.Name, t.InputSchema)
	}
	if typ, ok := members["type"]; ok {
		var s string
		if json.Unmarshal(typ, &s); s != "object" {
			return nil, fmt.Errorf("tool %s: its input schema has type %s; function parameters are an \"object\"", t.Name, typ)
		}
	}
	if req, ok := members["required"]; ok {
		var names []string
		if err := json.Unmarshal(req, &names); err != nil {
			return nil, fmt.Errorf("tool %s: its input schema's required is not a list of names: %w", t.Name, err)
		}
	}
	p := make(map[string]any, len(members)+1)
	for k, v := range members {
		p[k] = v
	}
	p["type"] = "object"
	return p, nil
}

// ChatTools returns tool definitions (a toolhost Session's Tools) as the "tools" of a Chat
// Completions request: function tools with each tool's name, description and JSON Schema
// as its parameters, not strict (the tools' schemas have optional members, which strict
// mode does not allow).
func ChatTools(tools []abi.Tool) ([]openai.ChatCompletionToolUnionParam, error) {
	out := make([]openai.ChatCompletionToolUnionParam, 0, len(tools))
	for _, t := range tools {
		p, err := parameters(t)
		if err != nil {
			return nil, err
		}
		fn := shared.FunctionDefinitionParam{Name: t.Name, Parameters: p}
		if t.Description != "" {
			fn.Description = openai.String(t.Description)
		}
		out = append(out, openai.ChatCompletionFunctionTool(fn))
	}
	return out, nil
}

// ResponseTools returns tool definitions as the "tools" of a Responses request: function
// tools, not strict (see ChatTools).
func ResponseTools(tools []abi.Tool) ([]responses.ToolUnionParam, error) {
	out := make([]responses.ToolUnionParam, 0, len(tools))
	for _, t := range tools {
		p, err := parameters(t)
		if err != nil {
			return nil, err
		}
		fn := &responses.FunctionToolParam{Name: t.Name, Parameters: p, Strict: openai.Bool(false)}
		if t.Description != "" {
			fn.Description = openai.String(t.Description)
		}
		out = append(out, responses.ToolUnionParam{OfFunction: fn})
	}
	return out, nil
}

// MaxImageBytes is the largest image a result carries (OpenAI's limit per image, 20 MB).
const MaxImageBytes = 20 << 20

// part is one block of a result as both APIs can carry it: a text, or an image as a data
// URL.
type part struct {
	text, image string
}

// parts checks a result's blocks: texts (empty ones left out), images of the types the
// APIs take (PNG, JPEG, GIF, WebP) as data URLs; a block they cannot carry becomes a text
// saying what was left out. A failure's first text starts with "Error: ".
func parts(res abi.Result) []part {
	var out []part
	for _, c := range res.Content {
		switch c.Type {
		case abi.ContentText:
			if c.Text != "" {
				out = append(out, part{text: c.Text})
			}
		case abi.ContentImage:
			out = append(out, imagePart(c))
		default:
			out = append(out, part{text: fmt.Sprintf("[a result block of type %q was left out]", c.Type)})
		}
	}
	if res.IsError {
		for i := range out {
			if out[i].image != "" {
				continue
			}
			if !strings.HasPrefix(out[i].text, "Error") {
				out[i].text = "Error: " + out[i].text
			}
			return out
		}
		out = append([]part{{text: "Error: the tool failed without saying why."}}, out...)
	}
	return out
}

func imagePart(c abi.Content) part {
	if c.Source == nil {
		return part{text: "[an image without its data was left out]"}
	}
	switch c.Source.MediaType {
	case "image/png", "image/jpeg", "image/gif", "image/webp":
	default:
		return part{text: fmt.Sprintf("[an image of type %q was left out: only PNG, JPEG, GIF and WebP images can be shown]", c.Source.MediaType)}
	}
	data := c.Source.Data
	if data == "" && len(c.Source.Raw) > 0 {
		data = base64.StdEncoding.EncodeToString(c.Source.Raw)
	}
	if data == "" {
		return part{text: "[an image without its data was left out]"}
	}
	// One bad image would make the API refuse the whole request: whatever a plugin says
	// is checked first.
	raw, err := base64.StdEncoding.DecodeString(data)
	if err != nil {
		return part{text: "[an image whose data is not base64 was left out]"}
	}
	if len(raw) > MaxImageBytes {
		return part{text: fmt.Sprintf("[an image of %d bytes was left out: images of at most %d MB can be shown]", len(raw), MaxImageBytes>>20)}
	}
	return part{image: "data:" + c.Source.MediaType + ";base64," + data}
}

// FunctionCallOutput returns a tool's result as the function_call_output item answering
// the Responses function call callID: its text alone as a string, or, when it holds
// images, a list of input_text and input_image items (images as data URLs).
func FunctionCallOutput(callID string, res abi.Result) responses.ResponseInputItemUnionParam {
	ps := parts(res)
	var list responses.ResponseFunctionCallOutputItemListParam
	var texts []string
	images := false
	for _, p := range ps {
		if p.image != "" {
			images = true
			list = append(list, responses.ResponseFunctionCallOutputItemUnionParam{
				OfInputImage: &responses.ResponseInputImageContentParam{ImageURL: openai.String(p.image)}})
			continue
		}
		texts = append(texts, p.text)
		list = append(list, responses.ResponseFunctionCallOutputItemUnionParam{
			OfInputText: &responses.ResponseInputTextContentParam{Text: p.text}})
	}
	out := &responses.ResponseInputItemFunctionCallOutputParam{CallID: openai.String(callID)}
	switch {
	case images:
		out.Output.OfResponseFunctionCallOutputItemArray = list
	case len(texts) == 0:
		out.Output.OfString = openai.String("[no output]")
	default:
		out.Output.OfString = openai.String(strings.Join(texts, "\n"))
	}
	return responses.ResponseInputItemUnionParam{OfFunctionCallOutput: out}
}

// call is one function call of either API.
type call struct {
	id, name, args string
	// refuse, when set, is the answer without running anything.
	refuse string
}

// run dispatches the calls through d, one after another in their order, and returns each
// one's result. Every call gets a result: a call the host could not run and a call left
// when ctx ended (not run) are error results, and their errors are joined, wrapped with
// the tool's name and call id, for the program's log.
func run(ctx context.Context, d Dispatcher, calls []call) ([]abi.Result, error) {
	results := make([]abi.Result, 0, len(calls))
	var errs []error
	for _, c := range calls {
		if c.refuse != "" {
			results = append(results, abi.ErrorText(c.refuse))
			continue
		}
		args := strings.TrimSpace(c.args)
		if args == "" {
			args = "{}"
		}
		if !json.Valid([]byte(args)) || args[0] != '{' {
			results = append(results, abi.ErrorText(fmt.Sprintf("Error: the arguments of %s are not a JSON object; call it again with its arguments as one JSON object", c.name)))
			continue
		}
		if err := ctx.Err(); err != nil {
			// Stopped: the calls left are answered, not run.
			errs = append(errs, fmt.Errorf("tool %s (call %s) not run: %w", c.name, c.id, err))
			results = append(results, abi.ErrorText(fmt.Sprintf("Error: the tool %s was not run: the agent was stopped.", c.name)))
			continue
		}
		res, err := d.Dispatch(ctx, c.name, json.RawMessage(args))
		if err != nil {
			errs = append(errs, fmt.Errorf("tool %s (call %s): %w", c.name, c.id, err))
			if len(res.Content) == 0 {
				res = abi.ErrorText(fmt.Sprintf("Error: the tool %s could not be run; try again.", c.name))
			}
			res.IsError = true
		}
		results = append(results, res)
	}
	return results, errors.Join(errs...)
}

// FunctionCallOutputs runs every function_call item of a response's output through d, one
// after another in their order, and returns their function_call_output items in the same
// order with their call ids, and how many there were (0: the response asked for no tool;
// it is the model's answer). Send them as the next request's input with
// PreviousResponseID set to the response's ID, or after the response's items when the
// program keeps the conversation itself.
//
// Every function call gets its output, as the API requires: a tool's failure, a call the
// host could not run, arguments that are not a JSON object, a call left when ctx ended
// (not run) are outputs saying so; the host's errors are also joined into err, for the
// program's log. The outputs are complete and ready to send even when err is not nil.
func FunctionCallOutputs(ctx context.Context, d Dispatcher, output []responses.ResponseOutputItemUnion) (responses.ResponseInputParam, int, error) {
	var calls []call
	for _, item := range output {
		if item.Type != "function_call" {
			continue
		}
		fc := item.AsFunctionCall()
		calls = append(calls, call{id: fc.CallID, name: fc.Name, args: fc.Arguments})
	}
	if len(calls) == 0 {
		return nil, 0, nil
	}
	results, err := run(ctx, d, calls)
	out := make(responses.ResponseInputParam, len(calls))
	for i, c := range calls {
		out[i] = FunctionCallOutput(c.id, results[i])
	}
	return out, len(calls), err
}

// ToolMessages runs every tool call of an assistant message (a Chat Completion choice's)
// through d, one after another in their order, and returns the messages answering them:
// a tool message per call, in order, with its tool_call_id, and, when results hold images
// (a tool message carries text only), one user message after them with the images, each
// introduced by its call's id. n is the number of tool calls (0: the message asked for no
// tool, and there are no messages). Append them after msg.ToParam().
//
// Every tool call gets its tool message, as the API requires: a tool's failure, a call
// the host could not run, arguments that are not a JSON object, a custom tool call
// (toolhost offers function tools only) and a call left when ctx ended (not run) are
// answered with their error; the host's errors are also joined into err. The messages
// are complete and ready to send even when err is not nil.
func ToolMessages(ctx context.Context, d Dispatcher, msg openai.ChatCompletionMessage) ([]openai.ChatCompletionMessageParamUnion, int, error) {
	var calls []call
	for _, tc := range msg.ToolCalls {
		switch tc.Type {
		case "function":
			calls = append(calls, call{id: tc.ID, name: tc.Function.Name, args: tc.Function.Arguments})
		default:
			name := tc.Custom.Name
			calls = append(calls, call{id: tc.ID, name: name,
				refuse: fmt.Sprintf("Error: %s is not a tool here; call the function tools offered", name)})
		}
	}
	if len(calls) == 0 {
		return nil, 0, nil
	}
	results, err := run(ctx, d, calls)
	msgs := make([]openai.ChatCompletionMessageParamUnion, 0, len(calls)+1)
	var images []openai.ChatCompletionContentPartUnionParam
	for i, c := range calls {
		var texts []openai.ChatCompletionContentPartTextParam
		n := 0
		for _, p := range parts(results[i]) {
			if p.image != "" {
				if n == 0 {
					images = append(images, openai.TextContentPart("The images of tool call "+c.id+" ("+c.name+"):"))
				}
				n++
				images = append(images, openai.ImageContentPart(openai.ChatCompletionContentPartImageImageURLParam{URL: p.image}))
				continue
			}
			texts = append(texts, openai.ChatCompletionContentPartTextParam{Text: p.text})
		}
		if n > 0 {
			texts = append(texts, openai.ChatCompletionContentPartTextParam{
				Text: fmt.Sprintf("[%d image(s) of this call follow in the next user message]", n)})
		}
		if len(texts) == 0 {
			texts = append(texts, openai.ChatCompletionContentPartTextParam{Text: "[no output]"})
		}
		msgs = append(msgs, openai.ToolMessage(texts, c.id))
	}
	if len(images) > 0 {
		msgs = append(msgs, openai.UserMessage(images))
	}
	return msgs, len(calls), err
}
