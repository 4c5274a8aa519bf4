// Package fakeopenai is an httptest fake of OpenAI's Chat Completions (POST
// /v1/chat/completions) and Responses (POST /v1/responses) APIs for tests of agent loops:
// it plays a scripted conversation, one Turn per request, and first checks what the client
// sent (the tools, the history, every tool call answered in order, the images) so that a
// loop sending the wrong thing fails its test. It decodes requests with encoding/json
// alone, never with the SDK whose output it judges, and writes responses in the APIs' wire
// format, which the official client (openai-go) must read.
package fakeopenai

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	// The image types a result may carry, decoded to prove they are images.
	_ "image/gif"
	_ "image/jpeg"
	_ "image/png"

	_ "golang.org/x/image/webp"
)

// Key is the API key the fake expects as a bearer token.
const Key = "sk-fake-openai-key"

// Call is a function call the model makes.
type Call struct {
	ID, Name, Arguments string
}

// Turn is one request and the response to it.
type Turn struct {
	// Check looks at the request; an error fails the test, and the fake answers 400.
	Check func(r *Request) error
	// Calls are the function calls of the response; none: Text is the model's answer.
	Calls []Call
	// Text is the response's text.
	Text string
}

// Tool is a function tool of a request, in either API's shape (Chat Completions nests the
// function; Responses does not): Name, Description and Parameters are filled either way.
type Tool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
	Strict      *bool           `json:"strict"`
	Function    *struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	} `json:"function"`
}

// Result is what answered one function call: its call id, its text, its images' media
// types, and where it came in (a tool message, a function_call_output, a user message).
type Result struct {
	CallID string
	Text   string
	Images []string
}

// Request is a request as the fake reads it, in either API.
type Request struct {
	API   string // "chat" or "responses"
	Model string
	Tools []Tool
	// Results are the answers to the previous turn's calls, in the order they came.
	Results []Result
	// Raw is the request body.
	Raw json.RawMessage
}

// Server is the fake API. Its URL + "/v1" is the base URL to give the SDK
// (option.WithBaseURL).
type Server struct {
	*httptest.Server
	t     testing.TB
	turns []Turn

	mu     sync.Mutex
	played int
	// history is the Responses conversation the fake stored: the items of every response
	// by id, so a request naming previous_response_id is checked against it.
	history  map[string][]json.RawMessage
	lastResp string
}

// New starts the fake with its script; the test's cleanup stops it and fails the test when
// fewer requests came than turns.
func New(t testing.TB, turns ...Turn) *Server {
	s := &Server{t: t, turns: turns, history: map[string][]json.RawMessage{}}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(func() {
		s.Close()
		if p := s.Played(); p != len(s.turns) {
			t.Errorf("fake OpenAI API: %d requests of the %d scripted", p, len(s.turns))
		}
	})
	return s
}

// BaseURL is the base URL to give the SDK.
func (s *Server) BaseURL() string { return s.URL + "/v1/" }

// Played is how many turns have been played.
func (s *Server) Played() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.played
}

func (s *Server) fail(w http.ResponseWriter, status int, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.t.Errorf("fake OpenAI API: %s", msg)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
		"message": msg, "type": "invalid_request_error", "param": nil, "code": nil}})
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	var api string
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/chat/completions":
		api = "chat"
	case r.Method == http.MethodPost && r.URL.Path == "/v1/responses":
		api = "responses"
	default:
		s.fail(w, http.StatusNotFound, "%s %s, want POST /v1/chat/completions or /v1/responses", r.Method, r.URL.Path)
		return
	}
	if got := r.Header.Get("Authorization"); got != "Bearer "+Key {
		s.fail(w, http.StatusUnauthorized, "Authorization %q, want the fake key", got)
		return
	}
	var raw json.RawMessage
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<20)).Decode(&raw); err != nil {
		s.fail(w, http.StatusBadRequest, "request body: %v", err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.played
	s.played++
	if n >= len(s.turns) {
		s.fail(w, http.StatusBadRequest, "request %d, after the %d scripted turns", n+1, len(s.turns))
		return
	}
	turn := s.turns[n]
	req := &Request{API: api, Raw: raw}
	var err error
	if api == "chat" {
		err = s.readChat(req, n)
	} else {
		err = s.readResponses(req, n)
	}
	if err == nil {
		err = checkTools(req)
	}
	if err == nil && turn.Check != nil {
		err = turn.Check(req)
	}
	if err != nil {
		s.fail(w, http.StatusBadRequest, "request %d (%s): %v", n+1, api, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Request-Id", fmt.Sprintf("req_fake_%d", n+1))
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	if api == "chat" {
		enc.Encode(chatResponse(req, turn, n))
		return
	}
	id := fmt.Sprintf("resp_fake_%d", n+1)
	items := responseItems(turn, n)
	s.history[id] = items
	s.lastResp = id
	enc.Encode(map[string]any{
		"id": id, "object": "response", "created_at": 1764115200 + n, "status": "completed",
		"model": req.Model, "output": items, "parallel_tool_calls": true, "tool_choice": "auto",
		"tools": []any{}, "temperature": 1, "top_p": 1, "error": nil, "incomplete_details": nil,
		"instructions": nil, "metadata": map[string]any{},
		"usage": map[string]any{"input_tokens": 10, "output_tokens": 10, "total_tokens": 20,
			"input_tokens_details": map[string]int{"cached_tokens": 0}, "output_tokens_details": map[string]int{"reasoning_tokens": 0}},
	})
}

func checkTools(r *Request) error {
	if len(r.Tools) == 0 {
		return errors.New("no tools")
	}
	for i, t := range r.Tools {
		if t.Type != "function" {
			return fmt.Errorf("tool %d has type %q, want function", i, t.Type)
		}
		if r.API == "chat" {
			if t.Function == nil {
				return fmt.Errorf("tool %d has no function", i)
			}
			r.Tools[i].Name, r.Tools[i].Description, r.Tools[i].Parameters = t.Function.Name, t.Function.Description, t.Function.Parameters
		} else if t.Strict == nil {
			return fmt.Errorf("tool %s has no strict (the Responses API requires it)", t.Name)
		}
		var schema struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(r.Tools[i].Parameters, &schema); err != nil || schema.Type != "object" {
			return fmt.Errorf("tool %s: parameters %s are not an object schema", r.Tools[i].Name, r.Tools[i].Parameters)
		}
	}
	return nil
}

// content is a message's content: a string or a list of parts.
type content []struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	ImageURL *struct {
		URL string `json:"url"`
	} `json:"image_url"`
}

func (c *content) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		*c = content{{Type: "text", Text: s}}
		return nil
	}
	type plain content
	return json.Unmarshal(b, (*plain)(c))
}

type chatMessage struct {
	Role       string  `json:"role"`
	Content    content `json:"content"`
	ToolCallID string  `json:"tool_call_id"`
	ToolCalls  []struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

// readChat checks a Chat Completions request after n turns: the history holds the user's
// message, then for each earlier turn the assistant's message (its tool calls as the fake
// sent them) and the tool messages answering every call in order, then at most one user
// message (of the calls' images); the Results are the last turn's answers.
func (s *Server) readChat(r *Request, n int) error {
	var body struct {
		Model    string        `json:"model"`
		Messages []chatMessage `json:"messages"`
		Tools    []Tool        `json:"tools"`
	}
	if err := json.Unmarshal(r.Raw, &body); err != nil {
		return err
	}
	if body.Model == "" {
		return errors.New("no model")
	}
	r.Model, r.Tools = body.Model, body.Tools
	msgs := body.Messages
	if len(msgs) == 0 || (msgs[0].Role != "user" && msgs[0].Role != "system" && msgs[0].Role != "developer") {
		return errors.New("the history does not start with the user's (or system's) message")
	}
	for len(msgs) > 0 && msgs[0].Role != "assistant" {
		msgs = msgs[1:]
	}
	for turn := 0; turn < n; turn++ {
		if len(msgs) == 0 || msgs[0].Role != "assistant" {
			return fmt.Errorf("turn %d: no assistant message in the history", turn+1)
		}
		want := s.turns[turn].Calls
		asst := msgs[0]
		msgs = msgs[1:]
		if len(asst.ToolCalls) != len(want) {
			return fmt.Errorf("turn %d: the assistant message has %d tool calls, the fake sent %d", turn+1, len(asst.ToolCalls), len(want))
		}
		for i, tc := range asst.ToolCalls {
			if tc.ID != want[i].ID || tc.Function.Name != want[i].Name || tc.Function.Arguments != want[i].Arguments || tc.Type != "function" {
				return fmt.Errorf("turn %d: tool call %d came back as %+v, the fake sent %+v", turn+1, i, tc, want[i])
			}
		}
		var results []Result
		for i := range want {
			if len(msgs) == 0 || msgs[0].Role != "tool" {
				return fmt.Errorf("turn %d: tool call %s has no tool message", turn+1, want[i].ID)
			}
			m := msgs[0]
			msgs = msgs[1:]
			if m.ToolCallID != want[i].ID {
				return fmt.Errorf("turn %d: tool message %d answers %q, want %q (in order)", turn+1, i, m.ToolCallID, want[i].ID)
			}
			res := Result{CallID: m.ToolCallID}
			for _, p := range m.Content {
				if p.Type != "text" {
					return fmt.Errorf("turn %d: tool message for %s has a %q part: tool messages carry text only", turn+1, m.ToolCallID, p.Type)
				}
				res.Text += p.Text
			}
			if res.Text == "" {
				return fmt.Errorf("turn %d: tool message for %s is empty", turn+1, m.ToolCallID)
			}
			results = append(results, res)
		}
		// The images of the calls, in a user message after the tool messages.
		if len(msgs) > 0 && msgs[0].Role == "user" && len(want) > 0 {
			cur := -1
			for _, p := range msgs[0].Content {
				switch p.Type {
				case "text":
					cur = slices.IndexFunc(results, func(r Result) bool { return strings.Contains(p.Text, r.CallID) })
				case "image_url":
					if cur < 0 || p.ImageURL == nil {
						return fmt.Errorf("turn %d: an image not introduced by its call's id", turn+1)
					}
					mt, err := dataImage(p.ImageURL.URL)
					if err != nil {
						return fmt.Errorf("turn %d: %w", turn+1, err)
					}
					results[cur].Images = append(results[cur].Images, mt)
				}
			}
			msgs = msgs[1:]
		}
		r.Results = results
	}
	if len(msgs) != 0 {
		return fmt.Errorf("%d messages after the last turn's answers", len(msgs))
	}
	return nil
}

// dataImage checks a data URL holds an image of the type it says, and returns the type.
func dataImage(url string) (string, error) {
	rest, ok := strings.CutPrefix(url, "data:")
	mt, data, ok2 := strings.Cut(rest, ";base64,")
	if !ok || !ok2 {
		return "", fmt.Errorf("image URL %.40q is not a base64 data URL", url)
	}
	raw, err := base64.StdEncoding.DecodeString(data)
	if err != nil {
		return "", fmt.Errorf("image data is not base64: %w", err)
	}
	_, format, err := image.DecodeConfig(strings.NewReader(string(raw)))
	if err != nil {
		return "", fmt.Errorf("image data of type %s does not decode: %w", mt, err)
	}
	if "image/"+format != mt {
		return "", fmt.Errorf("image data of type %s is %s", mt, format)
	}
	return mt, nil
}

func chatResponse(r *Request, turn Turn, n int) map[string]any {
	msg := map[string]any{"role": "assistant", "content": nil, "refusal": nil}
	finish := "stop"
	if len(turn.Calls) > 0 {
		var calls []map[string]any
		for _, c := range turn.Calls {
			calls = append(calls, map[string]any{"id": c.ID, "type": "function",
				"function": map[string]string{"name": c.Name, "arguments": c.Arguments}})
		}
		msg["tool_calls"] = calls
		finish = "tool_calls"
	}
	if turn.Text != "" {
		msg["content"] = turn.Text
	}
	return map[string]any{
		"id": fmt.Sprintf("chatcmpl-fake%d", n+1), "object": "chat.completion", "created": 1764115200 + n,
		"model": r.Model, "system_fingerprint": "fp_fake",
		"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": finish, "logprobs": nil}},
		"usage":   map[string]int{"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
	}
}

func responseItems(turn Turn, n int) []json.RawMessage {
	var items []json.RawMessage
	add := func(v any) {
		b, _ := json.Marshal(v)
		items = append(items, b)
	}
	if turn.Text != "" {
		add(map[string]any{"type": "message", "id": fmt.Sprintf("msg_fake_%d", n+1), "role": "assistant", "status": "completed",
			"content": []any{map[string]any{"type": "output_text", "text": turn.Text, "annotations": []any{}}}})
	}
	for i, c := range turn.Calls {
		add(map[string]any{"type": "function_call", "id": fmt.Sprintf("fc_fake_%d_%d", n+1, i), "call_id": c.ID,
			"name": c.Name, "arguments": c.Arguments, "status": "completed"})
	}
	return items
}

type inputItem struct {
	Type    string          `json:"type"`
	Role    string          `json:"role"`
	CallID  string          `json:"call_id"`
	Output  json.RawMessage `json:"output"`
	Content json.RawMessage `json:"content"`
}

// readResponses checks a Responses request after n turns: the first is a user's input;
// each later one names the previous response (previous_response_id, as the fake stored
// it) and holds a function_call_output for each of its function calls, in order; the
// Results are those outputs.
func (s *Server) readResponses(r *Request, n int) error {
	var body struct {
		Model              string          `json:"model"`
		Input              json.RawMessage `json:"input"`
		Tools              []Tool          `json:"tools"`
		PreviousResponseID string          `json:"previous_response_id"`
	}
	if err := json.Unmarshal(r.Raw, &body); err != nil {
		return err
	}
	if body.Model == "" {
		return errors.New("no model")
	}
	r.Model, r.Tools = body.Model, body.Tools
	var items []inputItem
	var text string
	if json.Unmarshal(body.Input, &text) != nil {
		if err := json.Unmarshal(body.Input, &items); err != nil {
			return fmt.Errorf("input is neither a string nor a list of items: %w", err)
		}
	}
	if n == 0 {
		if body.PreviousResponseID != "" {
			return errors.New("the first request names a previous response")
		}
		return nil
	}
	if body.PreviousResponseID != s.lastResp {
		return fmt.Errorf("previous_response_id %q, want %q (the last response)", body.PreviousResponseID, s.lastResp)
	}
	want := s.turns[n-1].Calls
	var outs []inputItem
	for _, it := range items {
		if it.Type == "function_call_output" {
			outs = append(outs, it)
		}
	}
	if len(outs) != len(want) {
		return fmt.Errorf("%d function_call_output items for %d function calls", len(outs), len(want))
	}
	for i, o := range outs {
		if o.CallID != want[i].ID {
			return fmt.Errorf("function_call_output %d answers %q, want %q (in order)", i, o.CallID, want[i].ID)
		}
		res := Result{CallID: o.CallID}
		var s string
		if json.Unmarshal(o.Output, &s) == nil {
			res.Text = s
		} else {
			var list []struct {
				Type     string `json:"type"`
				Text     string `json:"text"`
				ImageURL string `json:"image_url"`
			}
			if err := json.Unmarshal(o.Output, &list); err != nil {
				return fmt.Errorf("function_call_output %s: output is neither a string nor a list: %w", o.CallID, err)
			}
			for _, p := range list {
				switch p.Type {
				case "input_text":
					res.Text += p.Text
				case "input_image":
					mt, err := dataImage(p.ImageURL)
					if err != nil {
						return fmt.Errorf("function_call_output %s: %w", o.CallID, err)
					}
					res.Images = append(res.Images, mt)
				default:
					return fmt.Errorf("function_call_output %s: an output item of type %q", o.CallID, p.Type)
				}
			}
		}
		if res.Text == "" && len(res.Images) == 0 {
			return fmt.Errorf("function_call_output %s is empty", o.CallID)
		}
		r.Results = append(r.Results, res)
	}
	return nil
}
