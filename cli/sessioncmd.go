package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/experimental"
	"github.com/toolhost/toolhost/internal/daemon"
	"github.com/toolhost/toolhost/internal/mcpserve"
	"github.com/toolhost/toolhost/internal/sessionapi"
)

// Sessions held between CLI calls live in the session daemon, `toolhost serve --daemon`,
// one per user, on a unix socket in $XDG_RUNTIME_DIR/toolhost (else
// $TMPDIR/toolhost-UID). `session start` starts it when none answers; it ends when its
// last session has ended and it has been idle for --exit-idle.

// daemonExitIdle is how long a daemon started on demand stays up with nothing to do.
const daemonExitIdle = time.Minute

// daemonStartBound bounds waiting for a daemon started on demand to answer (it loads the
// plugins, compiling them on a first run).
const daemonStartBound = 2 * time.Minute

// configDigest identifies what a session depends on in a configuration: everything but
// the project (each session names its own), the log level and serve's own keys. Two
// commands with the same digest may share the daemon's sessions.
func configDigest(cfg toolhost.Config) string {
	// Every key by its name, the modules' (store.dir, e2b.*) as well as the root's: a
	// module's section is not a field of Config that json.Marshal would see.
	values := map[string]any{}
	for _, k := range toolhost.ConfigKeys() {
		if k.Name == "project" || k.Name == "log_level" || k.Name == "log_format" || strings.HasPrefix(k.Name, "serve.") {
			continue
		}
		v, err := cfg.Get(k.Name)
		if err != nil {
			return ""
		}
		values[k.Name] = v
	}
	b, err := json.Marshal(values)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// sessionClient is a client of this user's session daemon; it does not start one.
func (c *cli) sessionClient() (*sessionapi.Client, string, error) {
	dir, err := daemon.Dir()
	if err != nil {
		return nil, "", err
	}
	sock := daemon.SocketPath(dir)
	dial := func(ctx context.Context) (net.Conn, error) { return daemon.DialContext(ctx, sock) }
	digest := ""
	if c.cfg != nil {
		digest = configDigest(c.cfg.Config)
	}
	return sessionapi.NewClient(dial, digest), dir, nil
}

// ensureDaemon returns a client of the session daemon, starting one when none answers.
func (c *cli) ensureDaemon(ctx context.Context) (*sessionapi.Client, error) {
	cl, dir, err := c.sessionClient()
	if err != nil {
		return nil, err
	}
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = cl.Info(ictx)
	cancel()
	if err == nil {
		return cl, nil
	}
	if !sessionapi.Unreachable(err) {
		return nil, fmt.Errorf("the session daemon: %w", err)
	}
	return cl, c.startDaemon(ctx, cl, dir)
}

// configFlags are the configuration flags this command was given (but --project), as
// arguments that give another toolhost process the same configuration.
func (c *cli) configFlags() []string {
	var args []string
	global := pflag.NewFlagSet("", pflag.ContinueOnError)
	globalFlags(global)
	c.flags.Visit(func(f *pflag.Flag) {
		switch f.Name {
		case "help", "version", "project":
			return
		}
		if global.Lookup(f.Name) == nil {
			return // the command's own flag
		}
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			args = append(args, "--"+f.Name+"="+strings.Join(sv.GetSlice(), ","))
			return
		}
		args = append(args, "--"+f.Name+"="+f.Value.String())
	})
	return args
}

// startDaemon starts `toolhost serve --daemon` with this command's configuration (its
// environment, its config file and the configuration flags it was given) and waits until
// it answers.
func (c *cli) startDaemon(ctx context.Context, cl *sessionapi.Client, dir string) error {
	exitIdle := daemonExitIdle
	if f := c.flags.Lookup("daemon-exit-idle"); f != nil {
		exitIdle, _ = c.flags.GetDuration("daemon-exit-idle")
	}
	start := time.Now()
	proc, err := c.spawnDaemon(dir, exitIdle)
	if err != nil {
		return err
	}
	exited := make(chan error, 1)
	// Owned by this command: it learns of an early exit, and is abandoned with the process
	// once the daemon answers (the daemon outlives the command by design).
	go func() { exited <- proc.Wait() }()
	deadline := time.NewTimer(daemonStartBound)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := cl.Info(ictx)
		cancel()
		if err == nil {
			c.log.Debug("session daemon started", "pid", proc.Process.Pid, "took", time.Since(start).Round(time.Millisecond), "log", daemon.LogPath(dir))
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case werr := <-exited:
			if werr != nil {
				return fmt.Errorf("the session daemon did not start (%v); its log %s ends: %s", werr, daemon.LogPath(dir), strings.TrimSpace(daemon.LogTail(dir, 300)))
			}
			exited = nil // another daemon won the race: it will answer
		case <-deadline.C:
			return fmt.Errorf("the session daemon did not answer within %s; see its log %s", daemonStartBound, daemon.LogPath(dir))
		case <-tick.C:
		}
	}
}

// sessionError turns an error of the daemon into the command's: a session or tool that
// does not exist is a usage mistake (exit 2).
func sessionError(cmd *command, err error) error {
	switch sessionapi.Status(err) {
	case http.StatusBadRequest, http.StatusNotFound:
		return usagef(cmd, "%v", err)
	}
	if sessionapi.Unreachable(err) {
		return usagef(cmd, "no session runs: the session daemon is not running (toolhost session start opens one)")
	}
	return err
}

func sessionStartCommand() *command {
	cmd := &command{
		words:   []string{"session", "start"},
		args:    "[--project P] [--workspace DIR]",
		summary: "open a session that outlives this command, and print its id",
		help: `Opens a session of the project: a sandbox kept alive, woken from the project's
newest snapshot (or working on DIR itself with --workspace), held by the session
daemon until "toolhost session stop ID", or until it has had no call for
--idle-timeout (serve.idle_timeout, 15m); at its end its workspace is committed. Prints the session's id on
stdout, to give "toolhost call --session ID TOOL JSON". Background processes keep
running between calls, so a dev server started with bash {"background": true} is
still there for take_screenshot.

The daemon ("toolhost serve --daemon", one per user, on a socket in
$XDG_RUNTIME_DIR/toolhost) is started when none runs, with this command's
configuration, and exits a minute after its last session ended.

Example:
  id=$(toolhost session start --project shop)
  toolhost call --session "$id" bash '{"command":"npm run dev","background":true}'
  toolhost call --session "$id" take_screenshot '{"port":3000}'
  toolhost session stop "$id"`,
		flags: func(fs *pflag.FlagSet) {
			fs.StringP("workspace", "w", "", "host directory mounted at /home/user (default: the project's private workspace, carried by its snapshots)")
			fs.String("format", "text", "output: text (the id) or json (the session)")
			fs.Duration("daemon-exit-idle", daemonExitIdle, "how long a daemon this command starts stays up with nothing held")
			fs.MarkHidden("daemon-exit-idle")
		},
		nargs: [2]int{0, 0},
	}
	cmd.run = func(ctx context.Context, c *cli, _ []string) error {
		format, err := textOrJSON(cmd, c)
		if err != nil {
			return err
		}
		ws, _ := c.flags.GetString("workspace")
		if ws != "" {
			if ws, err = workspaceDir(ws); err != nil {
				return usagef(cmd, "--workspace: %v", err)
			}
			if err := c.cfg.CheckWorkspace(ws, c.cfg.File); err != nil {
				return usagef(cmd, "--workspace: %v", err)
			}
		}
		idle := c.cfg.Serve.IdleTimeout // --idle-timeout
		req := sessionapi.StartRequest{Project: c.cfg.Project, Workspace: ws, IdleTimeoutMS: idle.Milliseconds()}
		var sess sessionapi.Held
		for attempt := 0; ; attempt++ {
			cl, err := c.ensureDaemon(ctx)
			if err != nil {
				return err
			}
			sess, err = cl.Start(ctx, req)
			cl.Close()
			// A daemon exiting as the request came (idle) answers 503 or goes away: start
			// another, a few times.
			if err != nil && attempt < 20 && (sessionapi.Status(err) == http.StatusServiceUnavailable || sessionapi.Unreachable(err)) {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			if err != nil {
				return sessionError(cmd, err)
			}
			break
		}
		if format == "json" {
			return writeJSON(c.stdout, sess, true)
		}
		fmt.Fprintln(c.stdout, sess.ID)
		where := "the project's private workspace"
		if sess.Workspace != "" {
			where = sess.Workspace
		} else if sess.WokeFrom != "" {
			where += ", woken from snapshot " + sess.WokeFrom
		}
		fmt.Fprintf(c.stderr, "session %s of project %s: %s; ready in %s\n", sess.ID, sess.Project, where,
			(time.Duration(sess.ReadyMS) * time.Millisecond).String())
		return nil
	}
	return cmd
}

func textOrJSON(cmd *command, c *cli) (string, error) {
	format, _ := c.flags.GetString("format")
	if format != "text" && format != "json" {
		return "", usagef(cmd, "--format must be text or json, got %q", format)
	}
	return format, nil
}

func sessionListCommand() *command {
	cmd := &command{
		words:   []string{"session", "list"},
		summary: "list the sessions the session daemon holds",
		help: `Lists the held sessions, oldest first: id, project, workspace, when each started,
its calls and how long since the last. Nothing runs: prints nothing (and says so on
stderr).`,
		flags: func(fs *pflag.FlagSet) {
			fs.String("format", "text", "output: text (a table) or json")
		},
		nargs: [2]int{0, 0},
	}
	cmd.run = func(ctx context.Context, c *cli, _ []string) error {
		format, err := textOrJSON(cmd, c)
		if err != nil {
			return err
		}
		sessions, err := c.heldSessions(ctx)
		if err != nil {
			return err
		}
		if format == "json" {
			return writeJSON(c.stdout, sessionapi.List{Sessions: sessions}, true)
		}
		if len(sessions) == 0 {
			fmt.Fprintln(c.stderr, "no sessions")
			return nil
		}
		tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tPROJECT\tWORKSPACE\tSTARTED\tCALLS\tIDLE")
		now := time.Now()
		for _, s := range sessions {
			ws := s.Workspace
			if ws == "" {
				ws = "(private)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", s.ID, s.Project, ws, s.Started.Local().Format(timeLayout), s.Calls,
				now.Sub(s.LastCall).Round(time.Second))
		}
		return tw.Flush()
	}
	return cmd
}

// heldSessions lists the daemon's sessions; none when no daemon runs.
func (c *cli) heldSessions(ctx context.Context) ([]sessionapi.Held, error) {
	cl, _, err := c.sessionClient()
	if errors.Is(err, daemon.ErrUnsupported) {
		return []sessionapi.Held{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	sessions, err := cl.List(ctx)
	if sessionapi.Unreachable(err) {
		return []sessionapi.Held{}, nil
	}
	return sessions, err
}

func sessionStopCommand() *command {
	cmd := &command{
		words:   []string{"session", "stop"},
		args:    "ID...",
		summary: "end held sessions: commit each workspace and close its sandbox",
		help: `Ends each session named (or every one with --all): its workspace is committed as
the project's newest snapshot, its sandbox and background processes stopped.`,
		flags: func(fs *pflag.FlagSet) {
			fs.Bool("all", false, "stop every held session")
		},
		nargs: [2]int{0, 1 << 10},
	}
	cmd.run = func(ctx context.Context, c *cli, ids []string) error {
		all, _ := c.flags.GetBool("all")
		switch {
		case all && len(ids) > 0:
			return usagef(cmd, "give session ids or --all, not both")
		case !all && len(ids) == 0:
			return usagef(cmd, "which session? give its id (toolhost session list) or --all")
		}
		if all {
			sessions, err := c.heldSessions(ctx)
			if err != nil {
				return err
			}
			for _, s := range sessions {
				ids = append(ids, s.ID)
			}
		}
		if len(ids) == 0 {
			fmt.Fprintln(c.stderr, "no sessions")
			return nil
		}
		cl, _, err := c.sessionClient()
		if err != nil {
			return err
		}
		defer cl.Close()
		var errs []error
		for _, id := range ids {
			snap, err := cl.Stop(ctx, id)
			if err != nil {
				errs = append(errs, sessionError(cmd, err))
				continue
			}
			switch {
			case snap.Key == "":
				fmt.Fprintf(c.stdout, "stopped %s\n", id)
			case snap.Unchanged:
				fmt.Fprintf(c.stdout, "stopped %s: unchanged since snapshot %s\n", id, snap.Key)
			default:
				fmt.Fprintf(c.stdout, "stopped %s: committed snapshot %s (%s)\n", id, snap.Key, humanBytes(snap.Bytes))
			}
		}
		return errors.Join(errs...)
	}
	return cmd
}

func sessionCommitCommand() *command {
	cmd := &command{
		words:   []string{"session", "commit"},
		args:    "ID",
		summary: "save a snapshot of a held session's workspace now",
		flags: func(fs *pflag.FlagSet) {
			fs.String("label", "", "what the snapshot holds")
		},
		nargs: [2]int{1, 1},
	}
	cmd.run = func(ctx context.Context, c *cli, args []string) error {
		cl, _, err := c.sessionClient()
		if err != nil {
			return err
		}
		defer cl.Close()
		label, _ := c.flags.GetString("label")
		snap, err := cl.Commit(ctx, args[0], label)
		if err != nil {
			return sessionError(cmd, err)
		}
		if snap.Unchanged {
			fmt.Fprintf(c.stdout, "%s (unchanged)\n", snap.Key)
			return nil
		}
		fmt.Fprintf(c.stdout, "%s (%s)\n", snap.Key, humanBytes(snap.Bytes))
		return nil
	}
	return cmd
}

// callHeld runs a call in a held session: the whole of `toolhost call --session`, which
// needs no plugin, store or sandbox of its own.
func (c *cli) callHeld(ctx context.Context, cmd *command, cl *sessionapi.Client, id, tool string, input []byte) error {
	res, err := cl.Call(ctx, id, tool, json.RawMessage(input))
	if err != nil {
		return sessionError(cmd, err)
	}
	if res.Content == nil {
		res.Content = []abi.Content{}
	}
	return writeJSON(c.stdout, res, false)
}

// daemonProbeBound bounds a plain call's question to the session daemon (is it there,
// with this configuration?): a daemon that does not answer within it (one still loading
// its plugins) is left alone, and the call runs in its own process.
const daemonProbeBound = time.Second

// projectSession finds what should take a plain `toolhost call`: the one held session
// of the configured project (cl and its id), or, when there is none, the session daemon
// running this configuration (cl, id ""), or nothing (cl nil: no daemon, one that does
// not answer or runs another configuration, or a held session of the project on another
// workspace than ws). It is an error when the project has several held sessions, or when
// what is on the daemon's socket is not this user's daemon.
func (c *cli) projectSession(ctx context.Context, cmd *command, ws string) (*sessionapi.Client, string, error) {
	cl, _, err := c.sessionClient()
	if err != nil {
		return nil, "", nil
	}
	ictx, cancel := context.WithTimeout(ctx, daemonProbeBound)
	info, err := cl.Info(ictx)
	cancel()
	if errors.Is(err, daemon.ErrUntrusted) { // something else on the daemon's socket: say so
		cl.Close()
		return nil, "", err
	}
	c.noDaemon = sessionapi.Unreachable(err)
	if err != nil || info.ConfigDigest != configDigest(c.cfg.Config) {
		cl.Close()
		return nil, "", nil
	}
	sessions, err := cl.List(ctx)
	if err != nil {
		cl.Close()
		return nil, "", nil
	}
	var ids []string
	other := false // a held session of the project on another workspace
	for _, s := range sessions {
		if s.Project == c.cfg.Project {
			if ws == "" || ws == s.Workspace {
				ids = append(ids, s.ID)
			} else {
				other = true
			}
		}
	}
	switch len(ids) {
	case 0:
		if other { // it holds the project's lease: the call runs, and fails, as before
			cl.Close()
			return nil, "", nil
		}
		return cl, "", nil
	case 1:
		return cl, ids[0], nil
	}
	cl.Close()
	slices.Sort(ids)
	return nil, "", usagef(cmd, "project %s has %d sessions (%s): choose one with --session", c.cfg.Project, len(ids), strings.Join(ids, ", "))
}

// callDaemon asks the session daemon (cl, which runs this configuration) to run a plain
// call as this process would (oneShot) and prints its result. served is false when the
// daemon ran nothing and said so (another configuration, shutting down, a daemon without
// one-shot calls) or could not be reached before the request was sent: the caller runs
// the call itself. A daemon that went away once the request was on its way may have run
// the call: that is an error, never a call run again.
func (c *cli) callDaemon(ctx context.Context, cmd *command, cl *sessionapi.Client, ws, tool string, input []byte) (served bool, err error) {
	var sent atomic.Bool
	tctx := httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteHeaders: func() { sent.Store(true) },
	})
	res, err := cl.OneShot(tctx, sessionapi.OneShotRequest{Project: c.cfg.Project, Workspace: ws, Tool: tool, Input: input})
	switch st := sessionapi.Status(err); {
	case err == nil:
		c.log.Debug("call: served by the session daemon")
		return true, writeJSON(c.stdout, res, false)
	case st == http.StatusPreconditionFailed, st == http.StatusServiceUnavailable, st == http.StatusNotFound, st == http.StatusMethodNotAllowed,
		st == 0 && !sent.Load() && !errors.Is(err, daemon.ErrUntrusted) && ctx.Err() == nil:
		c.log.Debug("call: the session daemon did not take it; running it here", "err", err)
		return false, nil
	case st == 0 && sessionapi.Unreachable(err):
		return true, fmt.Errorf("the session daemon went away during the call, which may have run: check its effects before calling %s again (its log: %s): %w",
			tool, c.daemonLog(), err)
	}
	return true, sessionError(cmd, err)
}

// daemonLog is the session daemon's log file, for a message.
func (c *cli) daemonLog() string {
	dir, err := daemon.Dir()
	if err != nil {
		return "none"
	}
	return daemon.LogPath(dir)
}

// daemonOneShots runs the session daemon's one-shot calls (mcpserve.Options.OneShot) on
// a Toolhost of its own: the configuration with the editfile guard off, as a call's own
// process has it (oneShotGuard), beside the held sessions' Toolhost, which keeps it on.
func (c *cli) daemonOneShots(th *toolhost.Toolhost) func(ctx context.Context, r sessionapi.OneShotRequest) (abi.Result, error) {
	return func(ctx context.Context, r sessionapi.OneShotRequest) (abi.Result, error) {
		var res abi.Result
		err := c.oneShot(ctx, th, r.Project, r.Workspace, r.Tool, r.Input, c.log, func(got abi.Result) error {
			res = got
			return nil
		})
		if _, ok := errors.AsType[*errUnknownTool](err); ok {
			return abi.Result{}, mcpserve.APIError(http.StatusBadRequest, err)
		}
		return res, err
	}
}

// spawnDaemon starts `toolhost serve --daemon --exit-idle exitIdle` with this command's
// configuration, in a session of its own, its output to its log in dir (daemon.Start).
func (c *cli) spawnDaemon(dir string, exitIdle time.Duration) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("starting the session daemon: %w", err)
	}
	args := append([]string{"serve", "--daemon", "--exit-idle", exitIdle.String()}, c.configFlags()...)
	wd, err := os.Getwd()
	if err != nil {
		wd = "/"
	}
	return daemon.Start(exe, args, os.Environ(), wd, daemon.LogPath(dir))
}

// serveDaemon is `toolhost serve --daemon`: the session API on this user's socket.
func serveDaemon(ctx context.Context, c *cli, exitIdle time.Duration) error {
	dir, err := daemon.Dir()
	if err != nil {
		return err
	}
	ln, err := daemon.Listen(dir, 30*time.Second, c.log)
	if errors.Is(err, daemon.ErrRunning) {
		c.log.Info("session daemon: another one serves this user; exiting", "dir", dir)
		return nil
	}
	if err != nil {
		return err
	}
	defer ln.Close()
	digest := configDigest(c.cfg.Config) // before oneShotGuard's change, as a client's
	th, err := c.newToolhost(ctx)
	if err != nil {
		return err
	}
	defer c.closeToolhost(ctx, th)
	// The plain calls' Toolhost: the editfile guard off, as in a call's own process.
	oneCfg := c.cfg.Config
	oneCfg.Plugins = slices.Clone(oneCfg.Plugins)
	oneShotGuard(&oneCfg)
	oneTh, err := toolhost.New(ctx, oneCfg, c.options()...)
	if err != nil {
		return err
	}
	defer c.closeToolhost(ctx, oneTh)
	// Every plugin compiled into the cache (under the data dir's compile lock, one
	// compile at a time, as the compile a call hands to a process of its own) and loaded
	// in both before the first one-shot call is taken: a call that the daemon takes pays
	// for none of it. Held sessions are served meanwhile, as before.
	ready := make(chan struct{})
	cctx, cancel := context.WithCancel(ctx)
	var compiling sync.WaitGroup
	defer func() { cancel(); compiling.Wait() }() // before the Toolhosts close
	compiling.Go(func() {
		err := compileLocked(cctx, c.cfg.DataDir, func() error {
			return errors.Join(experimental.CompilePlugins(cctx, th), experimental.CompilePlugins(cctx, oneTh))
		})
		if err != nil {
			c.log.Warn("session daemon: compiling the plugins", "err", err)
			return // one-shot calls stay in their callers' processes
		}
		c.log.Debug("session daemon: plugins compiled; taking one-shot calls")
		close(ready)
	})
	s := mcpserve.New(th, mcpserve.Options{Logger: c.log, ConfigDigest: digest,
		MaxSessions: c.cfg.Serve.MaxSessions, OneShot: c.daemonOneShots(oneTh), OneShotReady: ready})
	return s.ServeDaemon(ctx, ln, exitIdle, shutdownGrace)
}
