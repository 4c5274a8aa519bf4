package fakemessages

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// recorder is a testing.TB whose Errorf is recorded instead of failing the test: what
// the fake would tell a test.
type recorder struct {
	testing.TB
	mu   sync.Mutex
	msgs []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, fmt.Sprintf(format, args...))
}

func (r *recorder) said() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.msgs, "\n")
}

func post(t *testing.T, s *Server, key, body string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.URL+"/v1/messages", strings.NewReader(body))
	req.Header.Set("X-Api-Key", key)
	req.Header.Set("Anthropic-Version", "2023-06-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func request(t *testing.T, msgs ...Message) string {
	b, err := json.Marshal(Request{Model: "m", MaxTokens: 10, Messages: msgs})
	if err != nil {
		t.Fatal(err)
	}
	return string(bytes.TrimSpace(b))
}

// The fake fails the test it serves when a request is wrong: a bad key, a tool_use left
// unanswered, a turn's own check, a request past the script, and too few requests.
func TestTheFakeFailsWrongRequests(t *testing.T) {
	use := Block{Type: "tool_use", ID: "toolu_1", Name: "bash", Input: json.RawMessage(`{}`)}
	answer := Block{Type: "tool_result", ToolUseID: "toolu_1", Content: []Block{{Type: "text", Text: "ok"}}}
	first := Message{Role: "user", Content: []Block{{Type: "text", Text: "go"}}}
	asked := Message{Role: "assistant", Content: []Block{use}}
	for _, c := range []struct {
		name   string
		turns  []Turn
		bodies []string
		key    string
		status int
		want   string
	}{
		{"bad key", []Turn{{StopReason: "end_turn"}}, []string{request(t, first)}, "sk-wrong", 401, "X-Api-Key"},
		{"unanswered tool_use", []Turn{{StopReason: "tool_use"}, {StopReason: "end_turn"}},
			[]string{request(t, first), request(t, first, asked, Message{Role: "user", Content: []Block{{Type: "text", Text: "hm"}}})},
			Key, 400, "tool_result blocks for []"},
		{"the turn's check", []Turn{{StopReason: "tool_use"}, {StopReason: "end_turn", Check: func(r *Request) error {
			res, err := r.Results()
			if err != nil {
				return err
			}
			if !res[0].IsErr() {
				return fmt.Errorf("want is_error")
			}
			return nil
		}}}, []string{request(t, first), request(t, first, asked, Message{Role: "user", Content: []Block{answer}})},
			Key, 400, "want is_error"},
		{"past the script", []Turn{{StopReason: "end_turn"}}, []string{request(t, first), request(t, first)}, Key, 400, "after the 1 scripted turns"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := &recorder{TB: t}
			s := New(rec, c.turns...)
			status := 0
			for _, b := range c.bodies {
				if status = post(t, s, c.key, b); status != 200 {
					break
				}
			}
			if status != c.status {
				t.Errorf("status %d, want %d", status, c.status)
			}
			if !strings.Contains(rec.said(), c.want) {
				t.Errorf("the fake said %q, want %q", rec.said(), c.want)
			}
		})
	}
}
