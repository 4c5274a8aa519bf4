package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/spf13/pflag"
)

// mcpClients are the clients `toolhost mcp config` writes for.
var mcpClients = []string{"claude-code", "claude-desktop", "cursor"}

func mcpConfigCommand() *command {
	cmd := &command{
		words:   []string{"mcp", "config"},
		args:    "CLIENT",
		summary: "print the MCP configuration of Claude Code, Claude Desktop or Cursor for this binary",
		help: `Prints what CLIENT (claude-code, claude-desktop or cursor) needs to start this
toolhost as its MCP server over stdio: the binary's real path, "mcp", the project
(--project) and the workspace, the current directory unless --workspace names another
(--private: the project's private workspace instead). Configuration flags given here
(--config, --store-dir...) are passed on.

  claude-code     a "claude mcp add" command line to run
  claude-desktop  the mcpServers entry of claude_desktop_config.json
  cursor          the mcpServers entry of .cursor/mcp.json in the project

Example:
  cd ~/src/shop && toolhost mcp config claude-code --project shop | sh`,
		flags: func(fs *pflag.FlagSet) {
			fs.StringP("workspace", "w", "", "host directory the session works on (default: the current directory)")
			fs.Bool("private", false, "use the project's private workspace instead of a host directory")
			fs.String("name", "toolhost", "the server's name in the client")
		},
		nargs: [2]int{1, 1},
	}
	cmd.run = func(ctx context.Context, c *cli, args []string) error {
		client := args[0]
		if !containsString(mcpClients, client) {
			return usagef(cmd, "unknown client %q (clients: %s)", client, strings.Join(mcpClients, ", "))
		}
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		if real, err := filepath.EvalSymlinks(exe); err == nil {
			exe = real
		}
		name, _ := c.flags.GetString("name")
		argv := []string{"mcp", "--project", c.cfg.Project}
		if private, _ := c.flags.GetBool("private"); !private {
			ws, _ := c.flags.GetString("workspace")
			if ws, err = workspaceDir(ws); err != nil {
				return usagef(cmd, "--workspace: %v", err)
			}
			if err := c.cfg.CheckWorkspace(ws, c.cfg.File); err != nil {
				return usagef(cmd, "--workspace: %v", err)
			}
			argv = append(argv, "--workspace", ws)
		}
		argv = append(argv, c.configFlags()...)
		switch client {
		case "claude-code":
			line := []string{"claude", "mcp", "add", shellQuote(name), "--", shellQuote(exe)}
			for _, a := range argv {
				line = append(line, shellQuote(a))
			}
			fmt.Fprintln(c.stdout, strings.Join(line, " "))
			return nil
		case "claude-desktop":
			fmt.Fprintf(c.stderr, "Add this server to %s, then restart Claude Desktop.\n", desktopConfigPath())
		case "cursor":
			fmt.Fprintln(c.stderr, "Add this server to .cursor/mcp.json in the project (or ~/.cursor/mcp.json for every project).")
		}
		return writeJSON(c.stdout, map[string]any{"mcpServers": map[string]any{
			name: map[string]any{"command": exe, "args": argv}}}, true)
	}
	return cmd
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// desktopConfigPath is where Claude Desktop reads its configuration on this platform.
func desktopConfigPath() string {
	switch runtime.GOOS {
	case "darwin":
		return "~/Library/Application Support/Claude/claude_desktop_config.json"
	case "windows":
		return `%APPDATA%\Claude\claude_desktop_config.json`
	}
	return "~/.config/Claude/claude_desktop_config.json"
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=@%+,", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
