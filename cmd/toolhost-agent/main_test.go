//go:build linux

package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/envd/client"
)

// TestStandaloneAgent builds the agent as its own program, starts it on a unix socket over
// a temporary workspace and drives it with the data plane's client, as a remote provider
// would once it has shipped the binary into its sandbox.
func TestStandaloneAgent(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "toolhost-agent")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ws := filepath.Join(dir, "ws")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "agent.sock")
	cmd := exec.Command(bin, "--listen", "unix:"+sock, "--workspace", ws, "--log-dir", filepath.Join(dir, "logs"))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// One waiter for the process, whatever happens to the test.
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	// The agent says it serves once it listens; a hang bound, not a timing.
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "toolhost-agent serving") {
				ready <- nil
				for sc.Scan() {
				}
				return
			}
		}
		ready <- sc.Err()
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the agent never said it serves")
	}
	c, err := client.New(client.Config{SocketPath: sock})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	if err := c.WriteFile(ctx, "hello.txt", []byte("hi\n")); err != nil {
		t.Fatal(err)
	}
	res, err := c.Exec(ctx, sandbox.ExecRequest{Argv: []string{"cat", "hello.txt"}, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || string(res.Stdout) != "hi\n" {
		t.Fatalf("cat hello.txt: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "hello.txt")); err != nil || string(b) != "hi\n" {
		t.Fatalf("the file in the workspace: %q %v", b, err)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		done <- err // for the cleanup's receive
		if err != nil {
			t.Fatalf("the agent did not end cleanly on SIGINT: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the agent did not end on SIGINT")
	}
}
