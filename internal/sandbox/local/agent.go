//go:build linux

package local

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"github.com/toolhost/toolhost/internal/envd/agent"
	"github.com/toolhost/toolhost/internal/reexec"
	"golang.org/x/sys/unix"
)

// Environment variables that turn a process into the in-sandbox agent.
const (
	envAgent        = "TOOLHOST_SANDBOX_AGENT" // "1": run the agent instead of main
	envAgentFD      = "TOOLHOST_AGENT_FD"      // descriptor of the inherited listening socket
	envAgentRlimits = "TOOLHOST_AGENT_RLIMITS" // resource limits to set first: "nofile=16384,..."
	envAgentEgress  = "TOOLHOST_AGENT_EGRESS"  // "FD:PORT": the egress control socket and port
)

// init registers the sandbox agent as this package's reexec helper: a binary whose main
// calls reexec.Main (toolhost.Reexec) first becomes the agent when the provider
// re-executes it inside bubblewrap (docker's "reexec" pattern). This way the agent is
// always the exact code of the host that speaks to it — the CLI, an embedding program and
// every test binary alike — with no second build artifact to install, find or keep in
// version step. New refuses to start without that entry point (reexec.Check).
func init() {
	reexec.Register(envAgent, func(string) int { return agentMain() })
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
	// Limits first: everything the agent starts inherits them.
	if err := setRlimits(os.Getenv(envAgentRlimits)); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	var egressCfg *agent.EgressConfig
	egressFD := -1
	if v := os.Getenv(envAgentEgress); v != "" {
		fdText, portText, _ := strings.Cut(v, ":")
		efd, err1 := strconv.Atoi(fdText)
		port, err2 := strconv.Atoi(portText)
		if err1 != nil || err2 != nil || efd < 3 || efd == fd || port < 1 || port > 65535 {
			return fmt.Errorf("agent: bad %s %q", envAgentEgress, v)
		}
		egressFD = efd
		egressCfg = &agent.EgressConfig{Port: port}
	}
	// The processes the agent starts must not see how it was started.
	os.Unsetenv(envAgent)
	os.Unsetenv(envAgentFD)
	os.Unsetenv(envAgentRlimits)
	os.Unsetenv(envAgentEgress)
	closeInheritedFDs(fd, egressFD)
	if egressCfg != nil {
		// agent.Serve makes a connection of it (a copy, close-on-exec): no command inherits
		// it.
		egressCfg.Control = os.NewFile(uintptr(egressFD), "egress-control")
		syscall.CloseOnExec(egressFD)
	}
	// It was started as /proc/self/fd/N: give ps a name to show. PR_SET_NAME names only
	// the calling thread, which need not be the main one (pid 1's /proc/1/comm) by now;
	// /proc/self/comm names the main thread from any. Before the dumpable flag goes:
	// then /proc/self's files are root's, and the write would be refused.
	if err := os.WriteFile("/proc/self/comm", []byte("toolhost-agent"), 0); err != nil {
		_ = unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&[]byte("toolhost-agent\x00")[0])), 0, 0, 0)
	}
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
	// The agent is the sandbox's pid 1 and ends only when the host kills the namespace
	// from outside. A signal that reaches it from inside (the seccomp filter refuses
	// kill(1, ...), but belt and braces) is taken and ignored, never its default action.
	// Notify rather than Ignore: an ignored signal would stay ignored in every command.
	// The fault signals are in the list too: a kill(2) aimed at one of the agent's threads
	// (their ids are in /proc/1/task, and no seccomp rule can know them) would otherwise
	// crash it; Go hands user-sent fault signals to the channel, while a real fault still
	// crashes as it should.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT,
		syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGALRM, syscall.SIGVTALRM, syscall.SIGPROF,
		syscall.SIGXCPU, syscall.SIGXFSZ, syscall.SIGPWR, syscall.SIGIO, syscall.SIGWINCH, syscall.SIGTSTP,
		syscall.SIGTTIN, syscall.SIGTTOU, syscall.SIGPIPE,
		syscall.SIGABRT, syscall.SIGSEGV, syscall.SIGBUS, syscall.SIGFPE, syscall.SIGILL, syscall.SIGTRAP,
		syscall.SIGSYS, syscall.SIGSTKFLT)
	go func() { // owned by the agent's process: drains signals for its whole life
		for range sigs {
		}
	}()
	prewarmThreads(agentThreads)
	srv, err := agent.New(agent.Config{Logger: log, Init: os.Getpid() == 1, Egress: egressCfg})
	if err != nil {
		return err
	}
	if egressCfg != nil {
		defer egressCfg.Control.Close()
	}
	return srv.Serve(context.Background(), l)
}

// agentDigest is the SHA-256 (hex) of the agent-only executable built beside this one
// (agentFile, in the same directory), set when this binary is linked:
//
//	go build -o bin/toolhost-sandbox-agent ./internal/sandbox/local/agentbin
//	go build -ldflags "-X github.com/toolhost/toolhost/internal/sandbox/local.agentDigest=$(sha256sum …)" -o bin/toolhost ./cmd/toolhost
//
// as `make build` does. Empty (a plain go build or go install, an embedding program): the
// agent is this executable.
var agentDigest string

// agentFile is the agent-only executable's name (./internal/sandbox/local/agentbin): a
// program that links only this package, so its start, which is on the path of every
// sandbox's creation, initialises 217 packages instead of the CLI's 480.
const agentFile = "toolhost-sandbox-agent"

// maxAgentBytes bounds what is read of agentFile (it is about 12 MB).
const maxAgentBytes = 256 << 20

// agentExecutable opens the binary to run as the agent, so that the agent is always the
// exact code built with the host that talks to it: the agent-only executable beside this
// one when this binary was linked with its digest and the file has exactly those bytes;
// otherwise this very executable. bubblewrap executes it as /proc/self/fd/N, which needs
// the sandbox user to have execute permission on the file; when it has not (a binary in a
// 0700 build directory is fine, one with mode 0700 is not), the binary is copied once into
// a sealed memfd, which it may execute and no one can change. The agent-only executable is
// hashed through the descriptor that runs it (or as it is copied): what runs is what was
// checked.
func agentExecutable(id identity, log *slog.Logger) (*os.File, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable for the agent: %w", err)
	}
	if agentDigest != "" {
		path := filepath.Join(filepath.Dir(exe), agentFile)
		f, err := openAgentOnly(path, agentDigest, id)
		if err == nil {
			log.Debug("sandbox agent: the agent-only executable", "file", path)
			return f, nil
		}
		level := slog.LevelWarn
		if errors.Is(err, fs.ErrNotExist) {
			level = slog.LevelDebug // the binary was copied alone: slower, not wrong
		}
		log.Log(context.Background(), level, "sandbox agent: this executable, not the agent-only one beside it (each sandbox starts ~10 ms slower)", "err", err)
	}
	return openAgent(exe, id)
}

// openAgentOnly opens the agent-only executable at path, hashes it, and returns it when its
// SHA-256 is digest: the file itself when the sandbox user may execute it (like this
// binary; an open file is the inode that was hashed, whatever is renamed over the path),
// otherwise a sealed memfd copy, hashed as it is copied. Only a regular file is read, and
// no more than maxAgentBytes of it.
func openAgentOnly(path, digest string, id identity) (*os.File, error) {
	// O_NONBLOCK: opening a FIFO would otherwise wait for a writer.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size > maxAgentBytes {
		return nil, fmt.Errorf("%s is not the agent this binary was built with (not a regular file of at most %d bytes)", path, maxAgentBytes)
	}
	h := sha256.New()
	src := io.LimitReader(f, maxAgentBytes)
	var out *os.File
	if id.canExec(&st) {
		if _, err := io.Copy(h, src); err != nil {
			return nil, err
		}
		out, f = f, nil // returned, not closed
	} else if out, err = sealedCopy(io.TeeReader(src, h)); err != nil {
		return nil, err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != digest {
		out.Close()
		return nil, fmt.Errorf("%s is not the agent this binary was built with (its SHA-256 is %s, not %s): build both again with make build", path, got, digest)
	}
	return out, nil
}

// openAgent opens exe for the sandbox user to execute: exe itself, or a sealed memfd copy.
func openAgent(exe string, id identity) (*os.File, error) {
	f, err := os.Open(exe)
	if err != nil {
		return nil, fmt.Errorf("open own executable for the agent: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("stat own executable: %w", err)
	}
	if id.canExec(&st) {
		return f, nil
	}
	defer f.Close()
	return sealedCopy(f)
}

// sealedCopy copies r into a memfd that anyone may execute and no one can change.
func sealedCopy(r io.Reader) (*os.File, error) {
	fd, err := unix.MemfdCreate("toolhost-agent", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("copy the agent into a memfd: %w", err)
	}
	m := os.NewFile(uintptr(fd), "toolhost-agent")
	if _, err := io.Copy(m, r); err != nil {
		m.Close()
		return nil, fmt.Errorf("copy the agent into a memfd: %w", err)
	}
	// One err for both steps: a failed chmod or seal must not go unseen (a writable or
	// unsealed agent image could be changed under the sandboxes that run it).
	err = unix.Fchmod(fd, 0o755)
	if err == nil {
		_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SEAL|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE)
	}
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("seal the agent's memfd: %w", err)
	}
	return m, nil
}

// closeInheritedFDs closes descriptors the host process leaked through bwrap (any fd the
// host itself inherited without close-on-exec, such as one from its own parent), so that
// neither the agent nor the processes it starts hold anything of the host's. Inherited
// descriptors are exactly those without FD_CLOEXEC: everything Go opened has it.
func closeInheritedFDs(keep ...int) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd <= 2 || slices.Contains(keep, fd) {
			continue
		}
		flags, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_GETFD, 0)
		if errno == 0 && flags&syscall.FD_CLOEXEC == 0 {
			syscall.Close(fd)
		}
	}
}

var rlimitNames = map[string]int{
	"core": syscall.RLIMIT_CORE, "nofile": syscall.RLIMIT_NOFILE, "fsize": syscall.RLIMIT_FSIZE, "nproc": unix.RLIMIT_NPROC,
}

// setRlimits applies "name=value,..." (soft and hard limit alike) to this process. A hard
// limit below the value asked for stays: a process cannot raise its own.
func setRlimits(spec string) error {
	if spec == "" {
		return nil
	}
	for _, kv := range strings.Split(spec, ",") {
		name, val, _ := strings.Cut(kv, "=")
		res, ok := rlimitNames[name]
		v, err := strconv.ParseUint(val, 10, 64)
		if !ok || err != nil {
			return fmt.Errorf("bad resource limit %q", kv)
		}
		var cur syscall.Rlimit
		if err := syscall.Getrlimit(res, &cur); err != nil {
			return fmt.Errorf("get limit %s: %w", name, err)
		}
		v = min(v, cur.Max)
		// syscall.Setrlimit, not unix's: for RLIMIT_NOFILE it also makes the Go runtime
		// pass this limit, not the one it started with, to the processes it starts.
		if err := syscall.Setrlimit(res, &syscall.Rlimit{Cur: v, Max: v}); err != nil {
			return fmt.Errorf("set limit %s=%d: %w", name, v, err)
		}
	}
	return nil
}

// agentThreads is how many OS threads the agent makes at start, before any command runs.
const agentThreads = 4

// prewarmThreads makes the Go runtime create n OS threads now and keep them idle. The agent
// shares the sandbox's process limit (threads count) with the commands, and the Go
// runtime ends the process when it cannot create a thread it needs. A command that fills
// the limit must meet EAGAIN at its own fork, not take the agent down: with threads made
// while the sandbox was empty, the agent rarely needs a new one (its I/O is mostly on the
// network poller). Each goroutine holds its thread locked until all are made, then
// unlocks it: an unlocked thread returns to the runtime's idle list and is reused, never
// freed.
func prewarmThreads(n int) {
	var made, release sync.WaitGroup
	made.Add(n)
	release.Add(1)
	for range n {
		go func() { // owned by prewarmThreads: returns once all threads are made
			runtime.LockOSThread()
			made.Done()
			release.Wait()
			runtime.UnlockOSThread()
		}()
	}
	made.Wait()
	release.Done()
}
