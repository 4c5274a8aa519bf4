package local

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/toolhost/toolhost/core/sandbox/envd"
)

// Environment variables that turn a process into the in-sandbox agent.
const (
	envAgent   = "TOOLHOST_SANDBOX_AGENT" // "1": run the agent instead of main
	envAgentFD = "TOOLHOST_AGENT_FD"      // descriptor of the inherited listening socket
)

// agentPath is where the host's executable is mounted inside the sandbox.
const agentPath = "/run/toolhost/agent"

// init turns any binary that imports this package into the sandbox agent when the
// provider re-executes it inside bubblewrap (docker's "reexec" pattern). This way the
// agent is always the exact code of the host that speaks to it — the CLI, an embedding
// program and every test binary alike — with no second build artifact to install, find
// or keep in version step. It runs before main (or the testing framework) gets control
// and never returns.
func init() {
	if os.Getenv(envAgent) != "1" {
		return
	}
	os.Exit(agentMain())
}

func agentMain() int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if err := runAgent(log); err != nil {
		log.Error("sandbox agent failed", "err", err)
		return 1
	}
	return 0
}

func runAgent(log *slog.Logger) error {
	fd, err := strconv.Atoi(os.Getenv(envAgentFD))
	if err != nil || fd < 3 {
		return fmt.Errorf("agent: bad %s %q", envAgentFD, os.Getenv(envAgentFD))
	}
	// The processes the agent starts must not see how it was started.
	os.Unsetenv(envAgent)
	os.Unsetenv(envAgentFD)
	closeInheritedFDs(fd)
	// Sandbox processes run as the same uid: without this they could ptrace the agent or
	// take its descriptors (pidfd_getfd). Children get their own dumpable flag at exec.
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_DUMPABLE, 0, 0); errno != 0 {
		return fmt.Errorf("agent: prctl(PR_SET_DUMPABLE, 0): %w", errno)
	}

	f := os.NewFile(uintptr(fd), "agent-listener")
	l, err := net.FileListener(f) // dups with close-on-exec
	f.Close()
	if err != nil {
		return fmt.Errorf("agent: listen on inherited socket: %w", err)
	}
	srv, err := envd.NewServer(envd.ServerConfig{Logger: log})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return srv.Serve(ctx, l)
}

// closeInheritedFDs closes descriptors the host process leaked through bwrap (any fd the
// host itself inherited without close-on-exec, such as one from its own parent), so that
// neither the agent nor the processes it starts hold anything of the host's. Inherited
// descriptors are exactly those without FD_CLOEXEC: everything Go opened has it.
func closeInheritedFDs(keep int) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd <= 2 || fd == keep {
			continue
		}
		flags, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_GETFD, 0)
		if errno == 0 && flags&syscall.FD_CLOEXEC == 0 {
			syscall.Close(fd)
		}
	}
}
