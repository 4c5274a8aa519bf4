package anthropic_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go"
	"github.com/anthropics/anthropic-sdk-go/option"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/abi"
	toolanthropic "github.com/toolhost/toolhost/adapters/anthropic"
	"github.com/toolhost/toolhost/internal/fakemessages"
	"github.com/toolhost/toolhost/internal/testenv"
	"github.com/toolhost/toolhost/internal/testplugins"
)

// With WithBuiltinTools, bash and the three file tools go out as the schema-less built-in
// types, the others as function tools in their order; without it nothing changes.
func TestBuiltinToolsInTheRequest(t *testing.T) {
	tools := builtinTools(t)
	params, err := toolanthropic.Tools(tools, toolanthropic.WithBuiltinTools(20000))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range params {
		m := jsonOf(t, p)
		s := fmt.Sprint(m["name"])
		if typ, ok := m["type"]; ok && typ != "custom" {
			s += "=" + fmt.Sprint(typ)
			if _, ok := m["input_schema"]; ok {
				t.Errorf("built-in tool %v carries a schema", m)
			}
		}
		if mc, ok := m["max_characters"]; ok {
			s += fmt.Sprintf("(%v)", mc)
		}
		got = append(got, s)
	}
	for _, w := range []string{"bash=bash_20250124", "str_replace_based_edit_tool=text_editor_20250728(20000)", "grep", "glob", "apply_patch"} {
		if !strings.Contains(" "+strings.Join(got, " ")+" ", " "+w+" ") {
			t.Errorf("tools %v lack %s", got, w)
		}
	}
	for _, gone := range []string{"read_file", "write_file", "edit_file"} {
		if strings.Contains(" "+strings.Join(got, " ")+" ", " "+gone+" ") {
			t.Errorf("tools %v still offer %s beside the editor", got, gone)
		}
	}
	if len(got) != len(tools)-2 {
		t.Errorf("%d tools for %d, want 2 fewer (read, write and edit are one editor): %v", len(got), len(tools), got)
	}
	// No editor without all three file tools: each command needs its tool.
	var noEdit []abi.Tool
	for _, tl := range tools {
		if tl.Name != "edit_file" {
			noEdit = append(noEdit, tl)
		}
	}
	params, err = toolanthropic.Tools(noEdit, toolanthropic.WithBuiltinTools(0))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range params {
		if m := jsonOf(t, p); m["name"] == toolanthropic.EditorTool || (m["name"] == "read_file" && m["input_schema"] == nil) {
			t.Errorf("an editor without edit_file: %v", m)
		}
	}
}

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
	cfg.Project = "builtin"
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

// call runs one tool_use block through ToolResults and returns its result's text and
// is_error.
func call(t *testing.T, ctx context.Context, d toolanthropic.Dispatcher, name, input string, opts ...toolanthropic.Option) (string, bool) {
	t.Helper()
	msg := message(t, `{"id":"msg","type":"message","role":"assistant","model":"m","stop_reason":"tool_use",
	"content":[{"type":"tool_use","id":"toolu_x","name":"`+name+`","input":`+input+`}],
	"usage":{"input_tokens":1,"output_tokens":1}}`)
	out, n, err := toolanthropic.ToolResults(ctx, d, msg.Content, opts...)
	if err != nil || n != 1 {
		t.Fatalf("%s %s: %d results, %v", name, input, n, err)
	}
	b := jsonOf(t, out)["content"].([]any)[0].(map[string]any)
	var text strings.Builder
	if c, ok := b["content"].([]any); ok {
		for _, x := range c {
			if m := x.(map[string]any); m["type"] == "text" {
				text.WriteString(m["text"].(string))
			}
		}
	}
	return text.String(), b["is_error"] == true
}

// sameBytes says whether the workspace file path holds exactly want (bytes, line endings
// and the last newline included), asked of the sandbox's own cmp.
func sameBytes(t *testing.T, ctx context.Context, sess *toolhost.Session, path, want string) {
	t.Helper()
	in, _ := json.Marshal(map[string]string{"command": fmt.Sprintf("printf %%s %s | cmp - %s && echo SAME-$((20+6))", shellQuote(want), shellQuote(path))})
	res, err := sess.Dispatch(ctx, "bash", in)
	if err != nil {
		t.Fatal(err)
	}
	if got := testenv.ResultText(res); !strings.Contains(got, "SAME-26") {
		raw, _ := json.Marshal(map[string]string{"command": "od -c " + shellQuote(path)})
		od, _ := sess.Dispatch(ctx, "bash", raw)
		t.Errorf("%s is not %q:\n%s\n%s", path, want, got, testenv.ResultText(od))
	}
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// The editor's commands run as the file tools on a real sandbox: what the model sees and
// what the files hold after each, its errors as is_error results it can act on, and the
// workspace's bounds kept whatever path it names.
func TestBuiltinEditorOnASandbox(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
	defer cancel()
	sess := session(t, ctx)
	opt := toolanthropic.WithBuiltinTools(0)
	ed := func(input string) (string, bool) {
		t.Helper()
		return call(t, ctx, sess, toolanthropic.EditorTool, input, opt)
	}
	mustOK := func(input string) string {
		t.Helper()
		out, isErr := ed(input)
		if isErr {
			t.Fatalf("%s: is_error: %s", input, out)
		}
		return out
	}

	mustOK(`{"command":"create","path":"notes/a.txt","file_text":"one\ntwo\nthree\n"}`)
	if out := mustOK(`{"command":"view","path":"notes/a.txt"}`); out != "     1\tone\n     2\ttwo\n     3\tthree\n" {
		t.Errorf("view: %q", out)
	}
	if out := mustOK(`{"command":"view","path":"/home/user/notes/a.txt","view_range":[2,2]}`); !strings.HasPrefix(out, "     2\ttwo\n") || strings.Contains(out, "one") || strings.Contains(out, "three") {
		t.Errorf("view_range [2,2]: %q", out)
	}
	if out := mustOK(`{"command":"view","path":"notes/a.txt","view_range":[2,-1]}`); !strings.Contains(out, "     2\ttwo\n     3\tthree\n") || strings.Contains(out, "one") {
		t.Errorf("view_range [2,-1]: %q", out)
	}
	for _, bad := range []string{`[0,2]`, `[3,1]`, `[1]`} {
		if out, isErr := ed(`{"command":"view","path":"notes/a.txt","view_range":` + bad + `}`); !isErr || !strings.Contains(out, "view_range") {
			t.Errorf("view_range %s: %v %q", bad, isErr, out)
		}
	}
	if out, isErr := ed(`{"command":"view","path":"notes/a.txt","view_range":[9,-1]}`); !isErr || !strings.Contains(out, "3 lines") {
		t.Errorf("view past the end: %v %q", isErr, out)
	}

	mustOK(`{"command":"str_replace","path":"notes/a.txt","old_str":"two","new_str":"TWO"}`)
	sameBytes(t, ctx, sess, "notes/a.txt", "one\nTWO\nthree\n")
	out, isErr := ed(`{"command":"str_replace","path":"notes/a.txt","old_str":"four","new_str":"4"}`)
	if !isErr || !strings.Contains(out, "old_str") || strings.Contains(out, "old_string") {
		t.Errorf("str_replace of a missing text: %v %q (want is_error in the editor's words)", isErr, out)
	}
	mustOK(`{"command":"create","path":"notes/d.txt","file_text":"x\nx\n"}`)
	if out, isErr := ed(`{"command":"str_replace","path":"notes/d.txt","old_str":"x","new_str":"y"}`); !isErr || !strings.Contains(out, "2 times") || strings.Contains(out, "replace_all") {
		t.Errorf("str_replace of a text found twice: %v %q", isErr, out)
	}

	// insert: at the top, in the middle, at the end, the text as lines of their own.
	mustOK(`{"command":"insert","path":"notes/a.txt","insert_line":0,"insert_text":"zero\n"}`)
	mustOK(`{"command":"insert","path":"notes/a.txt","insert_line":2,"insert_text":"one and a half"}`)
	mustOK(`{"command":"insert","path":"notes/a.txt","insert_line":5,"new_str":"four\nfive"}`)
	sameBytes(t, ctx, sess, "notes/a.txt", "zero\none\none and a half\nTWO\nthree\nfour\nfive\n")
	// Between equal lines, in a file without a last newline, and in one with CRLF.
	mustOK(`{"command":"create","path":"notes/same.txt","file_text":"a\na\na"}`)
	mustOK(`{"command":"insert","path":"notes/same.txt","insert_line":2,"insert_text":"X"}`)
	mustOK(`{"command":"insert","path":"notes/same.txt","insert_line":4,"insert_text":"Z"}`)
	sameBytes(t, ctx, sess, "notes/same.txt", "a\na\nX\na\nZ")
	mustOK(`{"command":"create","path":"notes/crlf.txt","file_text":"a\r\nb\r\n"}`)
	mustOK(`{"command":"insert","path":"notes/crlf.txt","insert_line":1,"insert_text":"X"}`)
	sameBytes(t, ctx, sess, "notes/crlf.txt", "a\r\nX\r\nb\r\n")
	mustOK(`{"command":"create","path":"notes/empty.txt","file_text":""}`)
	mustOK(`{"command":"insert","path":"notes/empty.txt","insert_line":0,"insert_text":"first\n"}`)
	sameBytes(t, ctx, sess, "notes/empty.txt", "first\n")
	for _, bad := range []string{`"insert_line":9,"insert_text":"x"`, `"insert_line":-1,"insert_text":"x"`, `"insert_text":"x"`, `"insert_line":1`} {
		if out, isErr := ed(`{"command":"insert","path":"notes/a.txt",` + bad + `}`); !isErr || !strings.Contains(out, "insert") {
			t.Errorf("insert with %s: %v %q", bad, isErr, out)
		}
	}
	sameBytes(t, ctx, sess, "notes/a.txt", "zero\none\none and a half\nTWO\nthree\nfour\nfive\n")

	// A directory is listed two levels deep, hidden entries left out.
	mustOK(`{"command":"create","path":"notes/sub/deep/x.txt","file_text":"x"}`)
	mustOK(`{"command":"create","path":"notes/sub/y.txt","file_text":"y"}`)
	mustOK(`{"command":"create","path":"notes/.hidden","file_text":"h"}`)
	out = mustOK(`{"command":"view","path":"notes"}`)
	for _, want := range []string{"\na.txt\n", "\nsub/\n", "\nsub/y.txt\n", "\ncrlf.txt\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("directory view lacks %q:\n%s", want, out)
		}
	}
	for _, not := range []string{".hidden", "deep/x.txt"} {
		if strings.Contains(out, not) {
			t.Errorf("directory view shows %q:\n%s", not, out)
		}
	}

	// What text_editor_20250728 has not, and what is not a command.
	for _, in := range []string{`{"command":"undo_edit","path":"notes/a.txt"}`, `{"command":"delete","path":"notes/a.txt"}`,
		`{"path":"notes/a.txt"}`, `{"command":"view"}`, `{"command":"create","path":"notes/n.txt"}`, `[1,2]`} {
		if out, isErr := ed(in); !isErr || !strings.HasPrefix(out, "Error: ") {
			t.Errorf("%s: %v %q, want an is_error saying what to do", in, isErr, out)
		}
	}

	// The guard: a file changed behind the model's back is not edited unseen, and the
	// advice names the editor's commands, never tools the model does not have.
	res, err := sess.Dispatch(ctx, "bash", json.RawMessage(`{"command":"echo changed > notes/a.txt"}`))
	if err != nil || res.IsError {
		t.Fatalf("bash: %v %v", res, err)
	}
	out, isErr = ed(`{"command":"str_replace","path":"notes/a.txt","old_str":"changed","new_str":"seen"}`)
	if !isErr || !strings.Contains(out, "view it again") || strings.Contains(out, "read_file") {
		t.Errorf("str_replace of a file changed unseen: %v %q", isErr, out)
	}
	mustOK(`{"command":"view","path":"notes/a.txt"}`)
	mustOK(`{"command":"str_replace","path":"notes/a.txt","old_str":"changed","new_str":"seen"}`)
	sameBytes(t, ctx, sess, "notes/a.txt", "seen\n")

	// Escapes: every path the editor names is the file tools' to refuse.
	if _, err := sess.Dispatch(ctx, "bash", json.RawMessage(`{"command":"ln -s /etc/passwd notes/pw && ln -s /etc notes/etc"}`)); err != nil {
		t.Fatal(err)
	}
	for _, in := range []string{
		`{"command":"view","path":"/etc/passwd"}`,
		`{"command":"view","path":"../../etc/passwd"}`,
		`{"command":"view","path":"notes/pw"}`,
		`{"command":"view","path":"/etc"}`,
		`{"command":"view","path":"notes/etc"}`,
		`{"command":"view","path":"notes/etc/passwd"}`,
		`{"command":"create","path":"/etc/toolhost-escape","file_text":"x"}`,
		`{"command":"create","path":"notes/etc/toolhost-escape","file_text":"x"}`,
		`{"command":"insert","path":"notes/pw","insert_line":0,"insert_text":"x"}`,
		`{"command":"str_replace","path":"notes/pw","old_str":"root","new_str":"toor"}`,
	} {
		out, isErr := ed(in)
		if !isErr || strings.Contains(out, "root:") {
			t.Errorf("%s: is_error %v, %q; want a refusal", in, isErr, out)
		}
	}
}

// bash_20250124's restart: toolhost's bash keeps only its directory, so a restart takes
// it back to the workspace root; a command runs as toolhost's bash.
func TestBuiltinBashRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
	defer cancel()
	sess := session(t, ctx)
	if out, isErr := call(t, ctx, sess, "bash", `{"command":"mkdir -p sub && cd sub && pwd"}`); isErr || !strings.Contains(out, "/home/user/sub") {
		t.Fatalf("cd: %v %q", isErr, out)
	}
	if out, isErr := call(t, ctx, sess, "bash", `{"command":"pwd"}`); isErr || !strings.Contains(out, "/home/user/sub") {
		t.Fatalf("the directory did not carry over: %v %q", isErr, out)
	}
	if out, isErr := call(t, ctx, sess, "bash", `{"restart":true}`); isErr || out != "tool has been restarted." {
		t.Errorf("restart: %v %q", isErr, out)
	}
	if out, isErr := call(t, ctx, sess, "bash", `{"command":"pwd"}`); isErr || !strings.Contains(out, "/home/user\n") {
		t.Errorf("after the restart: %v %q", isErr, out)
	}
	if out, isErr := call(t, ctx, sess, "bash", `{"restart":false}`); !isErr || !strings.Contains(out, "command") {
		t.Errorf("restart false without a command: %v %q", isErr, out)
	}
}

// The built-in tools through the official SDK and a fake Messages API: the request offers
// them without schemas, and the model's calls of them come back as tool_result blocks
// holding what the files hold.
func TestBuiltinToolsAgainstFakeMessagesAPI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
	defer cancel()
	sess := session(t, ctx)
	use := func(id, name, input string) fakemessages.Block {
		return fakemessages.Block{Type: "tool_use", ID: id, Name: name, Input: json.RawMessage(input)}
	}
	result := func(r *fakemessages.Request, want ...string) error {
		res, err := r.Results()
		if err != nil {
			return err
		}
		if len(res) != len(want) {
			return fmt.Errorf("%d results, want %d", len(res), len(want))
		}
		for i, b := range res {
			if b.IsErr() || !strings.Contains(b.TextOf(), want[i]) {
				return fmt.Errorf("result %s: is_error %v, %q; want %q", b.ToolUseID, b.IsErr(), b.TextOf(), want[i])
			}
		}
		return nil
	}
	api := fakemessages.New(t,
		fakemessages.Turn{
			Check: func(r *fakemessages.Request) error {
				found := map[string]fakemessages.Tool{}
				for _, tl := range r.Tools {
					found[tl.Name] = tl
				}
				if b := found["bash"]; b.Type != "bash_20250124" || b.InputSchema != nil {
					return fmt.Errorf("bash offered as %+v", b)
				}
				e := found[toolanthropic.EditorTool]
				if e.Type != "text_editor_20250728" || e.InputSchema != nil || e.MaxCharacters == nil || *e.MaxCharacters != 40 {
					return fmt.Errorf("the editor offered as %+v", e)
				}
				if _, ok := found["read_file"]; ok {
					return fmt.Errorf("read_file offered beside the editor")
				}
				if g := found["grep"]; g.InputSchema == nil {
					return fmt.Errorf("grep offered without its schema")
				}
				return nil
			},
			Content: []fakemessages.Block{
				use("toolu_1", toolanthropic.EditorTool, `{"command":"create","path":"hello.py","file_text":"print('hello')\n"}`),
				use("toolu_2", "bash", `{"command":"python3 hello.py"}`),
			},
			StopReason: "tool_use",
		},
		fakemessages.Turn{
			Check: func(r *fakemessages.Request) error { return result(r, "hello.py", "hello") },
			Content: []fakemessages.Block{
				use("toolu_3", toolanthropic.EditorTool, `{"command":"str_replace","path":"hello.py","old_str":"hello","new_str":"bye"}`),
				use("toolu_4", toolanthropic.EditorTool, `{"command":"view","path":"hello.py"}`),
			},
			StopReason: "tool_use",
		},
		fakemessages.Turn{
			Check:      func(r *fakemessages.Request) error { return result(r, "", "     1\tprint('bye')\n") },
			Content:    []fakemessages.Block{{Type: "text", Text: "done"}},
			StopReason: "end_turn",
		},
	)
	client := anthropic.NewClient(option.WithoutEnvironmentDefaults(), option.WithBaseURL(api.URL),
		option.WithAPIKey(fakemessages.Key), option.WithMaxRetries(0))
	opts := []toolanthropic.Option{toolanthropic.WithBuiltinTools(40)}
	tools, err := toolanthropic.Tools(sess.Tools(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	msgs := []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Say hello in Python."))}
	for turn := 0; turn < 5; turn++ {
		msg, err := client.Messages.New(ctx, anthropic.MessageNewParams{Model: "claude-fake", MaxTokens: 1024, Messages: msgs, Tools: tools})
		if err != nil {
			t.Fatalf("turn %d: %v", turn+1, err)
		}
		msgs = append(msgs, msg.ToParam())
		if msg.StopReason != anthropic.StopReasonToolUse {
			break
		}
		results, _, err := toolanthropic.ToolResults(ctx, sess, msg.Content, opts...)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, results)
	}
	if p := api.Played(); p != 3 {
		t.Errorf("%d requests, want 3", p)
	}
}

// max_characters cuts view's text and says so.
func TestBuiltinViewMaxCharacters(t *testing.T) {
	d := &viewer{text: strings.Repeat("     1\tabcdefghij\n", 3)}
	out, isErr := call(t, context.Background(), d, toolanthropic.EditorTool, `{"command":"view","path":"f"}`, toolanthropic.WithBuiltinTools(20))
	if isErr || !strings.HasPrefix(out, "     1\tabcdefghij\n  ") || !strings.Contains(out, "max_characters (20") || len(out) > 200 {
		t.Errorf("cut view: %v %q", isErr, out)
	}
	if out, _ := call(t, context.Background(), d, toolanthropic.EditorTool, `{"command":"view","path":"f"}`, toolanthropic.WithBuiltinTools(0)); out != d.text {
		t.Errorf("uncut view: %q", out)
	}
	if d.calls[0] != `read_file {"path":"f"}` {
		t.Errorf("calls %q", d.calls)
	}
}

type viewer struct {
	text  string
	calls []string
}

func (v *viewer) Dispatch(ctx context.Context, tool string, input json.RawMessage) (abi.Result, error) {
	v.calls = append(v.calls, tool+" "+string(input))
	return abi.Text(v.text), nil
}
