// Package fakemessages is an httptest fake of the Anthropic Messages API (POST
// /v1/messages) for tests of agent loops: it plays a scripted conversation, one Turn per
// request, and each Turn first checks what the client sent (the tools, the history, the
// tool_result blocks with their is_error and images) so that a loop sending the wrong
// thing fails its test. It decodes requests with encoding/json alone, never with the SDK
// whose output it judges.
package fakemessages

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/image/webp"
)

// Key is the API key the fake expects in X-Api-Key.
const Key = "sk-ant-fake-key"

// Request is a Messages API request as the fake reads it.
type Request struct {
	Model     string    `json:"model"`
	MaxTokens int       `json:"max_tokens"`
	Tools     []Tool    `json:"tools"`
	Messages  []Message `json:"messages"`
}

// Tool is a tool definition of a request: a function tool (no type, or "custom"), or one
// of Anthropic's built-in types (bash_20250124, text_editor_20250728...) without a schema.
type Tool struct {
	Type          string          `json:"type,omitempty"`
	MaxCharacters *int            `json:"max_characters,omitempty"`
	Name          string          `json:"name"`
	Description   string          `json:"description"`
	InputSchema   json.RawMessage `json:"input_schema"`
}

// Message is one turn of a request's history.
type Message struct {
	Role    string  `json:"role"`
	Content []Block `json:"content"`
}

// Block is a content block of any type: text, tool_use, tool_result, image.
type Block struct {
	Type      string          `json:"type"`
	Text      string          `json:"text,omitempty"`
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Input     json.RawMessage `json:"input,omitempty"`
	ToolUseID string          `json:"tool_use_id,omitempty"`
	IsError   *bool           `json:"is_error,omitempty"`
	Content   []Block         `json:"content,omitempty"`
	Source    *Source         `json:"source,omitempty"`
}

// Source is an image block's source.
type Source struct {
	Type      string `json:"type"`
	MediaType string `json:"media_type"`
	Data      string `json:"data"`
}

// Turn is one request and the response to it.
type Turn struct {
	// Check looks at the request; an error fails the test, and the fake answers 400.
	Check func(r *Request) error
	// Content is the response's content blocks (text and tool_use blocks).
	Content []Block
	// StopReason is the response's stop_reason (tool_use, end_turn...).
	StopReason string
}

// Server is the fake API. Its URL is the base URL to give the SDK (option.WithBaseURL):
// the SDK posts to URL + "/v1/messages".
type Server struct {
	*httptest.Server
	t     testing.TB
	turns []Turn

	mu     sync.Mutex
	played int
}

// New starts the fake with its script; the test's cleanup stops it and fails the test when
// fewer requests came than turns.
func New(t testing.TB, turns ...Turn) *Server {
	s := &Server{t: t, turns: turns}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(func() {
		s.Close()
		if p := s.Played(); p != len(s.turns) {
			t.Errorf("fake Messages API: %d requests of the %d scripted", p, len(s.turns))
		}
	})
	return s
}

// Played is how many turns have been played.
func (s *Server) Played() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.played
}

func (s *Server) fail(w http.ResponseWriter, status int, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.t.Errorf("fake Messages API: %s", msg)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"type": "error", "request_id": "req_fake",
		"error": map[string]string{"type": "invalid_request_error", "message": msg}})
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/messages" {
		s.fail(w, http.StatusNotFound, "%s %s, want POST /v1/messages", r.Method, r.URL.Path)
		return
	}
	if got := r.Header.Get("X-Api-Key"); got != Key {
		s.fail(w, http.StatusUnauthorized, "X-Api-Key %q, want the fake key", got)
		return
	}
	if got := r.Header.Get("Anthropic-Version"); got == "" {
		s.fail(w, http.StatusBadRequest, "no Anthropic-Version header")
		return
	}
	var req Request
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<20))
	if err := dec.Decode(&req); err != nil {
		s.fail(w, http.StatusBadRequest, "request body: %v", err)
		return
	}
	s.mu.Lock()
	n := s.played
	s.played++
	s.mu.Unlock()
	if n >= len(s.turns) {
		s.fail(w, http.StatusBadRequest, "request %d, after the %d scripted turns", n+1, len(s.turns))
		return
	}
	turn := s.turns[n]
	if req.Model == "" || req.MaxTokens <= 0 {
		s.fail(w, http.StatusBadRequest, "request %d: model %q, max_tokens %d", n+1, req.Model, req.MaxTokens)
		return
	}
	if err := History(&req, n); err != nil {
		s.fail(w, http.StatusBadRequest, "request %d: %v", n+1, err)
		return
	}
	if turn.Check != nil {
		if err := turn.Check(&req); err != nil {
			s.fail(w, http.StatusBadRequest, "request %d: %v", n+1, err)
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Request-Id", fmt.Sprintf("req_fake_%d", n+1))
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(map[string]any{
		"id": fmt.Sprintf("msg_fake_%d", n+1), "type": "message", "role": "assistant",
		"model": req.Model, "content": turn.Content, "stop_reason": turn.StopReason,
		"stop_sequence": nil, "usage": map[string]int{"input_tokens": 10, "output_tokens": 10},
	})
}

// History checks the shape every request of a conversation has after n earlier turns: 2n+1
// messages, user and assistant in turn, and every tool_use of an assistant turn answered by
// a tool_result in the next user turn, in the same order.
func History(r *Request, n int) error {
	if len(r.Messages) != 2*n+1 {
		return fmt.Errorf("%d messages in the history, want %d", len(r.Messages), 2*n+1)
	}
	for i, m := range r.Messages {
		want := "user"
		if i%2 == 1 {
			want = "assistant"
		}
		if m.Role != want {
			return fmt.Errorf("message %d has role %q, want %q", i, m.Role, want)
		}
		if i%2 == 0 || i+1 >= len(r.Messages) {
			continue
		}
		var uses, answers []string
		for _, b := range m.Content {
			if b.Type == "tool_use" {
				uses = append(uses, b.ID)
			}
		}
		for _, b := range r.Messages[i+1].Content {
			if b.Type == "tool_result" {
				answers = append(answers, b.ToolUseID)
			}
		}
		if !slices.Equal(uses, answers) {
			return fmt.Errorf("message %d has tool_use blocks %v, the next has tool_result blocks for %v", i, uses, answers)
		}
	}
	return nil
}

// Results returns the tool_result blocks of the request's last message, which must be the
// user's.
func (r *Request) Results() ([]Block, error) {
	last := r.Messages[len(r.Messages)-1]
	var out []Block
	for _, b := range last.Content {
		if b.Type == "tool_result" {
			out = append(out, b)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("the last message holds no tool_result")
	}
	return out, nil
}

// TextOf is the text of a tool_result's text blocks.
func (b Block) TextOf() string {
	var sb strings.Builder
	for _, c := range b.Content {
		if c.Type == "text" {
			sb.WriteString(c.Text)
		}
	}
	return sb.String()
}

// IsErr reports the block's is_error (false when absent).
func (b Block) IsErr() bool { return b.IsError != nil && *b.IsError }

// WebPImages decodes the image blocks of a tool_result: each must be base64 image/webp that
// decodes as WebP; it returns their sizes as "WxH".
func (b Block) WebPImages() ([]string, error) {
	var sizes []string
	for _, c := range b.Content {
		if c.Type != "image" {
			continue
		}
		if c.Source == nil || c.Source.Type != "base64" || c.Source.MediaType != "image/webp" {
			return nil, fmt.Errorf("image block with source %+v, want base64 image/webp", c.Source)
		}
		raw, err := base64.StdEncoding.DecodeString(c.Source.Data)
		if err != nil {
			return nil, fmt.Errorf("image data is not base64: %w", err)
		}
		cfg, err := webp.DecodeConfig(bytes.NewReader(raw))
		if err != nil {
			return nil, fmt.Errorf("image data is not a WebP image: %w", err)
		}
		sizes = append(sizes, fmt.Sprintf("%dx%d", cfg.Width, cfg.Height))
	}
	return sizes, nil
}
