//go:build linux

package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolhost/toolhost/internal/testenv"
)

// npmMCPClient finds node and the official MCP TypeScript SDK that
// scripts/setup-mcp-client.sh installs; without them the test skips, saying so (on CI it
// fails).
func npmMCPClient(t *testing.T) (node, dir string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		testenv.Skipf(t, "node is not installed (Node.js >= 20 runs the MCP SDK's client): %v", err)
	}
	pkg, err := os.ReadFile(filepath.Join(moduleRoot, "internal", "mcpserve", "testdata", "npmclient", "package.json"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`"@modelcontextprotocol/sdk": "([0-9.]+)"`).FindSubmatch(pkg)
	if m == nil {
		t.Fatal("the npm client's package.json pins no @modelcontextprotocol/sdk version")
	}
	dir = os.Getenv("TOOLHOST_MCP_CLIENT_DIR")
	if dir == "" {
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".cache", "toolhost", "mcp-client", string(m[1]))
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk", "package.json")); err != nil {
		testenv.Skipf(t, "the MCP SDK %s is not installed in %s (run scripts/setup-mcp-client.sh): %v", m[1], dir, err)
	}
	return node, dir
}

// owner is a file's uid and gid.
func owner(t *testing.T, path string) [2]uint32 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	sys := st.Sys().(*syscall.Stat_t)
	return [2]uint32{sys.Uid, sys.Gid}
}

// TestMCPWorkspaceNPM: an editor's MCP client (the official TypeScript SDK, starting the
// server over stdio from the command `toolhost mcp config cursor` printed) works on the
// user's own directory: the files it writes appear there, a file that was there is
// changed in place, and the directory is committed as the project's snapshot at the end.
func TestMCPWorkspaceNPM(t *testing.T) {
	requireBwrap(t)
	node, sdkDir := npmMCPClient(t)
	t.Parallel()
	ws := t.TempDir()
	existing := filepath.Join(ws, "existing.txt")
	if err := os.WriteFile(existing, []byte("was here\n"), 0o666); err != nil {
		t.Fatal(err)
	}
	os.Chmod(existing, 0o666) // the sandbox user may append; its owner is what must not change
	before := owner(t, existing)
	store := t.TempDir()

	// The configuration a Cursor user would paste, made by the CLI itself.
	r := runCLIIn(t, ws, []string{"TOOLHOST_STORE_DIR=" + store}, "mcp", "config", "cursor", "--project", "repo", "--log-level", "warn")
	var conf struct {
		MCPServers map[string]struct {
			Command string
			Args    []string
		} `json:"mcpServers"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &conf) != nil || conf.MCPServers["toolhost"].Command == "" {
		t.Fatalf("mcp config cursor: %s", r)
	}
	srv := conf.MCPServers["toolhost"]
	if !filepath.IsAbs(srv.Command) || !slices.Contains(srv.Args, ws) || !slices.Contains(srv.Args, "--workspace") {
		t.Fatalf("the configuration does not give the binary's path and the workspace: %+v", srv)
	}
	args, _ := json.Marshal(append(srv.Args, "--log-level=warn"))

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join(moduleRoot, "cli", "testdata", "mcpstdio", "check.cjs"))
	cmd.Dir = t.TempDir()
	cmd.Env = cliEnv(t, "TOOLHOST_MCP_CLIENT_DIR="+sdkDir, "TOOLHOST_STORE_DIR="+store,
		"MCP_COMMAND="+srv.Command, "MCP_ARGS="+string(args))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node check.cjs: %v\n%s", err, stderr.String())
	}
	var got struct {
		Tools       []string
		Write, Bash struct {
			IsError bool
			Text    string
		}
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got.Write.IsError || got.Bash.IsError || !strings.Contains(got.Bash.Text, "existing.txt") {
		t.Fatalf("the calls: %+v\n%s", got, stderr.String())
	}
	if b, err := os.ReadFile(filepath.Join(ws, "from-mcp", "new.txt")); err != nil || string(b) != "written over MCP\n" {
		t.Errorf("the file written over MCP is not in the directory: %q %v", b, err)
	}
	if b, _ := os.ReadFile(existing); string(b) != "was here\nappended\n" {
		t.Errorf("existing.txt: %q", b)
	}
	// Owners kept (the local provider attaches the directory through an idmapped mount):
	// the file that was there keeps its owner, and what the sandbox made belongs to the
	// directory's owner, not to the sandbox user.
	if after := owner(t, existing); after != before {
		t.Errorf("existing.txt changed owner: %v -> %v", before, after)
	}
	if made, dir := owner(t, filepath.Join(ws, "from-mcp", "new.txt")), owner(t, ws); made != dir {
		t.Errorf("the file written over MCP is owned by %v, the directory by %v", made, dir)
	}
	if n := snapshots(t, store, "repo"); n != 1 {
		t.Errorf("%d snapshots of the project after the session, want 1 (the commit at its end)", n)
	}
}

// TestMCPPipedStdin: requests written to toolhost mcp's stdin, which then ends, all get
// their answers before it exits (a tool call included).
func TestMCPPipedStdin(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	lines := []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"sh","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":"three","method":"tools/call","params":{"name":"bash","arguments":{"command":"sleep 1; echo piped"}}}`,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, toolBin, "mcp", "--project", "piped", "--log-level", "warn")
	cmd.Dir = t.TempDir()
	cmd.Env = cliEnv(t, "TOOLHOST_STORE_DIR="+t.TempDir())
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("toolhost mcp: %v\n%s", err, stderr.String())
	}
	ids := map[string]json.RawMessage{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var msg struct {
			ID     json.RawMessage
			Result json.RawMessage
		}
		if err := json.Unmarshal(sc.Bytes(), &msg); err != nil {
			t.Fatalf("not JSON-RPC: %q", sc.Text())
		}
		ids[string(msg.ID)] = msg.Result
	}
	for _, id := range []string{"1", "2", `"three"`} {
		if ids[id] == nil {
			t.Errorf("no answer to request %s; stdout:\n%s\nstderr:\n%s", id, out, stderr.String())
		}
	}
	if !strings.Contains(string(ids[`"three"`]), "piped") {
		t.Errorf("the tool call's answer: %s", ids[`"three"`])
	}
}

// TestMCPConfigClaudeCode: the claude mcp add line names the binary's real path and the
// workspace, and what follows its -- starts a working server (checked with the Go SDK's
// client).
func TestMCPConfigClaudeCode(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	ws := t.TempDir()
	store := t.TempDir()
	r := runCLIIn(t, ws, []string{"TOOLHOST_STORE_DIR=" + store}, "mcp", "config", "claude-code", "--project", "cc")
	line := strings.TrimSpace(r.stdout)
	if r.code != 0 || !strings.HasPrefix(line, "claude mcp add toolhost -- /") {
		t.Fatalf("mcp config claude-code: %s", r)
	}
	argv := strings.Fields(line[strings.Index(line, " -- ")+4:])
	if argv[0] != toolBin && !strings.HasSuffix(argv[0], "/toolhost") {
		t.Errorf("the command is %q, not the binary", argv[0])
	}
	if !slices.Contains(argv, ws) {
		t.Errorf("the command %v does not work on %s", argv, ws)
	}
	cmd := exec.Command(argv[0], append(argv[1:], "--log-level", "warn")...)
	cmd.Env = cliEnv(t, "TOOLHOST_STORE_DIR="+store)
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "write_file", Arguments: map[string]any{"path": "cc.txt", "content": "from claude code\n"}})
	if err != nil || res.IsError {
		t.Fatalf("write_file: %v %s", err, mcpText(res))
	}
	cs.Close()
	if b, err := os.ReadFile(filepath.Join(ws, "cc.txt")); err != nil || string(b) != "from claude code\n" {
		t.Errorf("cc.txt: %q %v", b, err)
	}
	oneLineError(t, runCLIIn(t, ws, nil, "mcp", "config", "vim"), 2, `unknown client "vim"`)
}

// TestMCPBadLines: a line on toolhost mcp's stdin that is too long, or is not a JSON-RPC
// message, is answered with a JSON-RPC error (the request's id when it can be read, else
// null) and the server goes on to answer the requests after it.
func TestMCPBadLines(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	big := strings.Repeat("a", 20<<20)
	lines := []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"sh","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"write_file","arguments":{"path":"big.txt","content":"` + big + `"}}}`,
		`garbage`,
		`{"jsonrpc":"2.0","id":4,"method":"tools/list"}`,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, toolBin, "mcp", "--project", "badlines", "--log-level", "error")
	cmd.Dir = t.TempDir()
	cmd.Env = cliEnv(t, "TOOLHOST_STORE_DIR="+t.TempDir())
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("toolhost mcp: %v\n%s", err, stderr.String())
	}
	type answer struct {
		Result json.RawMessage
		Error  *struct {
			Code    int
			Message string
		}
	}
	byID := map[string]answer{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var msg struct {
			ID json.RawMessage
			answer
		}
		if err := json.Unmarshal(sc.Bytes(), &msg); err != nil {
			t.Fatalf("not JSON-RPC: %q", sc.Text())
		}
		byID[string(msg.ID)] = msg.answer
	}
	if a := byID["3"]; a.Error == nil || !strings.Contains(a.Error.Message, "request too large") || !strings.Contains(a.Error.Message, "16.0 MiB") {
		t.Errorf("the 20 MiB request's answer: %+v", a)
	}
	if a := byID["null"]; a.Error == nil || a.Error.Code != -32700 {
		t.Errorf("the line that is not JSON: %+v", a)
	}
	if a := byID["4"]; !strings.Contains(string(a.Result), `"write_file"`) {
		t.Errorf("tools/list after the bad lines: %+v\nstderr:\n%s", a, stderr.String())
	}
}
