package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/memsandbox"
	"github.com/toolhost/toolhost/internal/reexec"
	"github.com/toolhost/toolhost/internal/store/dir"
	"github.com/toolhost/toolhost/internal/testenv"
	"github.com/toolhost/toolhost/internal/testplugins"
)

var allGrants = []abi.Capability{abi.CapLog, abi.CapSandboxExec, abi.CapSandboxFiles, abi.CapStore}

// dataDir is shared by the tests of this package so the compilation cache stays warm.
var dataDir string

func TestMain(m *testing.M) {
	reexec.Main() // the local sandbox's agent is this test binary, re-executed
	dataDir = testplugins.DataDir()
	os.Exit(m.Run())
}

func probePath(t testing.TB) string {
	t.Helper()
	p, err := testplugins.Build("internal/host/testdata/probe")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newProbeHost(t testing.TB, mutate func(*Config)) *Host {
	t.Helper()
	cfg := Config{DataDir: dataDir, Plugins: []PluginSpec{{Path: probePath(t), Grants: allGrants}}}
	if mutate != nil {
		mutate(&cfg)
	}
	h, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(context.Background()) })
	return h
}

func dispatch(t *testing.T, s *Dispatcher, tool, input string) (abi.Result, error) {
	t.Helper()
	// A hang bound: at load 50 under -race, 30 s ran out while a plugin instance was made.
	ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
	defer cancel()
	return s.Dispatch(ctx, tool, json.RawMessage(input))
}

func TestLoadRefusesUngrantedImport(t *testing.T) {
	_, err := New(context.Background(), Config{DataDir: dataDir, Plugins: []PluginSpec{{
		Path: probePath(t), Grants: []abi.Capability{abi.CapLog, abi.CapSandboxFiles},
	}}})
	if err == nil {
		t.Fatal("a plugin importing an ungranted capability was loaded")
	}
	for _, want := range []string{"probe.wasm", "toolhost_sandbox_exec.run", `"sandbox_exec"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
}

func TestLoadRefusesDuplicateTools(t *testing.T) {
	p := probePath(t)
	_, err := New(context.Background(), Config{DataDir: dataDir, Plugins: []PluginSpec{
		{Path: p, Grants: allGrants}, {Path: p, Grants: allGrants},
	}})
	if err == nil || !strings.Contains(err.Error(), "already") {
		t.Fatalf("loading the same plugin twice: err = %v, want a clash", err)
	}
}

func TestLoadRefusesNonPlugin(t *testing.T) {
	_, err := New(context.Background(), Config{DataDir: dataDir, Plugins: []PluginSpec{{Path: "garbage.wasm", Wasm: []byte("\x00asm\x01\x00\x00\x00")}}})
	if err == nil || !strings.Contains(err.Error(), "garbage.wasm") || !strings.Contains(err.Error(), abi.ExportVersion) {
		t.Fatalf("empty module: err = %v, want it refused for a missing export, naming the file", err)
	}
	_, err = New(context.Background(), Config{DataDir: dataDir, Plugins: []PluginSpec{{Path: "text.wasm", Wasm: []byte("hello")}}})
	if err == nil || !strings.Contains(err.Error(), "text.wasm") {
		t.Fatalf("non-wasm: err = %v", err)
	}
}

func TestDispatch(t *testing.T) {
	h := newProbeHost(t, nil)
	s := h.OpenSession(memsandbox.New())

	res, err := dispatch(t, s, "echo", `{"text":"hello"}`)
	if err != nil || res.IsError || testenv.ResultText(res) != "hello" {
		t.Fatalf("echo = %+v, %v", res, err)
	}

	res, err = dispatch(t, s, "nope", `{}`)
	if err != nil || !res.IsError || testenv.ResultText(res) != "[nope: unknown tool]" {
		t.Fatalf("unknown tool = %+v, %v", res, err)
	}

	for input, want := range map[string]string{
		`{}`:                    "text: required property is missing",
		`{"text":5}`:            "text: must be string, got integer",
		`{"text":"a","more":1}`: "more: unknown property (allowed: text)",
		`[1]`:                   "input: must be object, got array",
		`{"text":`:              "input is not valid JSON",
	} {
		res, err = dispatch(t, s, "echo", input)
		if err != nil || !res.IsError || !strings.Contains(testenv.ResultText(res), want) || !strings.HasPrefix(testenv.ResultText(res), "[echo: invalid input: ") {
			t.Errorf("echo %s = %q, %v; want an invalid-input error containing %q", input, testenv.ResultText(res), err, want)
		}
	}
}

func TestRunawayPluginStoppedWhileHostServes(t *testing.T) {
	// A budget an echo never misses on a loaded machine (a hang bound for spin, which uses
	// it all), short enough to keep the test short.
	h := newProbeHost(t, func(c *Config) { c.CallTimeout = 3 * time.Second })
	s := h.OpenSession(memsandbox.New())

	var wg sync.WaitGroup
	wg.Go(func() {
		res, err := dispatch(t, s, "spin", `{}`)
		if !errors.Is(err, ErrPluginTimeout) || !res.IsError {
			t.Errorf("spin: err = %v, want ErrPluginTimeout", err)
		}
	})
	// While one instance spins, others keep answering.
	for range 20 {
		if res, err := dispatch(t, s, "echo", `{"text":"still here"}`); err != nil || testenv.ResultText(res) != "still here" {
			t.Fatalf("echo during spin = %+v, %v", res, err)
		}
	}
	wg.Wait()

	res, err := dispatch(t, s, "sleep", `{"ms":60000}`)
	if !errors.Is(err, ErrPluginTimeout) {
		t.Fatalf("a guest sleeping past its budget: %+v, %v; want ErrPluginTimeout", res, err)
	}
	if res, err := dispatch(t, s, "echo", `{"text":"after"}`); err != nil || testenv.ResultText(res) != "after" {
		t.Fatalf("echo after = %+v, %v", res, err)
	}
}

func TestCallerContextStopsPlugin(t *testing.T) {
	h := newProbeHost(t, nil)
	s := h.OpenSession(memsandbox.New())
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := s.Dispatch(ctx, "spin", json.RawMessage(`{}`))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("spin under a caller deadline: err = %v, want context.DeadlineExceeded", err)
	}
}

func TestTimeInHostFunctionsIsNotBudget(t *testing.T) {
	// The command takes twice the plugin's budget; the plugin's own work is a fraction of
	// it even on a loaded machine (a 1 s budget was missed under -race at load 40).
	h := newProbeHost(t, func(c *Config) { c.CallTimeout = 5 * time.Second })
	sb := &slowSandbox{Sandbox: memsandbox.New(), delay: 10 * time.Second}
	res, err := dispatch(t, h.OpenSession(sb), "exec", `{"argv":["true"]}`)
	if err != nil || res.IsError {
		t.Fatalf("a command longer than the plugin budget: %+v, %v; want success", res, err)
	}
}

type slowSandbox struct {
	*memsandbox.Sandbox
	delay time.Duration
}

func (s *slowSandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	time.Sleep(s.delay)
	return s.Sandbox.Exec(ctx, req)
}

func TestPluginFailuresDiscardInstance(t *testing.T) {
	h := newProbeHost(t, nil)
	s := h.OpenSession(memsandbox.New())
	for _, tool := range []string{"trap", "bad_result"} {
		res, err := dispatch(t, s, tool, `{}`)
		if !errors.Is(err, ErrPluginFailed) || !res.IsError {
			t.Errorf("%s: %+v, %v; want ErrPluginFailed", tool, res, err)
		}
		if res, err := dispatch(t, s, "echo", `{"text":"ok"}`); err != nil || testenv.ResultText(res) != "ok" {
			t.Fatalf("echo after %s = %+v, %v", tool, res, err)
		}
	}
	res, err := dispatch(t, s, "image", `{"media_type":"image/bmp"}`)
	if !errors.Is(err, ErrPluginFailed) || !strings.Contains(err.Error(), "image/bmp") {
		t.Errorf("image/bmp: %+v, %v; want an invalid-result error", res, err)
	}
	res, err = dispatch(t, s, "image", `{"media_type":"image/webp"}`)
	if err != nil || res.Content[0].Source.MediaType != "image/webp" {
		t.Errorf("image/webp: %+v, %v", res, err)
	}
}

func TestOutOfBoundsPointersGetStatus(t *testing.T) {
	h := newProbeHost(t, nil)
	res, err := dispatch(t, h.OpenSession(memsandbox.New()), "oob", `{}`)
	if err != nil {
		t.Fatal(err)
	}
	want := "read_path=-14 read_len=-14 write_data=-14 exec_req=-14 take_none=-2 last_error_out=-14"
	if testenv.ResultText(res) != want {
		t.Fatalf("oob statuses = %q, want %q", testenv.ResultText(res), want)
	}
}

func TestFilePolicyAndTwoCallReplies(t *testing.T) {
	h := newProbeHost(t, nil)
	sb := memsandbox.New()
	big := strings.Repeat("0123456789", 1000) // over the probe's 64-byte buffer: goes through take
	sb.Put("notes/big.txt", big)
	sb.Put("small.txt", "hi")
	s := h.OpenSession(sb)

	for path, want := range map[string]string{
		"notes/big.txt":              big,
		"small.txt":                  "hi",
		"/home/user/small.txt":       "hi",
		"../../etc/passwd":           "status -18: ../../etc/passwd: path is outside the workspace",
		"/etc/passwd":                "status -18: /etc/passwd: path is outside the workspace",
		"/home/user/../root/x":       "status -18",
		"missing.txt":                "status -2: read missing.txt: no such file or directory",
		"notes":                      "status -21: read notes: is a directory",
		"/home/userX/escape":         "status -18",
		"notes/../../user/small.txt": "hi",
	} {
		res, err := dispatch(t, s, "read", `{"path":`+quote(path)+`}`)
		if err != nil {
			t.Fatal(err)
		}
		if got := testenv.ResultText(res); !strings.HasPrefix(got, want) {
			t.Errorf("read %s = %.80q, want prefix %.80q", path, got, want)
		}
	}
}

func quote(s string) string { b, _ := json.Marshal(s); return string(b) }

func TestExecRequestReachesSandbox(t *testing.T) {
	h := newProbeHost(t, nil)
	sb := memsandbox.New()
	res, err := dispatch(t, h.OpenSession(sb), "exec", `{"argv":["echo","-e","$(touch x); 'q'","--","."]}`)
	if err != nil || res.IsError {
		t.Fatalf("exec = %+v, %v", res, err)
	}
	if len(sb.Argvs) != 1 || strings.Join(sb.Argvs[0], "|") != "echo|-e|$(touch x); 'q'|--|." {
		t.Fatalf("argv reached the sandbox as %q", sb.Argvs)
	}
	// The reply is a JSON header line, then the raw stdout and stderr.
	head, body, _ := strings.Cut(testenv.ResultText(res), "\n")
	var er abi.ExecResult
	if err := json.Unmarshal([]byte(head), &er); err != nil || body[:er.StdoutLen] != "-e $(touch x); 'q' -- .\n" || er.StderrLen != 0 {
		t.Fatalf("exec reply %q: %v", testenv.ResultText(res), err)
	}
}

func TestOutputCappedAndANSIStripped(t *testing.T) {
	h := newProbeHost(t, nil)
	s := h.OpenSession(memsandbox.New())
	res, err := dispatch(t, s, "huge", `{"n":40000,"s":"é-"}`) // 80,000 characters
	if err != nil {
		t.Fatal(err)
	}
	got := testenv.ResultText(res)
	if !strings.HasPrefix(got, strings.Repeat("é-", 12500)) || !strings.HasSuffix(got, strings.Repeat("é-", 12500)) {
		t.Error("capped output does not keep 25,000 characters of head and tail")
	}
	if !strings.Contains(got, "30000 characters cut") {
		t.Errorf("capped output does not say how much was cut: %q", got[25000:25200])
	}
	res, err = dispatch(t, s, "ansi", `{}`)
	if err != nil || testenv.ResultText(res) != "red plain done" {
		t.Fatalf("ansi = %q, %v", testenv.ResultText(res), err)
	}
}

func TestConcurrentSessions(t *testing.T) {
	h := newProbeHost(t, func(c *Config) { c.PoolSize = 4 })
	var wg sync.WaitGroup
	for i := range 16 {
		s := h.OpenSession(memsandbox.New())
		wg.Go(func() {
			for j := range 20 {
				want := strings.Repeat("x", i*10+j)
				res, err := s.Dispatch(context.Background(), "echo", json.RawMessage(`{"text":"`+want+`"}`))
				if err != nil || testenv.ResultText(res) != want {
					t.Errorf("session %d call %d: %q, %v", i, j, testenv.ResultText(res), err)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestClosedHost(t *testing.T) {
	h := newProbeHost(t, nil)
	s := h.OpenSession(memsandbox.New())
	h.Close(context.Background())
	if _, err := dispatch(t, s, "echo", `{"text":"x"}`); !errors.Is(err, ErrClosed) {
		t.Fatalf("dispatch after Close: %v, want ErrClosed", err)
	}
}

func TestInspect(t *testing.T) {
	wasm, err := os.ReadFile(probePath(t))
	if err != nil {
		t.Fatal(err)
	}
	in, err := Inspect(context.Background(), wasm)
	if err != nil {
		t.Fatal(err)
	}
	if in.Manifest.Name != "probe" || len(in.Manifest.Tools) < 5 {
		t.Errorf("manifest = %+v", in.Manifest)
	}
	want := []abi.Capability{abi.CapLog, abi.CapSandboxExec, abi.CapSandboxFiles, abi.CapStore}
	if len(in.Needs) != len(want) {
		t.Fatalf("needs = %v, want %v", in.Needs, want)
	}
	for i := range want {
		if in.Needs[i] != want[i] {
			t.Fatalf("needs = %v, want %v", in.Needs, want)
		}
	}
}

func TestStoreCapability(t *testing.T) {
	st, err := dir.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	h := newProbeHost(t, func(c *Config) { c.Store = st })
	s := h.OpenSession(memsandbox.New())
	for _, c := range []struct{ input, want string }{
		{`{"op":"put","key":"notes/a.txt","text":"hello store"}`, "stored 11"},
		{`{"op":"get","key":"notes/a.txt"}`, "hello store"},
		{`{"op":"get","key":"notes/missing"}`, "status -2"},
		{`{"op":"list","key":""}`, `{"objects":[{"key":"notes/a.txt","size":11}]}`},
		{`{"op":"put","key":"../escape","text":"x"}`, "status -22"},
		{`{"op":"put","key":"/abs","text":"x"}`, "status -22"},
		{`{"op":"put","key":"a/../../b","text":"x"}`, "status -22"},
		{`{"op":"get","key":"a//b"}`, "status -22"},
	} {
		res, err := dispatch(t, s, "store", c.input)
		if err != nil || !strings.HasPrefix(testenv.ResultText(res), c.want) {
			t.Errorf("store %s = %q, %v; want %q", c.input, testenv.ResultText(res), err, c.want)
		}
	}
	// The plugin's corner is plugins/probe/: nothing lands anywhere else.
	objs, err := store.ListAll(context.Background(), st, "")
	if err != nil || len(objs) != 1 || objs[0].Key != "plugins/probe/notes/a.txt" {
		t.Fatalf("store holds %+v, %v", objs, err)
	}
}

// sessionStore is a store wrapper of one session (a fenced store): it counts the writes it
// sees and refuses them once shut.
type sessionStore struct {
	store.Store
	puts atomic.Int32
	shut atomic.Bool
}

func (s *sessionStore) Put(ctx context.Context, key string, r io.Reader, o store.PutOptions) (store.ObjectInfo, error) {
	s.puts.Add(1)
	if s.shut.Load() {
		return store.ObjectInfo{}, fmt.Errorf("test: %w", store.ErrFenced)
	}
	return s.Store.Put(ctx, key, r, o)
}

// WithStore: a session's store calls go to its own store (a wrapper of the host's), so
// they stop when it refuses; another session's do not.
func TestStoreCapabilityWithSessionStore(t *testing.T) {
	st, err := dir.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	h := newProbeHost(t, func(c *Config) { c.Store = st })
	own := &sessionStore{Store: st}
	s := h.OpenSession(memsandbox.New(), WithStore(own))
	other := h.OpenSession(memsandbox.New())
	if res, err := dispatch(t, s, "store", `{"op":"put","key":"a","text":"one"}`); err != nil || testenv.ResultText(res) != "stored 3" || own.puts.Load() != 1 {
		t.Fatalf("put through the session's store: %q %v (%d puts seen)", testenv.ResultText(res), err, own.puts.Load())
	}
	own.shut.Store(true)
	if res, err := dispatch(t, s, "store", `{"op":"put","key":"b","text":"two"}`); err != nil || !strings.HasPrefix(testenv.ResultText(res), "status ") ||
		!strings.Contains(testenv.ResultText(res), "may no longer write") {
		t.Errorf("put refused by the session's store: %q %v", testenv.ResultText(res), err)
	}
	if res, err := dispatch(t, s, "store", `{"op":"get","key":"a"}`); err != nil || testenv.ResultText(res) != "one" {
		t.Errorf("get through the session's store: %q %v", testenv.ResultText(res), err)
	}
	if res, err := dispatch(t, other, "store", `{"op":"put","key":"c","text":"three"}`); err != nil || testenv.ResultText(res) != "stored 5" {
		t.Errorf("another session's put: %q %v", testenv.ResultText(res), err)
	}
	objs, err := store.ListAll(context.Background(), st, "")
	if err != nil || len(objs) != 2 || objs[0].Key != "plugins/probe/a" || objs[1].Key != "plugins/probe/c" {
		t.Fatalf("store holds %+v, %v", objs, err)
	}
}

// A tool's input that is not text is refused, never silently changed: bytes that are not
// UTF-8 and escapes of half a UTF-16 pair would reach the tool as U+FFFD.
func TestInputMustBeText(t *testing.T) {
	h := newProbeHost(t, nil)
	s := h.OpenSession(memsandbox.New())
	for input, want := range map[string]string{
		"{\"text\":\"a\xffb\"}":    "byte 10 of the input is not UTF-8",
		"{\"text\":\"\xc3\"}":      "is not UTF-8",
		`{"text":"a\ud800b"}`:      `\ud800 without its other half`,
		`{"text":"\udc00"}`:        `\udc00 without its other half`,
		`{"text":"\ud83d\u0041"}`:  `\ud83d without its other half`,
		`{"text":"x","y\udfff":1}`: `\udfff without its other half`,
	} {
		res, err := dispatch(t, s, "echo", input)
		if err != nil || !res.IsError || !strings.Contains(testenv.ResultText(res), want) || !strings.HasPrefix(testenv.ResultText(res), "[echo: invalid input: ") {
			t.Errorf("echo %q = %q, %v; want an invalid-input error containing %q", input, testenv.ResultText(res), err, want)
		}
	}
	for input, want := range map[string]string{
		`{"text":"\ud83d\ude00"}`: "\U0001F600",
		`{"text":"\\ud800"}`:      `\ud800`,
		`{"text":"é€"}`:           "é€",
	} {
		res, err := dispatch(t, s, "echo", input)
		if err != nil || res.IsError || testenv.ResultText(res) != want {
			t.Errorf("echo %q = %q, %v; want %q", input, testenv.ResultText(res), err, want)
		}
	}
}

// A file operation's path that ends in / is refused: it names a directory, and cleaning
// it would act on a file of the directory's name.
func TestFilePathEndingInSlash(t *testing.T) {
	h := newProbeHost(t, nil)
	sb := memsandbox.New()
	sb.Put("dir/f", "x")
	sb.Put("file.txt", "content")
	s := h.OpenSession(sb)
	for _, p := range []string{"file.txt/", "dir/", "new/"} {
		res, err := dispatch(t, s, "read", `{"path":`+quote(p)+`}`)
		if err != nil || !res.IsError || !strings.Contains(testenv.ResultText(res), "ends in /") {
			t.Errorf("read %s = %q, %v; want a refusal saying it ends in /", p, testenv.ResultText(res), err)
		}
	}
	res, err := dispatch(t, s, "read", `{"path":"file.txt"}`)
	if err != nil || res.IsError || testenv.ResultText(res) != "content" {
		t.Errorf("read file.txt = %q, %v", testenv.ResultText(res), err)
	}
}
