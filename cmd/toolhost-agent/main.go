//go:build linux

// Command toolhost-agent is the sandbox data plane's agent as a program of its own: the
// envd-compatible server (package agent) that a local sandbox runs as its pid 1 by
// re-executing the host's binary, built alone so that a remote provider (a pod, a VM) can
// ship it into its sandboxes and reach it over TCP.
//
//	toolhost-agent --listen 0.0.0.0:49983 --workspace /home/user
//
// It serves until SIGTERM or SIGINT. With the variable TOOLHOST_AGENT_TOKEN set (the
// kubernetes provider sets it in each pod), it answers only requests that carry that token
// in X-Access-Token (the health check excepted), removes the variable from its environment
// before it starts anything, and makes itself undumpable, so the commands it runs (the
// same user) cannot read the token from /proc/1/environ nor take its descriptors. Without
// the variable it trusts whoever can reach its address: put it where only the host can.
//
// With TOOLHOST_AGENT_POOL_TOKEN instead (a pod of a warm pool: every pod of the pool has
// the same), and TOOLHOST_AGENT_POD naming its pod, it starts unclaimed: it answers only the
// health check and one claim (POST /toolhost/claim) carrying the pool's token, which names
// this pod and gives the sandbox's own token; both variables are removed the same way.
//
// With TOOLHOST_AGENT_EGRESS_RELAY=HOST:PORT (the kubernetes provider sets it in the pods of
// sandboxes with sandbox.network egress) it listens on 127.0.0.1:3128 before anything
// runs and carries each connection to that address, the host's egress gateway, named by
// the key of its access token (envd.EgressKey): the sandbox's way out, as a local
// sandbox's agent hands its connections to the host.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/envd/agent"
	"golang.org/x/sys/unix"
)

// envToken is the variable that holds the access token; envPoolToken a warm pool's token,
// envPod the pod's name.
const (
	envToken     = "TOOLHOST_AGENT_TOKEN"
	envPoolToken = "TOOLHOST_AGENT_POOL_TOKEN"
	envPod       = "TOOLHOST_AGENT_POD"
	envRelay     = "TOOLHOST_AGENT_EGRESS_RELAY"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "toolhost-agent:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("toolhost-agent", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:49983", "address to serve on: host:port, or unix:/path/to/socket")
	workspace := fs.String("workspace", sandbox.WorkspaceRoot, "the directory that stands for the workspace")
	logDir := fs.String("log-dir", agent.DefaultLogDir, "where background processes log")
	if err := fs.Parse(args); err != nil {
		return err
	}
	network, addr := "tcp", *listen
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		network, addr = "unix", p
	}
	l, err := net.Listen(network, addr)
	if err != nil {
		return err
	}
	token, pool, pod, relay := os.Getenv(envToken), os.Getenv(envPoolToken), os.Getenv(envPod), os.Getenv(envRelay)
	for _, k := range []string{envToken, envPoolToken, envPod, envRelay} {
		os.Unsetenv(k) // before agent.New takes the environment every command gets
	}
	if token != "" || pool != "" {
		if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
			l.Close()
			return fmt.Errorf("prctl(PR_SET_DUMPABLE, 0): %w", err)
		}
	}
	var egress *agent.EgressConfig
	if relay != "" {
		if token == "" && pool == "" {
			l.Close()
			return fmt.Errorf("%s without an access token: the relay names the sandbox by its token", envRelay)
		}
		if _, _, err := net.SplitHostPort(relay); err != nil {
			l.Close()
			return fmt.Errorf("%s=%q: %w", envRelay, relay, err)
		}
		egress = &agent.EgressConfig{Port: sandbox.EgressPort, Relay: relay}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	srv, err := agent.New(agent.Config{Workspace: *workspace, LogDir: *logDir, Logger: log, Init: os.Getpid() == 1, AccessToken: token, PoolToken: pool, PodName: pod, Egress: egress})
	if err != nil {
		l.Close()
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log.Info("toolhost-agent serving", "addr", l.Addr().String(), "workspace", *workspace, "token", token != "", "pool", pool != "")
	if err := srv.Serve(ctx, l); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}
