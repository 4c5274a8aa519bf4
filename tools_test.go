//go:build linux

package toolhost

// The agent tools of issue 20 end to end: the embedded plugins, the real host, real
// bubblewrap sandboxes under a session that rotates.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image/png"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/testenv"
)

// toolsSession opens a session on the local provider, with the bash plugin keeping
// exported variables.
func toolsSession(t *testing.T, project string) *Session {
	t.Helper()
	testenv.NeedBwrap(t)
	cfg := testConfig(t)
	for i := range cfg.Plugins {
		if cfg.Plugins[i].Path == "bash.wasm" {
			cfg.Plugins[i].Env = map[string]string{"TOOLHOST_BASH_KEEP_ENV": "1"}
		}
	}
	return open(t, newToolhost(t, cfg), SessionOptions{Project: project})
}

func TestShellRemembersAcrossRotations(t *testing.T) {
	s := toolsSession(t, "shell")
	ctx := context.Background()
	expect(t, s, "bash", `{"command":"mkdir -p src && cd src && export X=1"}`, false, "[cwd is now /home/user/src]")
	expect(t, s, "bash", `{"command":"pwd; echo $X"}`, false, "/home/user/src\n1\n[exit 0]")
	for range 2 {
		if err := s.live.Rotate(ctx); err != nil {
			t.Fatal(err)
		}
		res := expect(t, s, "bash", `{"command":"pwd; echo $X"}`, false, "/home/user/src\n1\n")
		if strings.Contains(testenv.ResultText(res), "cwd is now") {
			t.Errorf("the directory did not change: %q", testenv.ResultText(res))
		}
	}
	// Another session of the same project starts afresh: the state is the session's.
	th := s.th
	other := open(t, th, SessionOptions{Project: "shell-other"})
	expect(t, other, "bash", `{"command":"pwd; echo \"[$X]\""}`, false, "/home/user\n[]\n")
}

func TestBackgroundOutputAndKill(t *testing.T) {
	s := toolsSession(t, "background")
	res := expect(t, s, "bash", `{"command":"for i in 1 2 3; do echo line$i; done; sleep 1000","background":true}`, false, "Started in background")
	id := regexp.MustCompile(`id (bg-[0-9a-f]+)`).FindStringSubmatch(testenv.ResultText(res))
	if id == nil {
		t.Fatalf("no id in %q", testenv.ResultText(res))
	}
	in := `{"id":"` + id[1] + `"}`
	testenv.WaitFor(t, "the command's output", func() bool {
		r, _ := s.Dispatch(context.Background(), "bash_output", json.RawMessage(in))
		return strings.Contains(testenv.ResultText(r), "line3")
	})
	expect(t, s, "bash_output", in, false, "running, pid", "[no new output]")
	expect(t, s, "bash_kill", in, false, "stopped with SIGTERM")
	expect(t, s, "bash_output", in, false, "no longer running")
	// A stopped command is not started again by a rotation.
	if err := s.live.Rotate(context.Background()); err != nil {
		t.Fatal(err)
	}
	res = expect(t, s, "bash_output", in, false, "no longer running")
	if strings.Contains(testenv.ResultText(res), "were restarted") {
		t.Errorf("a stopped command was restarted: %q", testenv.ResultText(res))
	}
	expect(t, s, "bash_output", `{"id":"bg-0123456789abcdef"}`, true, "there is no background command bg-0123456789abcdef")
}

// sessionID finds the session id in an exec_command result.
func sessionID(t *testing.T, text string) string {
	t.Helper()
	m := regexp.MustCompile(`\[session (term-[0-9a-f]+): running`).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("no running session in %q", text)
	}
	return m[1]
}

// typeUntil writes chars to a session, then reads until its output holds want.
func typeUntil(t *testing.T, s *Session, id, chars, want string) string {
	t.Helper()
	var all strings.Builder
	deadline := time.Now().Add(90 * time.Second)
	for {
		in, _ := json.Marshal(map[string]any{"session_id": id, "chars": chars, "yield_time_ms": 3000})
		chars = ""
		res := expect(t, s, "write_stdin", string(in), false)
		all.WriteString(testenv.ResultText(res))
		if strings.Contains(all.String(), want) {
			return all.String()
		}
		if strings.Contains(testenv.ResultText(res), "exited with code") || time.Now().After(deadline) {
			t.Fatalf("session %s never said %q; it said %q", id, want, all.String())
		}
	}
}

func TestPythonREPLThroughTheTerminalTools(t *testing.T) {
	s := toolsSession(t, "repl")
	res := expect(t, s, "exec_command", `{"cmd":"python3 -q","yield_time_ms":20000}`, false)
	id := sessionID(t, testenv.ResultText(res))
	if !strings.Contains(testenv.ResultText(res), ">>> ") {
		typeUntil(t, s, id, "", ">>> ")
	}
	typeUntil(t, s, id, "def double(x):\n    return 2 * x\n\n", ">>> ")
	typeUntil(t, s, id, "double(21)\n", "42")
	// A loop that never ends, interrupted with Ctrl-C.
	expect(t, s, "write_stdin", `{"session_id":"`+id+`","chars":"while True: pass\n","yield_time_ms":500}`, false, "running")
	typeUntil(t, s, id, "\u0003", "KeyboardInterrupt")
	typeUntil(t, s, id, "print('after', double(4))\n", "after 8")

	// After a rotation the program runs again, empty, and says so.
	if err := s.live.Rotate(context.Background()); err != nil {
		t.Fatal(err)
	}
	out := typeUntil(t, s, id, "print('alive')\n", "alive")
	if !strings.Contains(out, "started again") {
		t.Errorf("the restart was not said: %q", out)
	}
	typeUntil(t, s, id, "double(1)\n", "NameError")
	out = typeUntil(t, s, id, "exit(5)\n", "exited with code 5")
	expect(t, s, "write_stdin", `{"session_id":"`+id+`","chars":"x"}`, true, "there is no open session")
	_ = out
}

func TestNpmInitThroughStdin(t *testing.T) {
	if _, err := exec.LookPath("npm"); err != nil {
		testenv.Skipf(t, "npm (Node.js) is not installed")
	}
	s := toolsSession(t, "npminit")
	expect(t, s, "bash", `{"command":"mkdir -p app && cd app"}`, false)
	res := expect(t, s, "exec_command", `{"cmd":"npm init","yield_time_ms":30000}`, false)
	id := sessionID(t, testenv.ResultText(res))
	answers := []struct{ prompt, answer string }{
		{"package name:", "demo-app"}, {"version:", "0.2.0"}, {"description:", "made through stdin"},
		{"entry point:", ""}, {"test command:", ""}, {"git repository:", ""}, {"keywords:", ""},
		{"author:", "toolhost"}, {"license:", "MIT"}, {"type:", ""}, // npm 11 asks for the module type
	}
	out := output(testenv.ResultText(res))
	start := time.Now()
	for _, a := range answers {
		if a.prompt == "type:" && !strings.Contains(out, a.prompt) && strings.Contains(out, "Is this OK?") {
			break // an npm that does not ask it
		}
		// Read until npm asks this question, then answer it.
		readUntil(t, s, id, out, a.prompt)
		out = readUntil(t, s, id, "", "", a.answer+"\n")
	}
	t.Logf("answered npm init in %s", time.Since(start))
	readUntil(t, s, id, out, "Is this OK?")
	typeUntil(t, s, id, "yes\n", "exited with code 0")
	expect(t, s, "bash", `{"command":"cat package.json"}`, false, `"name": "demo-app"`, `"version": "0.2.0"`, `"description": "made through stdin"`, `"license": "MIT"`)
}

// output is what a terminal tool's result holds of the program's output (its first line
// is the session's state).
func output(text string) string {
	_, out, _ := strings.Cut(text, "\n")
	if out == "[no output]" {
		return ""
	}
	return out
}

// readUntil types chars (if any), then reads until the output so far holds want, and
// returns the output after it.
func readUntil(t *testing.T, s *Session, id, out, want string, chars ...string) string {
	t.Helper()
	typed := strings.Join(chars, "")
	deadline := time.Now().Add(90 * time.Second)
	for typed != "" || !strings.Contains(out, want) {
		in, _ := json.Marshal(map[string]any{"session_id": id, "chars": typed, "yield_time_ms": 3000})
		typed = ""
		res := expect(t, s, "write_stdin", string(in), false)
		out += output(testenv.ResultText(res))
		if strings.Contains(testenv.ResultText(res), "exited with code") || time.Now().After(deadline) {
			t.Fatalf("session %s never said %q; it said %q", id, want, out)
		}
		if want == "" {
			return out
		}
	}
	_, after, _ := strings.Cut(out, want)
	return after
}

func TestApplyPatchInASandbox(t *testing.T) {
	s := toolsSession(t, "patch")
	expect(t, s, "bash", `{"command":"mkdir -p src && printf 'package main\n\nfunc main() {\n\tprintln(1)\n}\n' > src/main.go && printf 'x\n' > old.txt && printf 'func util() {}\n' > src/util.go"}`, false)
	patch := "*** Begin Patch\n*** Add File: docs/a.md\n+# A\n*** Delete File: old.txt\n*** Update File: src/main.go\n@@ func main() {\n-\tprintln(1)\n+\tprintln(2)\n }\n*** Update File: src/util.go\n*** Move to: src/helpers.go\n@@\n-func util() {}\n+func helper() {}\n*** End Patch\n"
	expect(t, s, "apply_patch", `{"input":`+quote(patch)+`}`, false, "A docs/a.md\nD old.txt\nM src/main.go\nR src/util.go -> src/helpers.go")
	expect(t, s, "bash", `{"command":"cat docs/a.md src/main.go src/helpers.go; ls old.txt src/util.go 2>&1 | wc -l"}`, false,
		"# A\npackage main\n\nfunc main() {\n\tprintln(2)\n}\nfunc helper() {}\n2\n")
	// A failing hunk leaves every file untouched.
	bad := "*** Begin Patch\n*** Update File: src/main.go\n@@\n-\tprintln(2)\n+\tprintln(3)\n*** Delete File: docs/a.md\n*** Update File: src/helpers.go\n@@\n-func nothere() {}\n+func x() {}\n*** End Patch\n"
	expect(t, s, "apply_patch", `{"input":`+quote(bad)+`}`, true, "hunk 1 of src/helpers.go did not apply", "-func nothere() {}", "No file was changed")
	expect(t, s, "bash", `{"command":"cat src/main.go docs/a.md"}`, false, "println(2)", "# A")
}

func TestGuardedWritesInASandbox(t *testing.T) {
	s := toolsSession(t, "guard")
	expect(t, s, "bash", `{"command":"printf 'a = 1\n' > conf.py"}`, false)
	edit := `{"path":"conf.py","old_string":"a = 1","new_string":"a = 2"}`
	expect(t, s, "edit_file", edit, true, "conf.py has not been read in this session")
	expect(t, s, "read_file", `{"path":"conf.py"}`, false, "a = 1")
	expect(t, s, "edit_file", edit, false, "File edited: conf.py")
	// A background process changes the file behind the model's back.
	expect(t, s, "bash", `{"command":"sleep 0.3; printf 'a = 2\nb = 3\n' > conf.py","background":true}`, false)
	testenv.WaitFor(t, "the background write", func() bool {
		r, _ := s.Dispatch(context.Background(), "bash", json.RawMessage(`{"command":"grep -c b conf.py"}`))
		return strings.Contains(testenv.ResultText(r), "1\n")
	})
	expect(t, s, "edit_file", `{"path":"conf.py","old_string":"a = 2","new_string":"a = 4"}`, true, "has changed since you last read it")
	expect(t, s, "write_file", `{"path":"conf.py","content":"clobbered"}`, true, "has changed since you last read it")
	// The guard survives a rotation.
	if err := s.live.Rotate(context.Background()); err != nil {
		t.Fatal(err)
	}
	expect(t, s, "edit_file", `{"path":"conf.py","old_string":"a = 2","new_string":"a = 4"}`, true, "has changed since you last read it")
	expect(t, s, "read_file", `{"path":"conf.py"}`, false, "b = 3")
	expect(t, s, "edit_file", `{"path":"conf.py","old_string":"a = 2","new_string":"a = 4"}`, false, "File edited")
	expect(t, s, "write_file", `{"path":"brand/new.txt","content":"new"}`, false, "File written")
}

// drawPNG is a Python program that writes a 300x200 PNG, without any library.
const drawPNG = `import struct, zlib
w, h = 300, 200
rows = b"".join(b"\x00" + b"".join(bytes((x % 256, y % 256, 128)) for x in range(w)) for y in range(h))
def chunk(t, d): return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
open("drawn.png", "wb").write(png)
`

func TestReadFileSees(t *testing.T) {
	s := toolsSession(t, "sees")
	expect(t, s, "write_file", `{"path":"draw.py","content":`+quote(drawPNG)+`}`, false)
	expect(t, s, "bash", `{"command":"python3 draw.py && ls -la drawn.png"}`, false, "drawn.png")
	res := expect(t, s, "read_file", `{"path":"drawn.png"}`, false, "PNG, 300x200")
	if len(res.Content) != 2 {
		t.Fatalf("read_file of a PNG: %d blocks", len(res.Content))
	}
	if c := res.Content[1]; c.Type != abi.ContentImage || c.Source.MediaType != "image/png" {
		t.Fatalf("a small PNG is not passed through as a PNG: %+v", c)
	}
	raw, err := base64.StdEncoding.DecodeString(res.Content[1].Source.Data)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("the PNG does not decode: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 300 || b.Dy() != 200 {
		t.Errorf("the image is %v, want 300x200", b)
	}
	if r, g, _, _ := img.At(10, 20).RGBA(); r>>8 != 10 || g>>8 != 20 {
		t.Errorf("pixel (10,20) is %d,%d", r>>8, g>>8)
	}

	if _, err := exec.LookPath("pdftotext"); err != nil {
		testenv.Skipf(t, "poppler-utils is not installed (scripts/setup.sh installs it)")
	}
	expect(t, s, "write_file", `{"path":"doc.pdf","content":`+quote(string(twoPagePDF()))+`}`, false)
	expect(t, s, "read_file", `{"path":"doc.pdf"}`, false, "2 pages", "--- page 1 ---\nHello from page one", "--- page 2 ---\nAnd page two")
	expect(t, s, "read_file", `{"path":"doc.pdf","pages":"2"}`, false, "And page two")

	nb := `{"cells":[{"cell_type":"code","execution_count":1,"source":["x = 6 * 7\n","x"],"outputs":[{"output_type":"execute_result","data":{"text/plain":["42"]}}]}],"metadata":{"kernelspec":{"language":"python"}}}`
	expect(t, s, "write_file", `{"path":"a.ipynb","content":`+quote(nb)+`}`, false)
	expect(t, s, "read_file", `{"path":"a.ipynb"}`, false, "[notebook a.ipynb: 1 cell, python]", "x = 6 * 7\nx\n--- output ---\n42")
}

// bigPNG is a Python program that writes an RGBA PNG of the size its arguments give, all
// transparent black (a small file; decoding it takes 4 bytes a pixel all the same).
const bigPNG = `import struct, sys, zlib
w, h, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def chunk(t, d): return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
z, row, idat = zlib.compressobj(9), b"\x00" * (1 + 4 * w), []
for _ in range(h): idat.append(z.compress(row))
idat.append(z.flush())
png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 6, 0, 0, 0)) + chunk(b"IDAT", b"".join(idat)) + chunk(b"IEND", b"")
open(out, "wb").write(png)
`

// An image within the pixel cap whose decoding would take more memory than the plugin
// has is refused with what to do, before it is decoded: the plugin's memory limit is not
// what answers (it answered "wasm error: unreachable"). One that fits is shown, and under
// a lower limit it is shown in a format whose encoder fits (lossless WebP's takes 54
// bytes a pixel, and ran a 64 MiB instance out of memory on a 1568x922 image).
func TestReadFileImageTooBigToDecode(t *testing.T) {
	t.Parallel() // mostly waiting (see testConfig)
	testenv.NeedBwrap(t)
	for _, mem := range []string{"128", "64"} {
		cfg := testConfig(t)
		// A hang bound, not a timing: decoding takes seconds on a loaded machine.
		if err := cfg.Set("limits.call_timeout", testenv.HangBound.String()); err != nil {
			t.Fatal(err)
		}
		if err := cfg.Set("limits.memory_mib", mem); err != nil {
			t.Fatal(err)
		}
		th := newToolhost(t, cfg)
		// Decoding in the interpreter's form takes minutes on a loaded machine: wait for the
		// compiled form of the plugins this test calls (not of every built-in). A liveness
		// bound: with a cold compilation cache, compiling editfile under -race beside other
		// work took most of two minutes on a 2-core machine, and every built-in did not
		// fit in them (the fresh-clone run of 2026-11-29 beside a busy loop).
		ctx, cancel := context.WithTimeout(context.Background(), 3*testenv.HangBound)
		if err := th.host.ReadyFor(ctx, "read_file", "write_file", "bash"); err != nil {
			t.Fatal(err)
		}
		cancel()
		s := open(t, th, SessionOptions{Project: "bigimage" + mem})
		call := func(input string, isErr bool, wants ...string) string {
			t.Helper()
			ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
			defer cancel()
			res, err := s.Dispatch(ctx, "read_file", json.RawMessage(input))
			if err != nil {
				t.Fatalf("%s MiB: read_file %s: host error %v", mem, input, err)
			}
			got := testenv.ResultText(res)
			if res.IsError != isErr {
				t.Errorf("%s MiB: read_file %s: is_error %v, want %v: %q", mem, input, res.IsError, isErr, got)
			}
			for _, w := range wants {
				if !strings.Contains(got, w) {
					t.Errorf("%s MiB: read_file %s: %q does not say %q", mem, input, got, w)
				}
			}
			return got
		}
		expect(t, s, "write_file", `{"path":"big.py","content":`+quote(bigPNG)+`}`, false)
		expect(t, s, "bash", `{"command":"python3 big.py 6300 6300 huge.png && python3 big.py 1700 1000 wide.png && ls -la *.png"}`, false, "huge.png")
		call(`{"path":"huge.png"}`, true, "huge.png is 6300x6300 (PNG)", "to decode and scale", "its memory limit is "+mem+" MiB", "scale it down first")
		got := call(`{"path":"wide.png"}`, false, "PNG, 1700x1000", "shown at 1568x922")
		if mem == "64" && !strings.Contains(got, " as png,") {
			t.Errorf("64 MiB: shown as %q, want png (WebP's encoder does not fit)", got)
		}
		// The instance that answered is whole: the next call works.
		call(`{"path":"big.py","limit":1}`, false, "import struct")
	}
}

// twoPagePDF is a minimal PDF of two pages, each with one line of text.
func twoPagePDF() []byte {
	objs := []string{
		"<< /Type /Catalog /Pages 2 0 R >>",
		"<< /Type /Pages /Kids [3 0 R 5 0 R] /Count 2 >>",
		"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 200] /Contents 4 0 R /Resources << /Font << /F1 7 0 R >> >> >>",
		pdfStream("BT /F1 18 Tf 20 100 Td (Hello from page one) Tj ET"),
		"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 200] /Contents 6 0 R /Resources << /Font << /F1 7 0 R >> >> >>",
		pdfStream("BT /F1 18 Tf 20 100 Td (And page two) Tj ET"),
		"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
	}
	var b strings.Builder
	b.WriteString("%PDF-1.4\n")
	offsets := make([]int, len(objs))
	for i, o := range objs {
		offsets[i] = b.Len()
		fmt.Fprintf(&b, "%d 0 obj\n%s\nendobj\n", i+1, o)
	}
	xref := b.Len()
	fmt.Fprintf(&b, "xref\n0 %d\n0000000000 65535 f \n", len(objs)+1)
	for _, off := range offsets {
		fmt.Fprintf(&b, "%010d 00000 n \n", off)
	}
	fmt.Fprintf(&b, "trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n", len(objs)+1, xref)
	return []byte(b.String())
}

func pdfStream(s string) string {
	return fmt.Sprintf("<< /Length %d >>\nstream\n%s\nendstream", len(s), s)
}
