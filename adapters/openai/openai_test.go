package openai_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/abi"
	toolopenai "github.com/toolhost/toolhost/adapters/openai"
	"github.com/toolhost/toolhost/internal/testplugins"
)

func quiet() toolhost.Option { return toolhost.WithLogger(slog.New(slog.DiscardHandler)) }

// builtinTools are the built-in plugins' tools, as a Session lists them (listing needs no
// sandbox).
func builtinTools(t *testing.T) []abi.Tool {
	t.Helper()
	cfg := toolhost.DefaultConfig()
	cfg.DataDir = testplugins.DataDir()
	if err := cfg.Set("store.dir", t.TempDir()); err != nil {
		t.Fatal(err)
	}
	th, err := toolhost.New(context.Background(), cfg, quiet())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { th.Close(context.Background()) })
	return th.Tools()
}

func jsonOf(t *testing.T, v any) map[string]any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal %T: %v", v, err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return m
}

// compact is a JSON value without its spaces.
func compact(t *testing.T, b []byte) string {
	t.Helper()
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return buf.String()
}

// Both APIs get every tool as a function tool whose parameters are the plugin's schema
// member for member, properties in the plugin's order; apply_patch is Codex's function
// tool of one string, input.
func TestToolsCarryTheSchemas(t *testing.T) {
	tools := builtinTools(t)
	chat, err := toolopenai.ChatTools(tools)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := toolopenai.ResponseTools(tools)
	if err != nil {
		t.Fatal(err)
	}
	if len(chat) != len(tools) || len(resp) != len(tools) || len(tools) != 12 {
		t.Fatalf("%d chat and %d responses tools for %d, want 12", len(chat), len(resp), len(tools))
	}
	for i, tl := range tools {
		var schema map[string]any
		if err := json.Unmarshal(tl.InputSchema, &schema); err != nil {
			t.Fatal(err)
		}
		c := jsonOf(t, chat[i])
		fn := c["function"].(map[string]any)
		if c["type"] != "function" || fn["name"] != tl.Name || fn["description"] != tl.Description || fn["strict"] != nil {
			t.Errorf("chat tool %s: %v", tl.Name, c)
		}
		if !reflect.DeepEqual(fn["parameters"], schema) {
			t.Errorf("chat tool %s: parameters\n%v\nwant\n%v", tl.Name, fn["parameters"], schema)
		}
		r := jsonOf(t, resp[i])
		if r["type"] != "function" || r["name"] != tl.Name || r["description"] != tl.Description || r["strict"] != false {
			t.Errorf("responses tool %s: %v", tl.Name, r)
		}
		if !reflect.DeepEqual(r["parameters"], schema) {
			t.Errorf("responses tool %s: parameters\n%v\nwant\n%v", tl.Name, r["parameters"], schema)
		}
		// The properties keep their order.
		var sent struct {
			Parameters struct{ Properties json.RawMessage } `json:"parameters"`
		}
		var own struct{ Properties json.RawMessage }
		b, _ := json.Marshal(resp[i])
		json.Unmarshal(b, &sent)
		json.Unmarshal(tl.InputSchema, &own)
		if got, want := compact(t, sent.Parameters.Properties), compact(t, own.Properties); got != want {
			t.Errorf("tool %s: properties sent as\n%s\nwant, in order,\n%s", tl.Name, got, want)
		}
		if tl.Name == "apply_patch" {
			props := schema["properties"].(map[string]any)
			in, _ := props["input"].(map[string]any)
			if len(props) != 1 || in["type"] != "string" || fmt.Sprint(schema["required"]) != "[input]" ||
				!strings.Contains(tl.Description, "*** Begin Patch") {
				t.Errorf("apply_patch is not Codex's function tool of one string input: %v", schema)
			}
		}
	}
}

func TestToolsRefuse(t *testing.T) {
	for _, tl := range []abi.Tool{
		{Name: "odd", InputSchema: abi.RawJSON(`{"type": "string"}`)},
		{Name: "odd", InputSchema: abi.RawJSON(`[1]`)},
		{Name: "odd", InputSchema: abi.RawJSON(`null`)},
		{Name: "odd", InputSchema: abi.RawJSON(`{"required": "path"}`)},
		{Name: "a.b", InputSchema: abi.RawJSON(`{}`)},
		{Name: strings.Repeat("x", 65), InputSchema: abi.RawJSON(`{}`)},
		{Name: "", InputSchema: abi.RawJSON(`{}`)},
	} {
		if _, err := toolopenai.ChatTools([]abi.Tool{tl}); err == nil {
			t.Errorf("ChatTools(%q, %s): no error", tl.Name, tl.InputSchema)
		}
		if _, err := toolopenai.ResponseTools([]abi.Tool{tl}); err == nil {
			t.Errorf("ResponseTools(%q, %s): no error", tl.Name, tl.InputSchema)
		}
	}
	r, err := toolopenai.ResponseTools([]abi.Tool{{Name: "bare", InputSchema: abi.RawJSON(`{}`)}})
	if err != nil {
		t.Fatal(err)
	}
	if got := jsonOf(t, r[0]); !reflect.DeepEqual(got["parameters"], map[string]any{"type": "object"}) || got["description"] != nil {
		t.Errorf("a bare schema: %v", got)
	}
}

const webp1x1 = "UklGRiQAAABXRUJQVlA4IBgAAAAwAQCdASoBAAEAAwA0JaQAA3AA/vuUAAA="

// A result's blocks in both APIs: texts, images as data URLs where the API takes them,
// what they cannot carry said in words, a failure starting with "Error: ".
func TestResultBlocks(t *testing.T) {
	res := abi.Result{IsError: true, Content: []abi.Content{
		{Type: abi.ContentText, Text: "page shot"},
		{Type: abi.ContentText, Text: ""},
		{Type: abi.ContentImage, Source: &abi.ImageSource{Type: "base64", MediaType: "image/webp", Data: webp1x1}},
		{Type: abi.ContentImage, Source: &abi.ImageSource{Type: "base64", MediaType: "image/bmp", Data: "Qk0="}},
		{Type: abi.ContentImage, Source: &abi.ImageSource{Type: "base64", MediaType: "image/png", Data: "not base64!"}},
		{Type: abi.ContentImage, Source: &abi.ImageSource{Type: "base64", MediaType: "image/png", Raw: make([]byte, toolopenai.MaxImageBytes+1)}},
		{Type: abi.ContentImage},
		{Type: "audio"},
	}}
	got := jsonOf(t, toolopenai.FunctionCallOutput("call_1", res))
	want := map[string]any{"type": "function_call_output", "call_id": "call_1", "output": []any{
		map[string]any{"type": "input_text", "text": "Error: page shot"},
		map[string]any{"type": "input_image", "image_url": "data:image/webp;base64," + webp1x1},
		map[string]any{"type": "input_text", "text": `[an image of type "image/bmp" was left out: only PNG, JPEG, GIF and WebP images can be shown]`},
		map[string]any{"type": "input_text", "text": "[an image whose data is not base64 was left out]"},
		map[string]any{"type": "input_text", "text": "[an image of 20971521 bytes was left out: images of at most 20 MB can be shown]"},
		map[string]any{"type": "input_text", "text": "[an image without its data was left out]"},
		map[string]any{"type": "input_text", "text": `[a result block of type "audio" was left out]`},
	}}
	if !reflect.DeepEqual(got, want) {
		gb, _ := json.MarshalIndent(got, "", " ")
		t.Errorf("function_call_output:\n%s", gb)
	}
	for res, want := range map[*abi.Result]string{
		{Content: []abi.Content{{Type: abi.ContentText, Text: "a"}, {Type: abi.ContentText, Text: "b"}}}: "a\nb",
		{}: "[no output]",
		{IsError: true, Content: []abi.Content{{Type: abi.ContentText, Text: "Error: no such file"}}}: "Error: no such file",
		{IsError: true}: "Error: the tool failed without saying why.",
	} {
		if got := jsonOf(t, toolopenai.FunctionCallOutput("c", *res))["output"]; got != want {
			t.Errorf("%+v: output %q, want %q", *res, got, want)
		}
	}
}

// scripted answers tool calls from a table and records them.
type scripted struct {
	calls []string
	fail  map[string]error
}

func (s *scripted) Dispatch(ctx context.Context, tool string, input json.RawMessage) (abi.Result, error) {
	s.calls = append(s.calls, tool+" "+string(input))
	if err := s.fail[tool]; err != nil {
		return abi.Result{}, err
	}
	switch tool {
	case "read_file":
		return abi.ErrorText("Error: no such file"), nil
	case "take_screenshot":
		return abi.Result{Content: []abi.Content{{Type: abi.ContentText, Text: "desktop"},
			{Type: abi.ContentImage, Source: &abi.ImageSource{Type: "base64", MediaType: "image/webp", Data: webp1x1}}}}, nil
	}
	return abi.Text(tool + " done"), nil
}

func chatMessage(t *testing.T, body string) openai.ChatCompletionMessage {
	t.Helper()
	var c openai.ChatCompletion
	if err := json.Unmarshal([]byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m",
		"choices":[{"index":0,"finish_reason":"tool_calls","message":`+body+`}]}`), &c); err != nil {
		t.Fatal(err)
	}
	return c.Choices[0].Message
}

// Every tool call gets its tool message, in order, whatever happened to it; images go in
// one user message after them.
func TestToolMessages(t *testing.T) {
	msg := chatMessage(t, `{"role":"assistant","content":null,"tool_calls":[
		{"id":"call_a","type":"function","function":{"name":"write_file","arguments":"{\"path\":\"a\",\"content\":\"x\"}"}},
		{"id":"call_b","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"b\"}"}},
		{"id":"call_c","type":"function","function":{"name":"bash","arguments":"{}"}},
		{"id":"call_d","type":"function","function":{"name":"grep","arguments":"{\"pattern\": "}},
		{"id":"call_e","type":"custom","custom":{"name":"apply_patch","input":"*** Begin Patch"}},
		{"id":"call_f","type":"function","function":{"name":"take_screenshot","arguments":""}}]}`)
	hostErr := errors.New("the sandbox is gone")
	d := &scripted{fail: map[string]error{"bash": hostErr}}
	out, n, err := toolopenai.ToolMessages(context.Background(), d, msg)
	if n != 6 || len(out) != 7 {
		t.Fatalf("%d calls, %d messages; want 6 and 7 (the images' user message)", n, len(out))
	}
	if !errors.Is(err, hostErr) || !strings.Contains(err.Error(), "tool bash (call call_c)") {
		t.Errorf("error %v, want the host failure of bash named with its call", err)
	}
	wantCalls := []string{`write_file {"path":"a","content":"x"}`, `read_file {"path":"b"}`, `bash {}`, `take_screenshot {}`}
	if !slices.Equal(d.calls, wantCalls) {
		t.Errorf("calls %q, want %q", d.calls, wantCalls)
	}
	wantText := []string{"write_file done", "Error: no such file", "Error: the tool bash could not be run; try again.",
		"Error: the arguments of grep are not a JSON object", "Error: apply_patch is not a tool here",
		"desktop[1 image(s) of this call follow in the next user message]"}
	for i, m := range out[:6] {
		got := jsonOf(t, m)
		var text string
		for _, p := range got["content"].([]any) {
			text += p.(map[string]any)["text"].(string)
		}
		if got["role"] != "tool" || got["tool_call_id"] != fmt.Sprintf("call_%c", 'a'+i) || !strings.HasPrefix(text, wantText[i]) {
			t.Errorf("message %d: %v; want the tool message for call_%c starting %q", i, got, 'a'+i, wantText[i])
		}
	}
	user := jsonOf(t, out[6])
	parts := user["content"].([]any)
	if user["role"] != "user" || len(parts) != 2 || !strings.Contains(fmt.Sprint(parts[0]), "call_f") ||
		parts[1].(map[string]any)["image_url"].(map[string]any)["url"] != "data:image/webp;base64,"+webp1x1 {
		t.Errorf("the images' message: %v", user)
	}

	none := chatMessage(t, `{"role":"assistant","content":"Done."}`)
	if out, n, err := toolopenai.ToolMessages(context.Background(), d, none); n != 0 || out != nil || err != nil {
		t.Errorf("a message without tool calls: %d, %v, %v", n, out, err)
	}
}

// canceller stops the run during its first call.
type canceller struct {
	cancel context.CancelFunc
	calls  int
}

func (c *canceller) Dispatch(ctx context.Context, tool string, input json.RawMessage) (abi.Result, error) {
	c.calls++
	c.cancel()
	return abi.Text("done"), nil
}

func responseOf(t *testing.T, output string) responses.Response {
	t.Helper()
	var r responses.Response
	if err := json.Unmarshal([]byte(`{"id":"resp_1","object":"response","created_at":1,"status":"completed","model":"m","output":`+output+`}`), &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// Responses: every function_call item gets its output in order; once ctx ends the calls
// left are answered, not run.
func TestFunctionCallOutputs(t *testing.T) {
	r := responseOf(t, `[{"type":"reasoning","id":"rs_1","summary":[]},
		{"type":"function_call","id":"fc_1","call_id":"call_a","name":"bash","arguments":"{\"command\":\"true\"}","status":"completed"},
		{"type":"message","id":"msg_1","role":"assistant","status":"completed","content":[{"type":"output_text","text":"hm","annotations":[]}]},
		{"type":"function_call","id":"fc_2","call_id":"call_b","name":"bash","arguments":"{\"command\":\"rm -rf build\"}","status":"completed"}]`)
	d := &scripted{}
	out, n, err := toolopenai.FunctionCallOutputs(context.Background(), d, r.Output)
	if n != 2 || len(out) != 2 || err != nil {
		t.Fatalf("%d outputs (%d), %v; want 2", n, len(out), err)
	}
	for i, o := range out {
		got := jsonOf(t, o)
		if got["type"] != "function_call_output" || got["call_id"] != fmt.Sprintf("call_%c", 'a'+i) || got["output"] != "bash done" {
			t.Errorf("output %d: %v", i, got)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := &canceller{cancel: cancel}
	out, n, err = toolopenai.FunctionCallOutputs(ctx, c, r.Output)
	if c.calls != 1 || n != 2 {
		t.Fatalf("%d calls run, %d outputs; want 1 run and 2 answered", c.calls, n)
	}
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "call_b") {
		t.Errorf("error %v, want the cancellation naming call_b", err)
	}
	if got := jsonOf(t, out[1])["output"]; !strings.Contains(fmt.Sprint(got), "was not run") {
		t.Errorf("the call left: %v", got)
	}
	if _, n, err := toolopenai.FunctionCallOutputs(context.Background(), d, responseOf(t, `[]`).Output); n != 0 || err != nil {
		t.Errorf("a response without calls: %d, %v", n, err)
	}
}

// The SDK stays at the edge: neither the host, nor the root package, nor the CLI links it.
func TestSDKStaysAtTheEdge(t *testing.T) {
	for _, pkg := range []string{"github.com/toolhost/toolhost", "github.com/toolhost/toolhost/internal/host",
		"github.com/toolhost/toolhost/cli"} {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if strings.HasPrefix(dep, "github.com/openai/") {
				t.Errorf("%s links %s", pkg, dep)
			}
		}
	}
}
