//go:build !wasip1

package pdk

import (
	"encoding/json"
	"errors"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/framedinput"
)

// fakeHost answers with canned replies and records requests.
type fakeHost struct {
	files map[string][]byte
	execs []abi.ExecRequest
	lists []abi.ListRequest
	logs  []string
}

func (h *fakeHost) Exec(r abi.ExecRequest) (abi.ExecResult, error) {
	h.execs = append(h.execs, r)
	return abi.ExecResult{ExitCode: 3, Stdout: strings.Repeat("o\"\\\n", 5000), Stderr: "e\u2028\u00e9\U0001F600\xff\n", StdoutCut: 9, TimedOut: true, DurationMS: 12, ID: "i", PID: 7, LogPath: "/tmp/l"}, nil
}

func (h *fakeHost) ReadFile(p string) ([]byte, error) {
	if b, ok := h.files[p]; ok {
		return b, nil
	}
	return nil, &Error{Op: "read", Status: abi.StatusNotFound, Msg: "read " + p + ": no such file or directory"}
}

func (h *fakeHost) WriteFile(p string, data []byte) error {
	if p == "dir" {
		return errors.New("plain error")
	}
	h.files[p] = data
	return nil
}

func (h *fakeHost) Stat(p string) (abi.FileInfo, error) {
	return abi.FileInfo{Path: p, Type: abi.TypeFile, Size: 42, Mode: 0o644, ModTime: 1700000000000}, nil
}

func (h *fakeHost) List(r abi.ListRequest) (abi.ListResult, error) {
	h.lists = append(h.lists, r)
	var res abi.ListResult
	for i := range 3000 { // about 270 KB of JSON: parked and taken
		res.Entries = append(res.Entries, abi.FileInfo{Path: "d/f" + string(rune('a'+i%26)), Type: abi.TypeFile, Size: int64(i)})
	}
	res.Truncated = true
	return res, nil
}

func (h *fakeHost) Log(level int32, msg string) { h.logs = append(h.logs, msg) }

func withHost(t *testing.T) *fakeHost {
	h := &fakeHost{files: map[string][]byte{}}
	old := SetHost(h)
	t.Cleanup(func() { SetHost(old); scratch = nil })
	return h
}

func TestHostFunctions(t *testing.T) {
	h := withHost(t)
	big := []byte(strings.Repeat("x", 100_000))
	h.files["small"] = []byte("hello")
	h.files["mid"] = []byte(strings.Repeat("m", 10_000))
	h.files["big"] = big
	h.files["empty"] = []byte{}

	for name, want := range h.files {
		got, err := ReadFile(name)
		if err != nil || string(got) != string(want) {
			t.Errorf("ReadFile(%s): %d bytes, %v", name, len(got), err)
		}
		s, err := ReadFileString(name)
		if err != nil || s != string(want) {
			t.Errorf("ReadFileString(%s): %d bytes, %v", name, len(s), err)
		}
	}
	// A returned string must not alias the scratch buffer either.
	small, _ := ReadFileString("small")
	_, _ = ReadFile("mid")
	if small != "hello" {
		t.Errorf("ReadFileString result was overwritten: %q", small)
	}
	if len(scratch) != 16<<10 {
		t.Errorf("the scratch buffer grew to %d, want 16 KiB for a 10,000-byte reply", len(scratch))
	}
	// A returned slice must not alias the scratch buffer.
	a, _ := ReadFile("small")
	_, _ = ReadFile("mid")
	if string(a) != "hello" {
		t.Errorf("ReadFile result was overwritten: %q", a)
	}

	_, err := ReadFile("missing")
	var e *Error
	if !errors.As(err, &e) || e.Status != abi.StatusNotFound || e.Msg != "read missing: no such file or directory" {
		t.Fatalf("missing: %#v", err)
	}
	if !errors.Is(err, ErrNotFound) || !errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrIsDir) || errors.Is(err, fs.ErrExist) {
		t.Errorf("errors.Is on %v", err)
	}
	if err.Error() != "read missing: no such file or directory" {
		t.Errorf("message %q", err)
	}

	if err := WriteFile("new", []byte("data")); err != nil || string(h.files["new"]) != "data" {
		t.Errorf("WriteFile: %v", err)
	}
	if err := WriteFile("dir", nil); !errors.Is(err, ErrIO) || err.Error() != "plain error" {
		t.Errorf("WriteFile error: %#v", err)
	}

	res, err := Exec(abi.ExecRequest{Argv: []string{"bash", "-c", "echo \"hi\"\n"}, Cwd: "src", Env: map[string]string{"B": "2", "A": "1"}, TimeoutMS: 5000, Background: true})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := h.Exec(abi.ExecRequest{})
	want.StdoutLen, want.StderrLen = len(want.Stdout), len(want.Stderr)
	if res != want {
		t.Errorf("Exec result differs: got stdout %d bytes, stderr %q, %+v", len(res.Stdout), res.Stderr, res.StdoutCut)
	}
	if r := h.execs[0]; r.Argv[2] != "echo \"hi\"\n" || r.Cwd != "src" || r.Env["A"] != "1" || r.TimeoutMS != 5000 || !r.Background {
		t.Errorf("Exec request arrived as %+v", r)
	}

	// The whole-JSON exec reply of earlier hosts still decodes.
	if r, ok := decodeExecResult([]byte(`{"exit_code":2,"stdout":"a\nb","stderr":"c","timed_out":true}`)); !ok ||
		r.ExitCode != 2 || r.Stdout != "a\nb" || r.Stderr != "c" || r.StdoutLen != 3 || !r.TimedOut {
		t.Errorf("legacy exec reply: %+v %v", r, ok)
	}
	for _, bad := range []string{"{\"stdout_len\":5}\nabc", "{\"stdout_len\":-1,\"stderr_len\":4}\nabc", "not json\n"} {
		if _, ok := decodeExecResult([]byte(bad)); ok {
			t.Errorf("accepted %q", bad)
		}
	}

	h.files["lines.txt"] = []byte("one\r\ntwo\nthree")
	hdr, text, err := ReadText(abi.ReadTextRequest{Path: "lines.txt", Offset: 2, Limit: 5, Number: true})
	if err != nil || text != "     2\ttwo\n     3\tthree\n" || hdr != (abi.ReadTextHeader{Size: 14, TotalLines: 3, First: 2, Last: 3}) {
		t.Errorf("ReadText: %+v %q %v", hdr, text, err)
	}
	if _, _, err := ReadText(abi.ReadTextRequest{Path: "missing"}); !errors.Is(err, ErrNotFound) {
		t.Errorf("ReadText missing: %v", err)
	}

	fi, err := Stat("a/b")
	if err != nil || fi != (abi.FileInfo{Path: "a/b", Type: "file", Size: 42, Mode: 0o644, ModTime: 1700000000000}) {
		t.Errorf("Stat: %+v %v", fi, err)
	}

	lr, err := List(abi.ListRequest{Path: ".", Recursive: true, Skip: []string{".git"}, Limit: 10})
	if err != nil || len(lr.Entries) != 3000 || !lr.Truncated || lr.Entries[2999].Size != 2999 || lr.Entries[1].Path != "d/fb" {
		t.Errorf("List: %d entries, %v", len(lr.Entries), err)
	}
	if r := h.lists[0]; r.Path != "." || !r.Recursive || r.Skip[0] != ".git" || r.Limit != 10 {
		t.Errorf("List request arrived as %+v", r)
	}

	Log(abi.LevelInfo, "hello log")
	if len(h.logs) != 1 || h.logs[0] != "hello log" {
		t.Errorf("Log: %q", h.logs)
	}

	t.Setenv("TOOLHOST_X", "v")
	if Config("TOOLHOST_X") != "v" || Config("TOOLHOST_NOPE") != "" {
		t.Errorf("Config")
	}
}

func TestDecodeListResult(t *testing.T) {
	r, ok := decodeListResult([]byte(` { "truncated" : true , "x": [1, {"y": null}], "entries" : [ {"path":"a\"b\u00e9","type":"file","size":1,"mode":420,"mtime_unix_ms":7,"new":{"z":[]}},
		{"type":"symlink","path":"l"}, {"\u0074ype":"dir","path":"d"} ] } `))
	want := []abi.FileInfo{{Path: "a\"bé", Type: "file", Size: 1, Mode: 420, ModTime: 7}, {Path: "l", Type: "symlink"}, {Path: "d", Type: "dir"}}
	if !ok || !r.Truncated || len(r.Entries) != 3 || r.Entries[0] != want[0] || r.Entries[1] != want[1] || r.Entries[2] != want[2] {
		t.Errorf("got %+v %v", r, ok)
	}
	// The fast path (the host's exact shape) and its fallbacks agree with encoding/json.
	for _, e := range []string{
		`{"path":"a/b c","type":"file","size":12,"mode":420,"mtime_unix_ms":1763700000000}`,
		`{"path":"x","type":"symlink","size":0,"mode":511,"mtime_unix_ms":-5}`,
		`{"path":"e\u00e9","type":"dir","size":4096,"mode":493,"mtime_unix_ms":1}`,
		`{"path":"x","type":"weird","size":1,"mode":2,"mtime_unix_ms":3}`,
		`{"path":"x","type":"file","size":01,"mode":2,"mtime_unix_ms":3}`,
		`{"type":"file","path":"x","size":1,"mode":2,"mtime_unix_ms":3,"extra":true}`,
	} {
		var want abi.FileInfo
		werr := json.Unmarshal([]byte(e), &want)
		got, ok := decodeFileInfo([]byte(e))
		if (werr == nil) != ok || (ok && got != want) {
			t.Errorf("%s: got %+v %v, encoding/json %+v %v", e, got, ok, want, werr)
		}
	}
	// The generic reader is lenient where encoding/json is strict: 1e3 is the integer 1000.
	if got, ok := decodeFileInfo([]byte(`{"path":"x","type":"file","size":1e3,"mode":2,"mtime_unix_ms":3}`)); !ok || got.Size != 1000 {
		t.Errorf("1e3: %+v %v", got, ok)
	}
	for _, s := range []string{`{"entries":null}`, `{}`, `{"entries":[]}`} {
		if r, ok := decodeListResult([]byte(s)); !ok || len(r.Entries) != 0 {
			t.Errorf("%s: %+v %v", s, r, ok)
		}
	}
	for _, s := range []string{`{"entries":[{"path":1}]`, `{"entries":[{"path":"a"},]}`, `{"entries":{}}`, `[]`, `{"entries":[]} x`, `{"entries":[{"size":1.}]}`} {
		if _, ok := decodeListResult([]byte(s)); ok {
			t.Errorf("%s: accepted", s)
		}
	}
}

func TestNoHost(t *testing.T) {
	old := SetHost(nil)
	defer SetHost(old)
	if _, err := ReadFile("x"); !errors.Is(err, ErrIO) || !strings.Contains(err.Error(), "no Host set") {
		t.Errorf("got %v", err)
	}
}

func TestHandle(t *testing.T) {
	saved := tools
	savedName := pluginName
	t.Cleanup(func() { tools, pluginName, manifest = saved, savedName, nil })
	tools, pluginName, manifest = nil, "", nil
	Plugin("demo", "0.1.0")
	Register(Tool{Name: "echo", Description: "Echoes \"path\".", Schema: `{"type":"object","properties":{"path":{"type":"string"}}}`,
		Run: func(in Input) abi.Result { return abi.Text(in.String("path") + "|" + string(in.JSON())) }})
	Register(Tool{Name: "boom", Schema: `{"type":"object"}`, Run: func(in Input) abi.Result {
		var m map[string]int
		//lint:ignore SA5000 the panic is the point
		m["x"] = 1 // nil map write: a runtime error panic
		return abi.Text("unreachable")
	}})
	Register(Tool{Name: "boom2", Schema: `{"type":"object"}`, Run: func(in Input) abi.Result { panic(42) }})

	var m abi.Manifest
	if err := json.Unmarshal(Manifest(), &m); err != nil {
		t.Fatalf("manifest %s: %v", Manifest(), err)
	}
	if m.ABIVersion != 1 || m.Name != "demo" || m.Version != "0.1.0" || len(m.Tools) != 3 || m.Tools[0].Description != `Echoes "path".` {
		t.Errorf("manifest %+v", m)
	}

	cases := []struct {
		req, text string
		isErr     bool
	}{
		{`{"tool":"echo","input":{"path":"a\"b"}}`, `a"b|{"path":"a\"b"}`, false},
		{` { "input" : { "path" : "x" } , "tool" : "echo" } `, `x|{ "path" : "x" }`, false},
		{`{"tool":"echo"}`, `|{}`, false},
		{`{"tool":"echo","input":null}`, `|{}`, false},
		{`{"tool":"nope","input":{}}`, `Error: plugin demo has no tool "nope"`, true},
		{`{"tool":"echo","input":[1]}`, `Error: echo: input is not a valid JSON object`, true},
		{`not json`, `Error: the request is not {"tool": NAME, "input": {...}}`, true},
		{`{"tool":1}`, `Error: the request is not {"tool": NAME, "input": {...}}`, true},
		{`{"tool":"boom","input":{}}`, `panic in boom: assignment to entry in nil map`, true},
		{`{"tool":"boom2","input":{}}`, `panic in boom2: 42`, true},
	}
	for _, c := range cases {
		out := Handle([]byte(c.req))
		r, err := decodeFramed(out)
		if err != nil {
			t.Fatalf("%s: result %q: %v", c.req, out, err)
		}
		if len(r.Content) != 1 || r.Content[0].Text != c.text || r.IsError != c.isErr {
			t.Errorf("%s: got %q", c.req, out)
		}
	}

	for _, bad := range []func(){
		func() {
			Register(Tool{Name: "echo", Schema: `{}`, Run: func(Input) abi.Result { return abi.Result{} }})
		},
		func() {
			Register(Tool{Name: "bad name", Schema: `{}`, Run: func(Input) abi.Result { return abi.Result{} }})
		},
		func() {
			Register(Tool{Name: "noschema", Schema: `{"type":`, Run: func(Input) abi.Result { return abi.Result{} }})
		},
		func() { Register(Tool{Name: "norun", Schema: `{}`}) },
		func() { Plugin("again", "1") },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("no panic")
				}
			}()
			bad()
		}()
	}
}

// TestHandleFramed: the framed input (what the host sends) gives a tool the same answers
// as the JSON request, with strings decoded and nothing scanned.
func TestHandleFramed(t *testing.T) {
	saved := tools
	savedName := pluginName
	t.Cleanup(func() { tools, pluginName, manifest = saved, savedName, nil })
	tools, pluginName, manifest = nil, "", nil
	Plugin("demo", "0.1.0")
	Register(Tool{Name: "show", Schema: `{"type":"object"}`, Run: func(in Input) abi.Result {
		s := in.String("s") + "|" + string(in.Bytes("s")) + "|" + string(in.Raw("s")) + "|" +
			strconv.Itoa(in.Int("n", -1)) + "|" + strconv.FormatBool(in.Bool("b")) + "|" +
			strings.Join(in.Strings("l"), ",") + "|" + strconv.FormatBool(in.Has("z")) + "|" +
			strconv.Itoa(in.Int("s", -1)) + "|" + in.String("n") + "|" + string(in.JSON())
		var v struct {
			S string `json:"s"`
			N int    `json:"n"`
		}
		if err := json.Unmarshal(in.JSON(), &v); err != nil {
			return abi.ErrorText(err.Error())
		}
		return abi.Text(s + "|" + v.S + strconv.Itoa(v.N))
	}})

	var m abi.Manifest
	if err := json.Unmarshal(Manifest(), &m); err != nil || !slices.Contains(m.InputForms, abi.InputFramed1) {
		t.Fatalf("manifest %s does not offer the framed input (%v)", Manifest(), err)
	}
	input := `{"s":"a\"b\n\u00e9","n":7,"b":true,"l":["x","y"],"z":null}`
	want := "a\"b\né|a\"b\né|\"a\\\"b\\né\"|7|true|x,y|false|-1||" +
		`{"b":true,"l":["x","y"],"n":7,"s":"a\"b\né","z":null}|a"b` + "\n" + `é7`
	var obj map[string]any
	if err := json.Unmarshal([]byte(input), &obj); err != nil {
		t.Fatal(err)
	}
	req, err := framedinput.Encode("show", obj)
	if err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string][]byte{"framed": req, "json": []byte(`{"tool":"show","input":` + input + `}`)} {
		res, err := decodeFramed(Handle(r))
		if err != nil || len(res.Content) != 1 || res.IsError {
			t.Fatalf("%s: %+v, %v", name, res, err)
		}
		got := res.Content[0].Text
		if name == "json" { // Raw and JSON keep the input as it was sent
			want := strings.Replace(want, `{"b":true,"l":["x","y"],"n":7,"s":"a\"b\né","z":null}`, input, 1)
			want = strings.Replace(want, `"a\"b\né"`, `"a\"b\n\u00e9"`, 1)
			if got != want {
				t.Errorf("%s:\n got %q\nwant %q", name, got, want)
			}
			continue
		}
		if got != want {
			t.Errorf("%s:\n got %q\nwant %q", name, got, want)
		}
	}

	for name, c := range map[string]struct {
		req  []byte
		text string
	}{
		"unknown tool": {abi.AppendFramedInput(nil, "nope", nil), `Error: plugin demo has no tool "nope"`},
		"damaged":      {append([]byte(abi.FramedInputMagic), 200), "Error: framed input: tool name cut short"},
	} {
		res, err := decodeFramed(Handle(c.req))
		if err != nil || !res.IsError || len(res.Content) != 1 || res.Content[0].Text != c.text {
			t.Errorf("%s: %+v, %v", name, res, err)
		}
	}
}

// The fast header readers read what the host's encoding/json writes, the same as the
// generic reader, and step aside for anything else.
func TestFastHeaders(t *testing.T) {
	execs := []abi.ExecResult{
		{ExitCode: 0, StdoutLen: 3, DurationMS: 12},
		{ExitCode: -1, StdoutLen: 10, StderrLen: 2, StdoutCut: 99, StderrCut: 7, TimedOut: true, OOMKilled: true, DurationMS: 600000},
		{ID: "p-1", PID: 4242, LogPath: "/tmp/p-1.log"},
		{ExitCode: 127, StderrLen: 5, TimedOut: true},
	}
	for _, want := range execs {
		hb, err := json.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := fastExecHeader(hb)
		slow, sok := slowExecHeader(hb)
		if !ok || !sok || got != slow || got != want {
			t.Errorf("%s:\nfast %+v (%v)\nslow %+v (%v)", hb, got, ok, slow, sok)
		}
	}
	headers := []abi.ReadTextHeader{
		{Size: 5120, TotalLines: 120, First: 1, Last: 120},
		{Size: 1 << 40, TotalLines: 9, First: 3, Last: 4, Binary: true, CutLines: 2, Full: true},
		{},
	}
	for _, want := range headers {
		hb, err := json.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := fastReadTextHeader(hb)
		if !ok || got != want {
			t.Errorf("%s: fast %+v (%v)", hb, got, ok)
		}
		full, _, ok := decodeReadText(append(hb, '\n'))
		if !ok || full != want {
			t.Errorf("%s: decodeReadText %+v (%v)", hb, full, ok)
		}
	}
	// Other shapes: whitespace, another order, escapes, a fraction; the fast readers
	// refuse them and the generic one reads them.
	for _, hb := range []string{
		`{ "exit_code": 1, "stdout_len": 0, "stderr_len": 0, "duration_ms": 1 }`,
		`{"stdout_len":0,"exit_code":1,"stderr_len":0,"duration_ms":1}`,
		`{"exit_code":1,"stdout_len":0,"stderr_len":0,"duration_ms":1,"id":"a\"b"}`,
		`{"exit_code":1.0,"stdout_len":0,"stderr_len":0,"duration_ms":1}`,
		`{"exit_code":1,"stdout_len":0,"stderr_len":0,"timed_out":false,"duration_ms":1}`,
		`{"exit_code":1,"stdout_len":0,"stderr_len":0,"duration_ms":1}x`,
	} {
		if _, ok := fastExecHeader([]byte(hb)); ok {
			t.Errorf("fast reader took %s", hb)
		}
		if r, ok := decodeExecResult([]byte(hb + "\n")); (!ok || r.ExitCode != 1) != strings.HasSuffix(hb, "x") {
			t.Errorf("%s: %+v %v", hb, r, ok)
		}
	}
	if _, ok := fastReadTextHeader([]byte(`{"size":1,"total_lines":1,"first":1,"last":1,"binary":0,"cut_lines":0,"full":false}`)); ok {
		t.Error("fast reader took a number for a boolean")
	}
}
