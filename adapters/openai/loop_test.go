package openai_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/toolhost/toolhost"
	toolopenai "github.com/toolhost/toolhost/adapters/openai"
	"github.com/toolhost/toolhost/internal/fakeopenai"
	"github.com/toolhost/toolhost/internal/testenv"
	"github.com/toolhost/toolhost/internal/testplugins"
)

// session opens a session on a real sandbox with the built-in plugins.
func session(t *testing.T, ctx context.Context) *toolhost.Session {
	t.Helper()
	testenv.NeedBwrap(t)
	cfg := toolhost.DefaultConfig()
	cfg.DataDir = testplugins.DataDir()
	if err := cfg.Set("store.dir", t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Set("sandbox.run_dir", testenv.RunDir(t)); err != nil {
		t.Fatal(err)
	}
	cfg.Project = "openai"
	th, err := toolhost.New(ctx, cfg, quiet())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { th.Close(context.Background()) })
	sess, err := th.Open(ctx, toolhost.SessionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sess.Close(context.Background()) })
	return sess
}

// dotPNG is a small PNG, base64.
func dotPNG(t *testing.T) string {
	img := image.NewRGBA(image.Rect(0, 0, 3, 2))
	img.Set(1, 1, color.RGBA{R: 255, A: 255})
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(b.Bytes())
}

const finalText = "hello.py now says bye."

// script is one conversation for either API: write a program and run it beside a command
// that makes a PNG; then read the PNG (an image), a missing file (an error) and patch the
// program with apply_patch (Codex's function tool); then answer. Every request is checked
// by the fake: the tools, every call answered in order, the results' texts and images.
func script(t *testing.T) []fakeopenai.Turn {
	args := func(v any) string {
		b, _ := json.Marshal(v)
		return string(b)
	}
	results := func(r *fakeopenai.Request, want ...string) error {
		if len(r.Results) != len(want) {
			return fmt.Errorf("%d results, want %d", len(r.Results), len(want))
		}
		for i, res := range r.Results {
			if !strings.Contains(res.Text, want[i]) {
				return fmt.Errorf("result %s: %q, want it to hold %q", res.CallID, res.Text, want[i])
			}
		}
		return nil
	}
	return []fakeopenai.Turn{
		{
			Check: func(r *fakeopenai.Request) error {
				var names []string
				for _, tl := range r.Tools {
					names = append(names, tl.Name)
				}
				if len(names) != 12 || !strings.Contains(strings.Join(names, " "), "apply_patch") {
					return fmt.Errorf("tools %v, want the 12 built-in ones", names)
				}
				return nil
			},
			Calls: []fakeopenai.Call{
				{ID: "call_1", Name: "write_file", Arguments: args(map[string]string{"path": "hello.py", "content": "print('hello')\n"})},
				{ID: "call_2", Name: "bash", Arguments: args(map[string]string{"command": "python3 hello.py"})},
				{ID: "call_3", Name: "bash", Arguments: args(map[string]string{"command": "echo " + dotPNG(t) + " | base64 -d > dot.png && echo made-$((2*3))"})},
			},
		},
		{
			Check: func(r *fakeopenai.Request) error {
				return results(r, "File written: hello.py", "hello\n", "made-6")
			},
			Calls: []fakeopenai.Call{
				{ID: "call_4", Name: "read_file", Arguments: args(map[string]string{"path": "dot.png"})},
				{ID: "call_5", Name: "read_file", Arguments: args(map[string]string{"path": "missing.txt"})},
				{ID: "call_6", Name: "apply_patch", Arguments: args(map[string]string{"input": "*** Begin Patch\n*** Update File: hello.py\n@@\n-print('hello')\n+print('bye')\n*** End Patch\n"})},
			},
		},
		{
			Check: func(r *fakeopenai.Request) error {
				if err := results(r, "", "Error", "hello.py"); err != nil {
					return err
				}
				if len(r.Results[0].Images) != 1 || len(r.Results[1].Images)+len(r.Results[2].Images) != 0 {
					return fmt.Errorf("images %v %v %v, want one of dot.png's", r.Results[0].Images, r.Results[1].Images, r.Results[2].Images)
				}
				if strings.HasPrefix(r.Results[2].Text, "Error") {
					return fmt.Errorf("apply_patch failed: %s", r.Results[2].Text)
				}
				return nil
			},
			Text: finalText,
		},
	}
}

func client(api *fakeopenai.Server) openai.Client {
	return openai.NewClient(option.WithBaseURL(api.BaseURL()), option.WithAPIKey(fakeopenai.Key), option.WithMaxRetries(0))
}

func checkWorkspace(t *testing.T, ctx context.Context, sess *toolhost.Session) {
	t.Helper()
	got, err := sess.Dispatch(ctx, "read_file", []byte(`{"path": "hello.py"}`))
	if err != nil || got.IsError || !strings.Contains(testenv.ResultText(got), "print('bye')") {
		t.Errorf("hello.py after the loop: %+v, %v", got, err)
	}
}

// The Responses loop of the package doc, run with a real sandbox against the fake
// Responses API, driven by the official client.
func TestAgentLoopResponses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
	defer cancel()
	sess := session(t, ctx)
	api := fakeopenai.New(t, script(t)...)
	c := client(api)
	tools, err := toolopenai.ResponseTools(sess.Tools())
	if err != nil {
		t.Fatal(err)
	}
	params := responses.ResponseNewParams{Model: "gpt-fake", Tools: tools,
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Write hello.py, then make it say bye.")}}
	var final string
	for turn := 0; ; turn++ {
		if turn == 5 {
			t.Fatal("still calling tools after 5 turns")
		}
		resp, err := c.Responses.New(ctx, params)
		if err != nil {
			t.Fatalf("turn %d: %v", turn+1, err)
		}
		outputs, n, err := toolopenai.FunctionCallOutputs(ctx, sess, resp.Output)
		if err != nil {
			t.Fatalf("turn %d: the host could not run a tool: %v", turn+1, err)
		}
		if n == 0 {
			final = resp.OutputText()
			break
		}
		params.PreviousResponseID = openai.String(resp.ID)
		params.Input = responses.ResponseNewParamsInputUnion{OfInputItemList: outputs}
	}
	if final != finalText {
		t.Errorf("final text %q, want %q", final, finalText)
	}
	checkWorkspace(t, ctx, sess)
}

// The same conversation through Chat Completions.
func TestAgentLoopChatCompletions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
	defer cancel()
	sess := session(t, ctx)
	api := fakeopenai.New(t, script(t)...)
	c := client(api)
	tools, err := toolopenai.ChatTools(sess.Tools())
	if err != nil {
		t.Fatal(err)
	}
	msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Write hello.py, then make it say bye.")}
	var final string
	for turn := 0; ; turn++ {
		if turn == 5 {
			t.Fatal("still calling tools after 5 turns")
		}
		comp, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-fake", Messages: msgs, Tools: tools})
		if err != nil {
			t.Fatalf("turn %d: %v", turn+1, err)
		}
		msg := comp.Choices[0].Message
		msgs = append(msgs, msg.ToParam())
		answers, n, err := toolopenai.ToolMessages(ctx, sess, msg)
		if err != nil {
			t.Fatalf("turn %d: the host could not run a tool: %v", turn+1, err)
		}
		if n == 0 {
			final = msg.Content
			break
		}
		msgs = append(msgs, answers...)
	}
	if final != finalText {
		t.Errorf("final text %q, want %q", final, finalText)
	}
	checkWorkspace(t, ctx, sess)
}
