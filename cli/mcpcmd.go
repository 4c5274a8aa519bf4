package cli

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/spf13/pflag"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/internal/fleet"
	"github.com/toolhost/toolhost/internal/mcpserve"
	"github.com/toolhost/toolhost/internal/rootapi"
)

// shutdownGrace bounds committing every session and closing every sandbox at the end.
const shutdownGrace = 5 * time.Minute

func mcpCommand() *command {
	cmd := &command{
		words:   []string{"mcp"},
		traces:  true,
		summary: "serve the tools to one MCP client on stdio",
		help: `Serves the tools over the Model Context Protocol on stdin and stdout, for an MCP
client that starts toolhost itself (Claude Code, Claude Desktop, Cursor, Zed...). The
session is the configured project's: on the first tool call a sandbox starts, woken
from the project's newest snapshot, and stays up (kept alive, rotated) until the
client goes; its workspace is then committed and the sandbox closed. The tool
commit {"label": "..."} saves a snapshot at any time. Logs go to stderr, never stdout.

With --workspace DIR the session works on DIR itself (the repository the client has
open), mounted as the sandbox's /home/user with its owners kept, instead of the
project's private workspace; DIR is still committed as the project's snapshots.

"toolhost mcp config CLIENT" prints the configuration for Claude Code, Claude Desktop
or Cursor with this binary's path.

Example (.mcp.json or claude_desktop_config.json):
  {"mcpServers": {"toolhost": {"command": "/usr/local/bin/toolhost", "args": ["mcp", "--project", "shop", "--workspace", "/home/me/src/shop"]}}}`,
		flags: func(fs *pflag.FlagSet) {
			fs.StringP("workspace", "w", "", "host directory the session works on (default: the project's private workspace)")
		},
		nargs: [2]int{0, 0},
	}
	cmd.run = func(ctx context.Context, c *cli, _ []string) error {
		ws, _ := c.flags.GetString("workspace")
		if ws != "" {
			var err error
			if ws, err = workspaceDir(ws); err != nil {
				return usagef(cmd, "--workspace: %v", err)
			}
			if err := c.cfg.CheckWorkspace(ws, c.cfg.File); err != nil {
				return usagef(cmd, "--workspace: %v", err)
			}
		}
		out, err := c.protocolStdout()
		if err != nil {
			return err
		}
		th, err := c.newToolhost(ctx)
		if err != nil {
			return err
		}
		defer c.closeToolhost(ctx, th)
		opts := mcpserve.Options{Logger: c.log}
		if ws != "" {
			opts.Workspaces = map[string]string{th.Config().Project: ws}
		}
		s := mcpserve.New(th, opts)
		c.log.Debug("mcp: serving on stdio", "project", th.Config().Project)
		return s.Serve(ctx, mcpserve.StdioTransport(c.stdin, out, 0, c.log))
	}
	return cmd
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

func serveCommand() *command {
	cmd := &command{
		words:   []string{"serve"},
		traces:  true,
		summary: "serve the tools to many MCP clients over streamable HTTP",
		help: `Serves the tools over the Model Context Protocol's streamable HTTP transport at
http://ADDR/mcp (--listen, serve.listen), with /healthz and /metrics (Prometheus text).
Each MCP session is one session of a project: the Toolhost-Project header (or
?project=) of the request that opens it, else the token's first project, else
--project. Its sandbox starts on the first call, woken from the project's newest
snapshot; when the session ends (the client closes it, it idles past
serve.idle_timeout, or the server gets SIGTERM or SIGINT) its workspace is committed
and its sandbox closed.

Clients send "Authorization: Bearer TOKEN" with a token of serve.tokens or
serve.tokens_file; a token may name the projects it opens. Without tokens only a
loopback address is served.

With --daemon it is instead this user's session daemon, which holds the sessions of
"toolhost session start" on a unix socket in $XDG_RUNTIME_DIR/toolhost (else
$TMPDIR/toolhost-UID), mode 0600, answering only processes of this user. "session
start" starts it when none runs; --exit-idle ends it when it has held nothing for that
long.

Example:
  (umask 077; openssl rand -hex 32 | sed 's/$/ shop/' > ~/.config/toolhost/tokens)
  toolhost serve --listen :8750 --tokens-file ~/.config/toolhost/tokens`,
		flags: func(fs *pflag.FlagSet) {
			fs.Bool("daemon", false, "serve this user's held sessions on a unix socket instead (the session daemon)")
			fs.Duration("exit-idle", 0, "with --daemon: exit when nothing was held or asked for this long (0: never)")
		},
		nargs: [2]int{0, 0},
	}
	cmd.run = func(ctx context.Context, c *cli, _ []string) error {
		if d, _ := c.flags.GetBool("daemon"); d {
			idle, _ := c.flags.GetDuration("exit-idle")
			return serveDaemon(ctx, c, idle)
		}
		sc := c.cfg.Serve
		var tokens []mcpserve.Token
		for i, t := range sc.Tokens {
			tokens = append(tokens, mcpserve.Token{Name: fmt.Sprintf("serve.tokens[%d]", i), Value: string(t.Token), Projects: t.Projects, Egress: t.Egress})
		}
		if sc.TokensFile != "" {
			ft, err := mcpserve.ReadTokensFile(sc.TokensFile)
			if err != nil {
				return usagef(cmd, "serve.tokens_file: %v", err)
			}
			tokens = append(tokens, ft...)
		}
		if err := mcpserve.CheckTokens(tokens); err != nil {
			return usagef(cmd, "%v", err)
		}
		if err := mcpserve.CheckListen(sc.Listen, len(tokens)); err != nil {
			return usagef(cmd, "%v", err)
		}
		if err := mcpserve.CheckNetwork(c.cfg.Sandbox.Network, len(tokens)); err != nil {
			return usagef(cmd, "%v", err)
		}
		for project, dir := range sc.Workspaces {
			if err := c.cfg.CheckWorkspace(dir, c.cfg.File); err != nil {
				return usagef(cmd, "serve.workspaces.%s: %v", project, err)
			}
		}
		th, err := c.newToolhost(ctx)
		if err != nil {
			return err
		}
		defer c.closeToolhost(ctx, th)
		opts := mcpserve.Options{Tokens: tokens, MaxSessions: sc.MaxSessions, IdleTimeout: sc.IdleTimeout,
			MaxBodyBytes: sc.MaxBodyBytes, Logger: c.log, Workspaces: sc.Workspaces, Drain: sc.Drain}
		if sc.InFleet() {
			f, err := joinFleet(ctx, c, th)
			if err != nil {
				return err
			}
			defer f.Close(context.WithoutCancel(ctx))
			opts.Fleet, opts.OrphanAfter = f, sc.Fleet.OrphanAfter
		}
		s := mcpserve.New(th, opts)
		return s.ListenAndServe(ctx, sc.Listen, shutdownGrace, func(a net.Addr) {
			fmt.Fprintf(c.stderr, "toolhost serve: listening on http://%s/mcp\n", a)
		})
	}
	return cmd
}

// joinFleet makes this serve a replica of the fleet that shares its store
// (serve.fleet.*).
func joinFleet(ctx context.Context, c *cli, th *toolhost.Toolhost) (*fleet.Fleet, error) {
	fc := c.cfg.Serve.Fleet
	secret, err := fleet.ReadSecret(fc.SecretFile)
	if err != nil {
		return nil, fmt.Errorf("serve.fleet.secret_file: %w", err)
	}
	var peers []netip.Prefix
	for _, p := range fc.Peers {
		pr, err := netip.ParsePrefix(p)
		if err != nil {
			return nil, fmt.Errorf("serve.fleet.peers: %q: %w", p, err)
		}
		peers = append(peers, pr.Masked())
	}
	jctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	f, err := fleet.Join(jctx, fleet.Config{Advertise: fc.Advertise, Secret: secret, Peers: peers,
		Store: rootapi.Store(th), Logger: c.log})
	if err != nil {
		return nil, err
	}
	c.log.Info("fleet: joined", "instance", f.Instance(), "advertise", f.Advertise())
	return f, nil
}
