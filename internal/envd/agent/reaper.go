//go:build linux

package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
)

// exitStatus is how a process the server started ended.
type exitStatus struct {
	code   int            // exit code; -1 when a signal killed it
	signal syscall.Signal // the signal that killed it, or 0
	desc   string         // "exit status 1", "signal: killed"
}

func statusOf(ws syscall.WaitStatus) exitStatus {
	switch {
	case ws.Exited():
		return exitStatus{code: ws.ExitStatus(), desc: "exit status " + strconv.Itoa(ws.ExitStatus())}
	case ws.Signaled():
		return exitStatus{code: -1, signal: ws.Signal(), desc: "signal: " + ws.Signal().String()}
	}
	return exitStatus{code: -1, desc: fmt.Sprintf("wait status %#x", uint32(ws))}
}

// launcher starts processes and reports their end. The server uses one of two: os/exec's
// own Wait for each process (an agent running inside a test binary, which must not reap
// children that are not its own), or a reaper when the agent is the sandbox's pid 1.
type launcher interface {
	// start starts cmd (its Stdin/Stdout/Stderr are *os.File or nil, so os/exec runs no
	// copying goroutines) and returns its pid and a channel that receives its exit status
	// once. cmd.Process must not be used afterwards.
	start(cmd *exec.Cmd) (pid int, done <-chan exitStatus, err error)
}

// execLauncher waits for each process with os/exec.
type execLauncher struct{}

func (execLauncher) start(cmd *exec.Cmd) (int, <-chan exitStatus, error) {
	if err := cmd.Start(); err != nil {
		return 0, nil, err
	}
	done := make(chan exitStatus, 1)
	go func() { // owned by the process: ends when it is reaped
		_ = cmd.Wait()
		done <- statusOf(cmd.ProcessState.Sys().(syscall.WaitStatus))
	}()
	return cmd.Process.Pid, done, nil
}

// reaper is the launcher of an agent that is pid 1 of the sandbox's pid namespace. Every
// process whose parent dies is handed to pid 1, and a pid namespace's init that does not
// reap them fills the process table with zombies (each one counting against the sandbox's
// process limit). So one loop owns every wait: on SIGCHLD it reaps whatever has ended with
// wait4(-1) and hands the status of a process the server started to whoever waits for it;
// orphans are reaped and forgotten. os/exec's Wait is never called (it would race the loop
// for the same children).
//
// A process is registered under mu in the same critical section that starts it, and the
// loop looks a reaped pid up under mu, so a process that ends before start returns is
// still handed over.
type reaper struct {
	mu      sync.Mutex
	waiters map[int]chan exitStatus
}

func newReaper() *reaper { return &reaper{waiters: map[int]chan exitStatus{}} }

func (r *reaper) start(cmd *exec.Cmd) (int, <-chan exitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return 0, nil, err
	}
	pid := cmd.Process.Pid
	done := make(chan exitStatus, 1)
	r.waiters[pid] = done
	_ = cmd.Process.Release() // never Wait: the loop reaps it
	return pid, done, nil
}

// run reaps until ctx ends. Its caller owns it (the agent's main goroutine starts it and
// cancels ctx when the server stops).
func (r *reaper) run(ctx context.Context) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGCHLD)
	defer signal.Stop(sig)
	r.reap() // anything that ended before Notify
	for {
		select {
		case <-ctx.Done():
			return
		case <-sig:
			r.reap()
		}
	}
}

// reap collects every child that has ended. Signals coalesce, so it loops until none is
// left; a child that ends after the last wait4 raises a new SIGCHLD.
func (r *reaper) reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		r.mu.Lock()
		done := r.waiters[pid]
		delete(r.waiters, pid)
		r.mu.Unlock()
		if done != nil {
			done <- statusOf(ws)
		}
	}
}
