package mcpserve

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// toolReply is one tool result as agenttools.cjs reports it.
type toolReply struct {
	IsError bool
	Text    string
	Images  []struct {
		MIMEType      string
		Bytes         int
		Width, Height int
	}
}

// TestNPMClientAgentTools: the agent tools through MCP, driven by the official TypeScript
// SDK's client (testdata/npmclient/agenttools.cjs): every new tool once, as a client that
// knows nothing of toolhost sees it.
func TestNPMClientAgentTools(t *testing.T) {
	node, dir := npmClient(t)
	s, _ := newServer(t, testConfig(t), Options{Tokens: []Token{{Name: "node", Value: tokenA}}})
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	script, err := filepath.Abs("testdata/npmclient/agenttools.cjs")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), npmScriptBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "TOOLHOST_MCP_CLIENT_DIR=" + dir, npmRequestEnv,
		"MCP_URL=" + srv.URL + "/mcp", "MCP_TOKEN=" + tokenA}
	pdf := false
	if _, err := exec.LookPath("pdftotext"); err == nil {
		pdf = true
		cmd.Env = append(cmd.Env, "PDF_B64="+base64.StdEncoding.EncodeToString(twoPagePDF()))
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node agenttools.cjs: %v\n%s", err, stderr.String())
	}
	var got struct {
		Tools                                          []string
		Cd, Pwd, BgOutput, BgKill                      toolReply
		ReplDefine, ReplCall, ReplInterrupt, ReplExit  string
		Patch, PatchResult, GuardRefused, GuardAllowed toolReply
		Draw, PNG, Notebook, PDF                       toolReply
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for _, want := range []string{"bash", "bash_output", "bash_kill", "exec_command", "write_stdin", "apply_patch", "read_file", "edit_file"} {
		if !slices.Contains(got.Tools, want) {
			t.Errorf("the npm client does not list %s: %v", want, got.Tools)
		}
	}
	check := func(name string, r toolReply, isErr bool, wants ...string) {
		t.Helper()
		if r.IsError != isErr {
			t.Errorf("%s: is_error %v, want %v: %q", name, r.IsError, isErr, r.Text)
		}
		for _, w := range wants {
			if !strings.Contains(r.Text, w) {
				t.Errorf("%s: %q does not contain %q", name, r.Text, w)
			}
		}
	}
	check("cd", got.Cd, false, "[cwd is now /home/user/src]")
	check("pwd", got.Pwd, false, "/home/user/src\n")
	check("bash_output", got.BgOutput, false, "started-in-bg", "running, pid")
	check("bash_kill", got.BgKill, false, "stopped with SIGTERM")
	for name, pair := range map[string][2]string{"define": {got.ReplDefine, ">>>"}, "call": {got.ReplCall, "42"},
		"interrupt": {got.ReplInterrupt, "KeyboardInterrupt"}, "exit": {got.ReplExit, "exited with code 0"}} {
		if !strings.Contains(pair[0], pair[1]) {
			t.Errorf("python %s: %q does not contain %q", name, pair[0], pair[1])
		}
	}
	check("apply_patch", got.Patch, false, "M p/a.txt", "A p/b.txt")
	check("after the patch", got.PatchResult, false, "one\n2\nbee\n")
	check("edit of an unread file", got.GuardRefused, true, "has not been read in this session")
	check("edit after read_file", got.GuardAllowed, false, "File edited: p/c.txt")
	check("draw", got.Draw, false, "[exit 0]")
	check("read_file of a PNG", got.PNG, false, "PNG, 120x80")
	if len(got.PNG.Images) != 1 || got.PNG.Images[0].MIMEType != "image/png" || got.PNG.Images[0].Width != 120 || got.PNG.Images[0].Height != 80 {
		t.Errorf("read_file of a PNG: images %+v", got.PNG.Images)
	}
	check("read_file of a notebook", got.Notebook, false, "[notebook /home/user/n.ipynb: 1 cell]", "print('nb out')", "nb out")
	if pdf {
		check("read_file of a PDF", got.PDF, false, "--- page 1 ---\nHello from page one", "--- page 2 ---\nAnd page two")
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
