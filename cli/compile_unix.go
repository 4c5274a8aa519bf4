//go:build unix

package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/experimental"
	"github.com/toolhost/toolhost/internal/daemon"
)

// compileLockName is the file in the data dir that a detached compile (compileDetached)
// holds locked (flock) for as long as it runs: one at a time, and whoever must know that
// the cache is filled can wait for it.
const compileLockName = "compile.lock"

// settleOneShot readies the next call once this one has answered. When the call
// answered, no session daemon runs and serve.daemon_calls allows it, it starts one
// (startDaemonDetached), which compiles every plugin and then serves the next call (a
// call that did not answer starts none: the next would fail alike). Otherwise it leaves the
// compile of the plugins the call ran in their interpreted form to a process of its own
// (`toolhost tools --warm`, in a session of its own, at a lower priority), so that the
// call's process exits as soon as it has answered and the next call still finds them in
// the compilation cache. When another such process is compiling already (its lock is
// held), it is left to finish. Only when no process can be started does the call wait
// for the compile itself.
func (c *cli) settleOneShot(ctx context.Context, th *toolhost.Toolhost, answered bool) {
	if answered && c.noDaemon && c.cfg.Serve.DaemonCalls {
		err := c.startDaemonDetached()
		if err == nil {
			c.quietLog().Debug("started the session daemon for the next call")
			return
		}
		c.quietLog().Debug("starting the session daemon for the next call", "err", err)
	}
	unsettled := experimental.Unsettled(th)
	if len(unsettled) == 0 {
		return
	}
	started, err := c.compileDetached()
	if err == nil {
		c.quietLog().Debug("compiling the called plugins for the next start, in a process of its own",
			"plugins", unsettled, "started", started)
		return
	}
	c.quietLog().Debug("compiling the called plugins for the next start", "plugins", unsettled, "detached", err)
	if err := experimental.Settle(ctx, th); err != nil {
		c.quietLog().Debug("compiling the called plugins for the next start", "err", err)
	}
}

// startDaemonDetached starts the session daemon as startDaemon does (`toolhost serve
// --daemon --exit-idle 1m` with this command's configuration, in a session of its own,
// its output to its log), and waits neither for it to answer nor to exit: it outlives
// this process by design, and ends a minute after its last request.
func (c *cli) startDaemonDetached() error {
	dir, err := daemon.Dir()
	if err != nil {
		return err
	}
	proc, err := c.spawnDaemon(dir, daemonExitIdle)
	if err != nil {
		return err
	}
	return proc.Process.Release()
}

// compileLocked runs compile holding dataDir's compile lock, waiting for another
// compile that holds it (a detached one, another daemon's) to end first.
func compileLocked(ctx context.Context, dataDir string, compile func() error) error {
	f, err := lockCompile(ctx, dataDir)
	if err != nil {
		return err
	}
	defer f.Close() // unlocks
	return compile()
}

// compileDetached starts `toolhost tools --warm` with this command's configuration,
// detached: it holds the data dir's compile lock (the descriptor this process locked,
// inherited, so no other compile can start between the two) until it exits, when its
// compile ends. started is false when another compile holds the lock.
func (c *cli) compileDetached() (started bool, err error) {
	exe, err := os.Executable()
	if err != nil {
		return false, err
	}
	lock, err := os.OpenFile(filepath.Join(c.cfg.DataDir, compileLockName), os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return false, err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return false, nil
		}
		return false, fmt.Errorf("locking %s: %w", lock.Name(), err)
	}
	args := append([]string{"tools", "--warm", "--format", "json", "--log-level", "error"}, c.configFlags()...)
	cmd := exec.Command(exe, args...)
	cmd.Env = os.Environ()
	if wd, err := os.Getwd(); err == nil {
		cmd.Dir = wd
	}
	cmd.ExtraFiles = []*os.File{lock} // its descriptor 3: the lock is held while it runs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.WaitDelay = time.Second // never waited for; its output is /dev/null
	if err := cmd.Start(); err != nil {
		return false, err
	}
	// Its CPU is less urgent than the user's next call's.
	syscall.Setpriority(syscall.PRIO_PROCESS, cmd.Process.Pid, 10)
	// It outlives this process by design (its own session, its work bounded by the
	// compile); nothing here waits for it.
	return true, cmd.Process.Release()
}

// waitCompiled waits until no detached compile holds dataDir's compile lock.
func waitCompiled(ctx context.Context, dataDir string) error {
	f, err := lockCompile(ctx, dataDir)
	if err != nil {
		return err
	}
	return f.Close() // unlocks
}

// lockCompile waits for dataDir's compile lock and returns it held: closing the file
// unlocks it.
func lockCompile(ctx context.Context, dataDir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dataDir, compileLockName), os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", f.Name(), err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for the compile holding %s: %w", f.Name(), ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
