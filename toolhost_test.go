//go:build linux

package toolhost

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/image/webp"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/memsandbox"
	"github.com/toolhost/toolhost/internal/sandbox/local"
	"github.com/toolhost/toolhost/internal/screenshot"
	"github.com/toolhost/toolhost/internal/testenv"
	"github.com/toolhost/toolhost/internal/testplugins"
)

// TestMain leaves the Example out, saying why, when the machine lacks what it needs (it
// cannot skip itself); on CI it runs and fails instead.
func TestMain(m *testing.M) {
	Reexec() // the sandbox agent and the browser's wrapper are this test binary, re-executed
	flag.Parse()
	if why := exampleMissing(); why != "" && !testenv.CI() {
		fmt.Fprintf(os.Stderr, "toolhost: not running Example: %s\n", why)
		skip := "^Example$"
		if s := flag.Lookup("test.skip").Value.String(); s != "" {
			skip = s + "|" + skip
		}
		flag.Set("test.skip", skip)
	}
	os.Exit(m.Run())
}

// exampleMissing says what the Example needs and this machine lacks: bubblewrap, the
// browser, and python3 for the sandbox to serve its page with.
func exampleMissing() string {
	if _, err := os.Stat(testenv.BwrapPath); err != nil {
		return "bubblewrap is not installed (make test installs it)"
	}
	if err := screenshot.New(screenshot.Config{}).Check(); err != nil {
		return "no browser (scripts/setup-browser.sh installs it): " + err.Error()
	}
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		return "no /usr/bin/python3 for the sandbox (make setup installs it)"
	}
	return ""
}

// testConfig is the default configuration with the shared compilation cache and a fresh
// store. The package's tests that spend most of their time waiting (on the browser, a large
// decode in a plugin, a test network) call t.Parallel: each has its own store, run dir,
// toolhost and sandbox, and what they share, the data dir's compilation cache, is shared by
// concurrent CLI processes too. The package's tests took ~14 min one after another, with
// the test process busy 27% of it (docs/DEVELOPMENT.md, "Where make test's time goes").
func testConfig(t testing.TB) Config {
	cfg := DefaultConfig()
	cfg.DataDir = testplugins.DataDir()
	if err := cfg.Set("store.dir", t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Set("sandbox.run_dir", testenv.RunDir(t)); err != nil {
		t.Fatal(err)
	}
	cfg.Project = "test"
	return cfg
}

func quiet() Option { return WithLogger(slog.New(slog.DiscardHandler)) }

func newToolhost(t testing.TB, cfg Config, opts ...Option) *Toolhost {
	t.Helper()
	th, err := New(context.Background(), cfg, append([]Option{quiet()}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := th.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return th
}

func open(t testing.TB, th *Toolhost, opts SessionOptions) *Session {
	t.Helper()
	s, err := th.Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return s
}

// expect runs a call and checks its is_error flag and that its text contains every want.
func expect(t *testing.T, s *Session, tool, input string, isErr bool, wants ...string) abi.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := s.Dispatch(ctx, tool, json.RawMessage(input))
	if err != nil {
		t.Fatalf("%s %s: host error %v", tool, input, err)
	}
	got := testenv.ResultText(res)
	if res.IsError != isErr {
		t.Errorf("%s %s: is_error = %v, want %v; text: %q", tool, input, res.IsError, isErr, got)
	}
	for _, w := range wants {
		if !strings.Contains(got, w) {
			t.Errorf("%s %s: text %q does not contain %q", tool, input, got, w)
		}
	}
	return res
}

func quote(s string) string { b, _ := json.Marshal(s); return string(b) }

// TestBuiltinsFromAnywhere: the default configuration loads the embedded built-ins with
// no file on disk, from any working directory.
func TestBuiltinsFromAnywhere(t *testing.T) {
	t.Chdir(t.TempDir())
	th := newToolhost(t, testConfig(t))
	var names []string
	for _, tl := range th.Tools() {
		names = append(names, tl.Name)
	}
	if got := strings.Join(names, ","); got != "bash,bash_output,bash_kill,exec_command,write_stdin,read_file,write_file,edit_file,apply_patch,grep,glob,take_screenshot" {
		t.Fatalf("tools = %s", got)
	}
	for _, p := range th.Plugins() {
		if !strings.HasPrefix(p.Path, "builtin:") {
			t.Errorf("plugin %s loaded from %s, not the binary", p.Name, p.Path)
		}
	}
}

// TestProviders: sandbox.provider picks a registered provider; an unknown name is refused
// at validation, and a name cannot be registered twice.
func TestProviders(t *testing.T) {
	if got := ProviderNames(); len(got) == 0 || got[0] != "local" && !strings.Contains(strings.Join(got, ","), "local") {
		t.Fatalf("providers = %v, want local among them", got)
	}
	defer func() {
		if recover() == nil {
			t.Error("registering local twice did not panic")
		}
	}()
	RegisterProvider(ProviderModule[struct{}]{Name: "local", New: func(context.Context, *struct{}, ModuleEnv) (sandbox.Provider, error) { return nil, nil }})
}

// memProvider is a provider that cannot mount host directories, as a remote one.
func init() {
	RegisterProvider(ProviderModule[struct{}]{Name: "test-memory", New: func(context.Context, *struct{}, ModuleEnv) (sandbox.Provider, error) {
		return &memsandbox.Provider{}, nil
	}})
}

// TestRemoteProviderRefusesHostWorkspace: a provider that cannot mount a host directory
// refuses a session with one instead of quietly giving it an empty workspace.
func TestRemoteProviderRefusesHostWorkspace(t *testing.T) {
	cfg := testConfig(t)
	cfg.Sandbox.Provider = "test-memory"
	th := newToolhost(t, cfg)
	_, err := th.Open(context.Background(), SessionOptions{Workspace: t.TempDir()})
	if !errors.Is(err, sandbox.ErrUnsupported) {
		t.Fatalf("Open with a host workspace on a provider without them: %v, want ErrUnsupported", err)
	}
	// Without one, it works: the tools act in the provider's own workspace.
	s := open(t, th, SessionOptions{})
	expect(t, s, "write_file", `{"path":"a.txt","content":"in memory\n"}`, false, "File written")
	expect(t, s, "read_file", `{"path":"a.txt"}`, false, "in memory")
	if _, err := s.Commit(context.Background(), "mem"); err != nil {
		t.Fatalf("commit: %v", err)
	}
}

// TestOpenRefusesTrustedWorkspace: a library user mounting a host directory gets the
// CLI's check: nothing the host trusts may lie in a workspace, nor the workspace in the
// host's state.
func TestOpenRefusesTrustedWorkspace(t *testing.T) {
	ws := t.TempDir()
	conf := filepath.Join(ws, "toolhost.yaml")
	if err := os.WriteFile(conf, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	th := newToolhost(t, cfg, WithConfigFile(conf))
	_, err := th.Open(context.Background(), SessionOptions{Workspace: ws})
	if err == nil || !strings.Contains(err.Error(), "the config file") {
		t.Fatalf("Open over the config file: %v", err)
	}
	cfg.DataDir = filepath.Join(ws, "data")
	if err := cfg.CheckWorkspace(ws, ""); err == nil || !strings.Contains(err.Error(), "the data dir") {
		t.Fatalf("a workspace holding the data dir: %v", err)
	}
	cfg = testConfig(t)
	if err := cfg.CheckWorkspace(filepath.Join(cfg.DataDir, "x"), ""); err == nil || !strings.Contains(err.Error(), "host's own state") {
		t.Fatalf("a workspace inside the data dir: %v", err)
	}
	cfg.PluginsDir = filepath.Join(ws, "plugins")
	cfg.Plugins = []Plugin{{Path: "lint.wasm"}}
	if err := cfg.CheckWorkspace(ws, ""); err == nil || !strings.Contains(err.Error(), "the plugins dir") {
		t.Fatalf("a workspace holding the plugins dir: %v", err)
	}
}

// TestSessionWakesAndCommits: a session's commit is what the next session of the project
// wakes from; a host directory is used as it is.
func TestSessionWakesAndCommits(t *testing.T) {
	testenv.NeedBwrap(t)
	th := newToolhost(t, testConfig(t))
	ctx := context.Background()
	s := open(t, th, SessionOptions{Project: "wake"})
	if _, ok := s.Woke(); ok {
		t.Fatal("a new project woke from a snapshot")
	}
	expect(t, s, "write_file", `{"path":"notes.txt","content":"kept\n"}`, false)
	info, err := s.Commit(ctx, "one")
	if err != nil {
		t.Fatal(err)
	}
	s.Close(ctx)

	s2 := open(t, th, SessionOptions{Project: "wake"})
	if in, ok := s2.Woke(); !ok || in.Key != info.Key {
		t.Fatalf("woke from %+v (%v), want %s", in, ok, info.Key)
	}
	expect(t, s2, "read_file", `{"path":"notes.txt"}`, false, "kept")

	ws := t.TempDir()
	os.WriteFile(filepath.Join(ws, "here.txt"), []byte("here\n"), 0o644)
	s3 := open(t, th, SessionOptions{Project: "wake", Workspace: ws})
	if _, ok := s3.Woke(); ok {
		t.Error("a session over a host directory restored a snapshot into it")
	}
	expect(t, s3, "bash", `{"command":"ls"}`, false, "here.txt")
	if got := testenv.ResultText(expect(t, s3, "bash", `{"command":"ls"}`, false)); strings.Contains(got, "notes.txt") {
		t.Errorf("the host directory shows the snapshot's files: %q", got)
	}
}

const page = `<!doctype html><html><head><style>html,body{margin:0;height:100%;background:#3366cc}</style></head>
<body><h1 style="color:#fff;font:40px sans-serif">toolhost</h1></body></html>`

// busy never lets the network go idle: a request every 100 ms.
const busy = `<!doctype html><html><body style="background:#00aa00">
<script>setInterval(()=>fetch('/index.html?'+Math.random()),100)</script></body></html>`

// shotSession is a session with screenshots on, for the capture tests.
func shotSession(t *testing.T) (*Toolhost, *Session) {
	t.Helper()
	testenv.NeedBwrap(t)
	testenv.Require(t, "Chromium and the Playwright driver (scripts/setup-browser.sh; make test runs it)",
		screenshot.New(screenshot.Config{}).Check())
	cfg := testConfig(t)
	cfg.Project = "shots"
	cfg.Screenshot.IdleWait = 2 * time.Second
	th := newToolhost(t, cfg)
	return th, open(t, th, SessionOptions{})
}

func decode(t *testing.T, c abi.Content) image.Image {
	t.Helper()
	if c.Type != abi.ContentImage || c.Source == nil || c.Source.MediaType != "image/webp" {
		t.Fatalf("block is not a WebP image: %+v", c)
	}
	raw, err := base64.StdEncoding.DecodeString(c.Source.Data)
	if err != nil {
		t.Fatal(err)
	}
	img, err := webp.Decode(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("WebP does not decode: %v", err)
	}
	return img
}

func near(a, b uint32) bool { return a>>8 >= b-8 && a>>8 <= b+8 }

// TestTakeScreenshotOfSandboxDevServer: take_screenshot of a dev server in the sandbox,
// through the session the embedding package assembles: the session sees the server
// start (the port is then the default) and captures on its own, the browser is reused,
// a commit captures again, and busy and missing pages say so.
func TestTakeScreenshotOfSandboxDevServer(t *testing.T) {
	t.Parallel() // mostly waiting (see testConfig)
	th, s := shotSession(t)
	ctx := context.Background()
	expect(t, s, "write_file", `{"path":"site/index.html","content":`+quote(page)+`}`, false)
	expect(t, s, "write_file", `{"path":"site/busy.html","content":`+quote(busy)+`}`, false)
	expect(t, s, "bash", `{"command":"cd site && exec python3 -m http.server 8000","background":true}`, false, "Started in background")
	testenv.WaitFor(t, "the session to see the dev server", func() bool { return s.live.DevServerPort() == 8000 })

	// Auto-capture fires when the dev server starts listening.
	testenv.WaitFor(t, "an auto-capture after the dev server started", func() bool {
		l, _ := s.Screenshots(ctx, screenshot.KindAuto)
		return len(l) >= 2
	})

	pid := 0
	for i := range 2 { // twice: the browser is reused
		res := expect(t, s, "take_screenshot", `{}`, false)
		if len(res.Content) != 3 {
			t.Fatalf("take_screenshot: %+v", res)
		}
		desk, mob := decode(t, res.Content[0]), decode(t, res.Content[1])
		if b := desk.Bounds(); b.Dx() != 1280 || b.Dy() != 800 {
			t.Errorf("desktop is %v, want 1280x800", b)
		}
		if b := mob.Bounds(); b.Dx() != 390 || b.Dy() != 844 {
			t.Errorf("mobile is %v, want 390x844", b)
		}
		for _, img := range []image.Image{desk, mob} {
			r, g, b, _ := img.At(img.Bounds().Dx()-5, img.Bounds().Dy()-5).RGBA()
			if !near(r, 0x33) || !near(g, 0x66) || !near(b, 0xcc) {
				t.Errorf("pixel is %02x%02x%02x, want the page's 3366cc", r>>8, g>>8, b>>8)
			}
		}
		note := res.Content[2].Text
		for _, want := range []string{"desktop 1280x800", "mobile 390x844", "on port 8000"} {
			if !strings.Contains(note, want) {
				t.Errorf("note %q does not say %q", note, want)
			}
		}
		// A directory store's "URL" is a host path: the model never reads one (the
		// captures are stored all the same: counted below).
		if strings.Contains(note, os.TempDir()) || strings.Contains(note, "stored at") {
			t.Errorf("note %q names a host path", note)
		}
		if i == 0 {
			pid = th.capt.BrowserPID()
		} else if th.capt.BrowserPID() != pid || pid == 0 {
			t.Errorf("browser pid %d then %d: not reused", pid, th.capt.BrowserPID())
		}
	}
	if l, _ := s.Screenshots(ctx, screenshot.KindAgent); len(l) != 4 {
		t.Errorf("%d agent captures stored, want 4 (two pairs)", len(l))
	}

	// A commit captures on its own too.
	before, _ := s.Screenshots(ctx, screenshot.KindAuto)
	if _, err := s.Commit(ctx, "phase 1"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "an auto-capture after the commit", func() bool {
		l, _ := s.Screenshots(ctx, screenshot.KindAuto)
		return len(l) >= len(before)+2
	})

	// A page that never goes idle is shot at the bound, and the result says so.
	res := expect(t, s, "take_screenshot", `{"port":8000,"path":"/busy.html"}`, false)
	if !strings.Contains(res.Content[2].Text, "still loading") {
		t.Errorf("busy page: %q", testenv.ResultText(res))
	}
	// A 404 page is captured and its status reported.
	res = expect(t, s, "take_screenshot", `{"path":"/missing.html"}`, false)
	if !strings.Contains(res.Content[2].Text, "HTTP 404") {
		t.Errorf("missing page: %q", testenv.ResultText(res))
	}

	if pid := th.capt.BrowserPID(); pid != 0 {
		th.capt.Close(ctx)
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
			t.Errorf("browser %d still runs after Close", pid)
		}
	}
}

// restoreOnly hides the provider's handoff: a session over it rotates by restoring the
// snapshot into a fresh sandbox, as over a remote provider.
type restoreOnly struct{ sandbox.Provider }

// A background HTTP server started through bash answers and is screenshotted after each
// of three rotations, on both paths, with nothing done by the agent: the session restarts
// the server, take_screenshot waits for it to listen again, the first result after each
// rotation says what was restarted, and the session's own capture of the dev server
// re-arms.
func TestScreenshotAfterThreeRotations(t *testing.T) {
	t.Parallel() // mostly waiting (see testConfig)
	for _, restore := range []bool{false, true} {
		t.Run(map[bool]string{false: "handoff", true: "restore"}[restore], func(t *testing.T) {
			t.Parallel()
			th, _ := shotSession(t)
			opts := SessionOptions{Project: "rotations"}
			if restore {
				p, err := th.Provider(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				opts.Provider = restoreOnly{p}
			}
			s := open(t, th, opts)
			ctx := context.Background()
			expect(t, s, "write_file", `{"path":"site/index.html","content":`+quote(page)+`}`, false)
			expect(t, s, "bash", `{"command":"cd site && exec python3 -m http.server 8000","background":true}`, false, "Started in background")
			testenv.WaitFor(t, "the session to see the dev server", func() bool { return s.live.DevServerPort() == 8000 })
			autos := func() int { l, _ := s.Screenshots(ctx, screenshot.KindAuto); return len(l) }
			testenv.WaitFor(t, "the first auto-capture", func() bool { return autos() >= 2 })
			for r := 1; r <= 3; r++ {
				before := autos()
				if err := s.live.Rotate(ctx); err != nil {
					t.Fatal(err)
				}
				res := expect(t, s, "take_screenshot", `{}`, false)
				if len(res.Content) != 4 {
					t.Fatalf("rotation %d: take_screenshot: %q", r, testenv.ResultText(res))
				}
				for _, img := range []image.Image{decode(t, res.Content[0]), decode(t, res.Content[1])} {
					r, g, b, _ := img.At(img.Bounds().Dx()-5, img.Bounds().Dy()-5).RGBA()
					if !near(r, 0x33) || !near(g, 0x66) || !near(b, 0xcc) {
						t.Errorf("pixel is %02x%02x%02x, want the page's 3366cc", r>>8, g>>8, b>>8)
					}
				}
				if n := res.Content[3].Text; !strings.Contains(n, "were restarted") || !strings.Contains(n, "python3 -m http.server 8000") {
					t.Errorf("rotation %d: notice %q", r, n)
				}
				expect(t, s, "bash", `{"command":"python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8000/').status)\""}`, false, "200\n")
				testenv.WaitFor(t, "an auto-capture after the rotation", func() bool { return autos() >= before+2 })
			}
			if n := s.live.Rotations(); n != 3 {
				t.Errorf("%d rotations", n)
			}
		})
	}
}

// TestTakeScreenshotRefusals: what take_screenshot refuses, and why, for the model.
func TestTakeScreenshotRefusals(t *testing.T) {
	t.Parallel() // mostly waiting (see testConfig)
	_, s := shotSession(t)
	expect(t, s, "take_screenshot", `{}`, true, "no port given and no dev server seen")
	expect(t, s, "take_screenshot", `{"port":8001}`, true, "connection refused", "8001")
	expect(t, s, "take_screenshot", `{"port":0}`, true, "invalid input")

	// A port the host listens on is not the sandbox's: it cannot be aimed at.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	hostPort := ln.Addr().(*net.TCPAddr).Port
	expect(t, s, "take_screenshot", `{"port":`+strconv.Itoa(hostPort)+`}`, true, "connection refused")

	expect(t, s, "write_file", `{"path":"index.html","content":"<p>hi</p>"}`, false)
	expect(t, s, "bash", `{"command":"exec python3 -m http.server 8002","background":true}`, false)
	testenv.WaitFor(t, "the dev server", func() bool { return s.live.DevServerPort() == 8002 })
	for _, path := range []string{"//evil.example/", "@evil.example", `\\evil.example\x`, "http://evil.example/", "/\\evil.example", "javascript:alert(1)"} {
		in, _ := json.Marshal(map[string]string{"path": path})
		expect(t, s, "take_screenshot", string(in), true, "Error: could not take the screenshot")
	}
}

// TestScreenshotsOff: with screenshot.enabled false no browser is made, and
// take_screenshot says so.
func TestScreenshotsOff(t *testing.T) {
	cfg := testConfig(t)
	cfg.Screenshot.Enabled = false
	cfg.Sandbox.Provider = "test-memory"
	th := newToolhost(t, cfg)
	if th.capt != nil || th.CheckBrowser() == nil {
		t.Fatal("a browser was configured with screenshots off")
	}
	s := open(t, th, SessionOptions{})
	expect(t, s, "take_screenshot", `{"port":8000}`, true, "no browser configured")
}

// TestTrustCheckGuardsPathsNotReadYet: a workspace may not hold a path the host will read
// or write on its own, whether or not it exists yet: the default config file (a sandbox
// that creates it configures every later command), the one TOOLHOST_CONFIG names, the
// audit file, the run and workspace dirs of the local sandboxes; nor lie inside them.
func TestTrustCheckGuardsPathsNotReadYet(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", "") // ~/.config
	t.Setenv(EnvPrefix+"CONFIG", "")
	cfg := testConfig(t)
	if _, err := os.Stat(filepath.Join(home, ".config")); !os.IsNotExist(err) {
		t.Fatalf("the test's home is not empty: %v", err)
	}
	if err := cfg.CheckWorkspace(home, ""); err == nil || !strings.Contains(err.Error(), "the default config file") {
		t.Errorf("a workspace that would hold the default config file, none existing yet: %v", err)
	}
	if DefaultConfigFile() != filepath.Join(home, ".config", "toolhost", "toolhost.yaml") {
		t.Errorf("DefaultConfigFile() = %s", DefaultConfigFile())
	}

	ws := t.TempDir()
	t.Setenv(EnvPrefix+"CONFIG", filepath.Join(ws, "sub", "conf.yaml"))
	if err := cfg.CheckWorkspace(ws, ""); err == nil || !strings.Contains(err.Error(), "TOOLHOST_CONFIG") {
		t.Errorf("a workspace holding the file TOOLHOST_CONFIG names, not there yet: %v", err)
	}
	t.Setenv(EnvPrefix+"CONFIG", "")

	c := cfg
	c.Audit.File = filepath.Join(ws, "logs", "audit.jsonl")
	if err := c.CheckWorkspace(ws, ""); err == nil || !strings.Contains(err.Error(), "audit file") {
		t.Errorf("a workspace holding the audit file, not there yet: %v", err)
	}
	c = cloneConfig(cfg)
	if err := c.Set("sandbox.run_dir", filepath.Join(ws, "run")); err != nil {
		t.Fatal(err)
	}
	if err := c.CheckWorkspace(ws, ""); err == nil || !strings.Contains(err.Error(), "sandbox.run_dir") {
		t.Errorf("a workspace holding the run dir: %v", err)
	}
	c = cloneConfig(cfg)
	if err := c.Set("sandbox.workspace_dir", ws); err != nil {
		t.Fatal(err)
	}
	if err := c.CheckWorkspace(filepath.Join(ws, "inner"), ""); err == nil || !strings.Contains(err.Error(), "host's own state") {
		t.Errorf("a workspace inside the sandboxes' workspace dir: %v", err)
	}
	if err := cfg.CheckWorkspace(filepath.Join(local.DefaultRunDir(), "x"), ""); err == nil || !strings.Contains(err.Error(), "host's own state") {
		t.Errorf("a workspace in the default run dir: %v", err)
	}
	if err := cfg.CheckWorkspace(ws, ""); err != nil {
		t.Errorf("a workspace holding nothing of the host's: %v", err)
	}
}

// TestSessionWakeConvertsTarGz: a session (its lease held, its writes through the fenced
// store) of a project whose newest snapshot is a tar.gz one written by an older version
// (internal/session/testdata/store-main, written by main at 6bd6b09) wakes in it and
// converts it: a chunked snapshot of it is the project's newest, the tar.gz one stays,
// and the next session wakes in the chunked one.
func TestSessionWakeConvertsTarGz(t *testing.T) {
	testenv.NeedBwrap(t)
	cfg := testConfig(t)
	storeDir := t.TempDir()
	if err := os.CopyFS(storeDir, os.DirFS("internal/session/testdata/store-main")); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Set("store.dir", storeDir); err != nil {
		t.Fatal(err)
	}
	const legacy = "projects/legacy/snapshots/20261128T100000Z-000-50f14f.tar.gz"
	th := newToolhost(t, cfg)
	ctx := context.Background()
	s := open(t, th, SessionOptions{Project: "legacy"})
	if in, ok := s.Woke(); !ok || in.Key != legacy {
		t.Fatalf("woke from %+v (%v), want %s", in, ok, legacy)
	}
	expect(t, s, "read_file", `{"path":"README.md"}`, false, "written as tar.gz")
	list, err := th.Storage().Snapshots(ctx, "legacy")
	if err != nil || len(list) != 2 || list[1].Key != legacy || !strings.HasSuffix(list[0].Key, ".snap") {
		t.Fatalf("after the wake: %+v %v; want a chunked snapshot newest and the tar.gz one kept", list, err)
	}
	s.Close(ctx)
	s2 := open(t, th, SessionOptions{Project: "legacy"})
	if in, ok := s2.Woke(); !ok || in.Key != list[0].Key {
		t.Fatalf("the next session woke from %+v (%v), want %s", in, ok, list[0].Key)
	}
	expect(t, s2, "read_file", `{"path":"src/pkg/main.go"}`, false, "func main()")
}
