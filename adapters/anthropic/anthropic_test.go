package anthropic_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/abi"
	toolanthropic "github.com/toolhost/toolhost/adapters/anthropic"
	"github.com/toolhost/toolhost/internal/testplugins"
)

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

// The SDK's tool params carry each schema whole: what the request sends is the plugin's
// schema member for member, additionalProperties and defaults included.
func TestToolsCarryTheSchemas(t *testing.T) {
	tools := builtinTools(t)
	params, err := toolanthropic.Tools(tools)
	if err != nil {
		t.Fatal(err)
	}
	if len(params) != len(tools) || len(tools) != 12 {
		t.Fatalf("%d params for %d tools, want 12", len(params), len(tools))
	}
	for i, p := range params {
		got := jsonOf(t, p)
		var schema map[string]any
		if err := json.Unmarshal(tools[i].InputSchema, &schema); err != nil {
			t.Fatal(err)
		}
		if got["name"] != tools[i].Name || got["description"] != tools[i].Description {
			t.Errorf("tool %d: name %v, description %.40v; want %s", i, got["name"], got["description"], tools[i].Name)
		}
		if !reflect.DeepEqual(got["input_schema"], schema) {
			t.Errorf("tool %s: input_schema\n%v\nwant\n%v", tools[i].Name, got["input_schema"], schema)
		}
		// The properties keep their order, the order the model reads them in.
		var sent struct {
			InputSchema struct{ Properties json.RawMessage } `json:"input_schema"`
		}
		var own struct{ Properties json.RawMessage }
		b, _ := json.Marshal(p)
		json.Unmarshal(b, &sent)
		json.Unmarshal(tools[i].InputSchema, &own)
		var gotProps, wantProps bytes.Buffer
		json.Compact(&gotProps, sent.InputSchema.Properties)
		json.Compact(&wantProps, own.Properties)
		if gotProps.String() != wantProps.String() || gotProps.Len() == 0 {
			t.Errorf("tool %s: properties sent as\n%s\nwant, in order,\n%s", tools[i].Name, gotProps.String(), wantProps.String())
		}
		if _, ok := schema["additionalProperties"]; !ok && tools[i].Name == "bash" {
			t.Errorf("bash's schema has no additionalProperties: the comparison proves less than it should")
		}
	}
}

func TestToolRefusesANonObjectSchema(t *testing.T) {
	for _, schema := range []string{`{"type": "string"}`, `{"type": ["object", "null"]}`, `[1]`, `nope`, `null`, `{"required": "path"}`} {
		_, err := toolanthropic.Tool(abi.Tool{Name: "odd", InputSchema: abi.RawJSON(schema)})
		if err == nil || !strings.Contains(err.Error(), "tool odd") {
			t.Errorf("schema %s: error %v, want one naming tool odd", schema, err)
		}
	}
	p, err := toolanthropic.Tool(abi.Tool{Name: "bare", InputSchema: abi.RawJSON(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	if got := jsonOf(t, p); !reflect.DeepEqual(got["input_schema"], map[string]any{"type": "object"}) || got["description"] != nil {
		t.Errorf("a bare schema: %v", got)
	}
}

func TestToolResultBlocks(t *testing.T) {
	res := abi.Result{IsError: true, Content: []abi.Content{
		{Type: abi.ContentText, Text: "desktop"},
		{Type: abi.ContentText, Text: ""},
		{Type: abi.ContentImage, Source: &abi.ImageSource{Type: "base64", MediaType: "image/webp", Data: "UklGRg=="}},
		{Type: abi.ContentImage, Source: &abi.ImageSource{Type: "base64", MediaType: "image/png", Raw: []byte("PNG")}},
		{Type: abi.ContentImage, Source: &abi.ImageSource{Type: "base64", MediaType: "image/bmp", Data: "Qk0="}},
		{Type: abi.ContentImage, Source: &abi.ImageSource{Type: "base64", MediaType: "image/webp", Data: "not base64!"}},
		{Type: abi.ContentImage, Source: &abi.ImageSource{Type: "base64", MediaType: "image/webp", Raw: make([]byte, toolanthropic.MaxImageBytes+3)}},
		{Type: abi.ContentImage},
		{Type: "audio"},
	}}
	got := jsonOf(t, toolanthropic.ToolResult("toolu_1", res))
	want := map[string]any{
		"type": "tool_result", "tool_use_id": "toolu_1", "is_error": true,
		"content": []any{
			map[string]any{"type": "text", "text": "desktop"},
			map[string]any{"type": "image", "source": map[string]any{"type": "base64", "media_type": "image/webp", "data": "UklGRg=="}},
			map[string]any{"type": "image", "source": map[string]any{"type": "base64", "media_type": "image/png", "data": "UE5H"}},
			map[string]any{"type": "text", "text": `[an image of type "image/bmp" was left out: only JPEG, PNG, GIF and WebP images can be shown]`},
			map[string]any{"type": "text", "text": "[an image whose data is not base64 was left out]"},
			map[string]any{"type": "text", "text": "[an image of 5242883 bytes was left out: images of at most 5 MB can be shown]"},
			map[string]any{"type": "text", "text": "[an image without its data was left out]"},
			map[string]any{"type": "text", "text": `[a result block of type "audio" was left out]`},
		},
	}
	if !reflect.DeepEqual(got, want) {
		gb, _ := json.MarshalIndent(got, "", " ")
		t.Errorf("tool_result:\n%s", gb)
	}
	ok := jsonOf(t, toolanthropic.ToolResult("toolu_2", abi.Text("fine")))
	if ok["is_error"] != false {
		t.Errorf("a success's is_error is %v, want false sent", ok["is_error"])
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
		return abi.ErrorText("could not run " + tool), err
	}
	if tool == "read_file" {
		return abi.ErrorText("no such file"), nil
	}
	return abi.Text(tool + " done"), nil
}

// message decodes a Messages API response body as the SDK does.
func message(t *testing.T, body string) anthropic.Message {
	t.Helper()
	var m anthropic.Message
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestToolResultsInOrder(t *testing.T) {
	msg := message(t, `{"id":"msg_1","type":"message","role":"assistant","model":"m","stop_reason":"tool_use",
	"content":[{"type":"text","text":"Let me look."},
		{"type":"tool_use","id":"toolu_a","name":"write_file","input":{"path":"a","content":"x"}},
		{"type":"tool_use","id":"toolu_b","name":"read_file","input":{"path":"b"}},
		{"type":"tool_use","id":"toolu_c","name":"bash","input":{}},
		{"type":"tool_use","id":"toolu_d","name":"grep","input":{"pattern":"x"}}],
	"usage":{"input_tokens":1,"output_tokens":1}}`)
	hostErr := errors.New("the sandbox is gone")
	d := &scripted{fail: map[string]error{"bash": hostErr}}
	out, n, err := toolanthropic.ToolResults(context.Background(), d, msg.Content)
	if n != 4 {
		t.Fatalf("%d results, want 4", n)
	}
	if !errors.Is(err, hostErr) || !strings.Contains(err.Error(), "tool bash (tool_use toolu_c)") {
		t.Errorf("error %v, want the host failure of bash named with its block", err)
	}
	wantCalls := []string{`write_file {"path":"a","content":"x"}`, `read_file {"path":"b"}`, `bash {}`, `grep {"pattern":"x"}`}
	if !slices.Equal(d.calls, wantCalls) {
		t.Errorf("calls %q, want %q", d.calls, wantCalls)
	}
	got := jsonOf(t, out)
	if got["role"] != "user" {
		t.Errorf("role %v", got["role"])
	}
	blocks := got["content"].([]any)
	var ids []string
	var errs []bool
	for _, b := range blocks {
		m := b.(map[string]any)
		if m["type"] != "tool_result" {
			t.Errorf("block of type %v", m["type"])
		}
		ids = append(ids, m["tool_use_id"].(string))
		errs = append(errs, m["is_error"].(bool))
	}
	if !slices.Equal(ids, []string{"toolu_a", "toolu_b", "toolu_c", "toolu_d"}) || !slices.Equal(errs, []bool{false, true, true, false}) {
		t.Errorf("ids %v, is_error %v", ids, errs)
	}

	none := message(t, `{"id":"msg_2","type":"message","role":"assistant","model":"m","stop_reason":"end_turn",
	"content":[{"type":"text","text":"Done."}],"usage":{"input_tokens":1,"output_tokens":1}}`)
	if _, n, err := toolanthropic.ToolResults(context.Background(), d, none.Content); n != 0 || err != nil {
		t.Errorf("a message without tool_use: %d results, %v", n, err)
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
			if strings.HasPrefix(dep, "github.com/anthropics/") {
				t.Errorf("%s links %s", pkg, dep)
			}
		}
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

// Once ctx ends, the tool_use blocks left are answered with is_error results, not run.
func TestToolResultsStopWithTheContext(t *testing.T) {
	msg := message(t, `{"id":"msg_1","type":"message","role":"assistant","model":"m","stop_reason":"tool_use",
	"content":[{"type":"tool_use","id":"toolu_a","name":"bash","input":{"command":"true"}},
		{"type":"tool_use","id":"toolu_b","name":"bash","input":{"command":"rm -rf build"}}],
	"usage":{"input_tokens":1,"output_tokens":1}}`)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := &canceller{cancel: cancel}
	out, n, err := toolanthropic.ToolResults(ctx, d, msg.Content)
	if d.calls != 1 || n != 2 {
		t.Fatalf("%d calls run, %d results; want 1 run and 2 answered", d.calls, n)
	}
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "toolu_b") {
		t.Errorf("error %v, want the cancellation naming toolu_b", err)
	}
	blocks := jsonOf(t, out)["content"].([]any)
	second := blocks[1].(map[string]any)
	if second["is_error"] != true || !strings.Contains(fmt.Sprint(second["content"]), "was not run") {
		t.Errorf("the call left: %v", second)
	}
}
