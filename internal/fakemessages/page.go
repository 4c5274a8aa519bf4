package fakemessages

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// FinalText is the model's last answer in PageConversation.
const FinalText = "The page is served on port 8000 and its screenshot shows the heading."

// PageHeading is the heading of the page PageConversation has the agent write.
const PageHeading = "Hello from the agent loop"

// PageConversation is an agent's task scripted against toolhost's built-in tools: write a
// page (write_file), start a server in the background and wait for its port (two bash
// calls in one turn), screenshot it beside a read of a missing file (take_screenshot,
// read_file: an is_error), then a final text. Each request is checked: the tools offered,
// the tool_result blocks of the previous turn in order, is_error where it must be and
// only there, and the screenshot's image blocks (base64 WebP that decodes).
func PageConversation() []Turn {
	tool := func(id, name, input string) Block {
		return Block{Type: "tool_use", ID: id, Name: name, Input: json.RawMessage(input)}
	}
	// results checks the last message's tool_result blocks: their ids and is_error.
	results := func(r *Request, ids []string, isErr []bool) ([]Block, error) {
		res, err := r.Results()
		if err != nil {
			return nil, err
		}
		var got []string
		for i, b := range res {
			got = append(got, b.ToolUseID)
			if i < len(isErr) && b.IsErr() != isErr[i] {
				return nil, fmt.Errorf("tool_result %s has is_error %v, want %v: %q", b.ToolUseID, b.IsErr(), isErr[i], b.TextOf())
			}
			if b.TextOf() == "" {
				return nil, fmt.Errorf("tool_result %s has no text", b.ToolUseID)
			}
		}
		if !slices.Equal(got, ids) {
			return nil, fmt.Errorf("tool_result blocks for %v, want %v", got, ids)
		}
		return res, nil
	}
	page, _ := json.Marshal(map[string]string{"path": "site/index.html",
		"content": "<!doctype html><title>agent</title><h1>" + PageHeading + "</h1>"})
	return []Turn{
		{
			Check: func(r *Request) error {
				var names []string
				for _, t := range r.Tools {
					var s struct {
						Type       string         `json:"type"`
						Properties map[string]any `json:"properties"`
					}
					if err := json.Unmarshal(t.InputSchema, &s); err != nil || s.Type != "object" || len(s.Properties) == 0 {
						return fmt.Errorf("tool %s: input_schema %s", t.Name, t.InputSchema)
					}
					if t.Description == "" {
						return fmt.Errorf("tool %s has no description", t.Name)
					}
					names = append(names, t.Name)
				}
				slices.Sort(names)
				want := []string{"apply_patch", "bash", "bash_kill", "bash_output", "edit_file", "exec_command", "glob", "grep",
					"read_file", "take_screenshot", "write_file", "write_stdin"}
				if !slices.Equal(names, want) {
					return fmt.Errorf("tools %v, want %v", names, want)
				}
				first := r.Messages[0].Content
				if len(first) != 1 || first[0].Type != "text" || first[0].Text == "" {
					return fmt.Errorf("the first message is %+v, want the task's text", first)
				}
				return nil
			},
			Content: []Block{
				{Type: "text", Text: "I'll write the page first."},
				tool("toolu_01", "write_file", string(page)),
			},
			StopReason: "tool_use",
		},
		{
			Check: func(r *Request) error {
				_, err := results(r, []string{"toolu_01"}, []bool{false})
				return err
			},
			Content: []Block{
				tool("toolu_02", "bash", `{"command": "cd site && exec python3 -m http.server 8000", "background": true}`),
				tool("toolu_03", "bash", `{"command": "for i in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/8000) 2>/dev/null && exit 0; sleep 0.1; done; exit 1"}`),
			},
			StopReason: "tool_use",
		},
		{
			Check: func(r *Request) error {
				res, err := results(r, []string{"toolu_02", "toolu_03"}, []bool{false, false})
				if err != nil {
					return err
				}
				if !strings.Contains(res[1].TextOf(), "[exit 0]") {
					return fmt.Errorf("the server's port never opened: %q", res[1].TextOf())
				}
				return nil
			},
			Content: []Block{
				{Type: "text", Text: "Let me look at it, and at the missing page too."},
				tool("toolu_04", "take_screenshot", `{"port": 8000}`),
				tool("toolu_05", "read_file", `{"path": "site/missing.html"}`),
			},
			StopReason: "tool_use",
		},
		{
			Check: func(r *Request) error {
				res, err := results(r, []string{"toolu_04", "toolu_05"}, []bool{false, true})
				if err != nil {
					return err
				}
				sizes, err := res[0].WebPImages()
				if err != nil {
					return fmt.Errorf("the screenshot's tool_result: %w", err)
				}
				if len(sizes) == 0 {
					return errors.New("the screenshot's tool_result holds no image block")
				}
				if n := len(res[1].Content); n != 1 || res[1].Content[0].Type != "text" {
					return fmt.Errorf("the missing file's tool_result has %d blocks, want one text", n)
				}
				return nil
			},
			Content:    []Block{{Type: "text", Text: FinalText}},
			StopReason: "end_turn",
		},
	}
}
