//go:build linux

package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/envd"
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

// startAgent builds and starts the agent on TCP with env added to its environment, and
// returns its address and its workspace.
func startAgent(t *testing.T, env ...string) (addr, ws string) {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "toolhost-agent")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ws = filepath.Join(dir, "ws")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--listen", "127.0.0.1:0", "--workspace", ws, "--log-dir", filepath.Join(dir, "logs"))
	cmd.Env = append(os.Environ(), env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	addrc := make(chan string, 1)
	go func() { // reads the agent's log until it ends
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			if !strings.Contains(line, "toolhost-agent serving") {
				continue
			}
			if _, rest, ok := strings.Cut(line, " addr="); ok {
				addrc <- strings.Fields(rest)[0]
			}
		}
		close(addrc)
	}()
	select {
	case addr = <-addrc:
	case <-time.After(2 * time.Minute):
		t.Fatal("the agent never said it serves")
	}
	if addr == "" {
		t.Fatal("the agent ended before it served")
	}
	return addr, ws
}

// TestAgentAccessToken serves the agent on TCP with an access token, as the kubernetes
// provider runs it in a pod: a client without the token (another pod of the cluster) is
// refused everything but the health check; the host's client, with it, runs commands and
// reaches a port in the sandbox through the dial extension; and the commands it runs do not
// find the token in their environment.
func TestAgentAccessToken(t *testing.T) {
	const token = "tok-0123456789abcdef"
	addr, ws := startAgent(t, envToken+"="+token)
	ctx := context.Background()
	stranger, err := client.New(client.Config{BaseURL: "http://" + addr})
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	if err := stranger.Health(ctx); err != nil {
		t.Errorf("health check without the token: %v, want it answered", err)
	}
	if _, err := stranger.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}, Timeout: time.Minute}); err == nil {
		t.Error("a command without the token: it ran")
	}
	if err := stranger.WriteFile(ctx, "x.txt", []byte("x")); err == nil {
		t.Error("a write without the token: accepted")
	}
	if _, err := os.Stat(filepath.Join(ws, "x.txt")); err == nil {
		t.Error("a write without the token reached the workspace")
	}
	wrong, err := client.New(client.Config{BaseURL: "http://" + addr, Header: http.Header{envd.HeaderAccessToken: {"tok-wrong"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer wrong.Close()
	if _, err := wrong.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}, Timeout: time.Minute}); err == nil {
		t.Error("a command with a wrong token: it ran")
	}

	host, err := client.New(client.Config{BaseURL: "http://" + addr, Header: http.Header{envd.HeaderAccessToken: {token}}})
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	// (The agent's own /proc/PID/environ still holds it, as the kernel keeps the initial
	// environment; the agent is undumpable, so only root, which a pod's user is not, may
	// read it: this test runs as root and cannot show that.)
	res, err := host.Exec(ctx, sandbox.ExecRequest{Argv: []string{"env"}, Timeout: time.Minute})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("a command with the token: %v %+v %q", err, res, res.Stderr)
	}
	if strings.Contains(string(res.Stdout), token) || strings.Contains(string(res.Stdout), envToken) {
		t.Errorf("a command sees the token: %q", res.Stdout)
	}
	// The dial extension over TCP: a listener in the "sandbox" (here this machine) is
	// reached through the agent.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() { // ends when l is closed
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("hello from the port\n"))
			c.Close()
		}
	}()
	port := l.Addr().(*net.TCPAddr).Port
	if _, err := stranger.DialPort(ctx, port); err == nil {
		t.Error("a dial without the token: connected")
	}
	c, err := host.DialPort(ctx, port)
	if err != nil {
		t.Fatalf("DialPort over TCP: %v", err)
	}
	b, _ := io.ReadAll(c)
	c.Close()
	if string(b) != "hello from the port\n" {
		t.Errorf("through the dial extension: %q", b)
	}
}

// TestAgentPoolClaim runs the agent as a warm pool's pod does: with the pool's token and
// its pod's name. Unclaimed, it answers the health check and its claim, nothing else, not
// even with the pool's token; a claim for another pod, or with another token, is refused;
// the claim gives it the sandbox's own token and environment; after it the pool's token
// opens nothing and a second claim is refused (a pod is claimed once).
func TestAgentPoolClaim(t *testing.T) {
	const pool, pod = "pool-0123456789abcdef0123456789abcdef", "warm-abcde"
	const token = "sandbox-0123456789abcdef0123456789abcdef"
	addr, _ := startAgent(t, envPoolToken+"="+pool, envPod+"="+pod)
	ctx := context.Background()
	with := func(tok string) *client.Client {
		c, err := client.New(client.Config{BaseURL: "http://" + addr, Header: http.Header{envd.HeaderAccessToken: {tok}}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	pc, stranger, sc := with(pool), with("tok-wrong-0123456789abcdef0123456789"), with(token)
	if err := pc.Health(ctx); err != nil {
		t.Fatalf("health check of an unclaimed agent: %v", err)
	}
	for name, c := range map[string]*client.Client{"the pool's token": pc, "the sandbox's token": sc} {
		if _, err := c.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}, Timeout: time.Minute}); err == nil {
			t.Errorf("a command on an unclaimed agent with %s: it ran", name)
		}
	}
	if err := stranger.Claim(ctx, envd.ClaimRequest{Pod: pod, Token: token}); err == nil {
		t.Error("a claim without the pool's token: accepted")
	}
	if err := pc.Claim(ctx, envd.ClaimRequest{Pod: "warm-other", Token: token}); err == nil {
		t.Error("a claim naming another pod: accepted")
	}
	if err := pc.Claim(ctx, envd.ClaimRequest{Pod: pod, Token: token, Env: map[string]string{"PROJECT_VAR": "yes"}}); err != nil {
		t.Fatalf("the claim: %v", err)
	}
	res, err := sc.Exec(ctx, sandbox.ExecRequest{Argv: []string{"env"}, Timeout: time.Minute})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("a command with the sandbox's token after the claim: %v %+v", err, res)
	}
	out := string(res.Stdout)
	if !strings.Contains(out, "PROJECT_VAR=yes") {
		t.Errorf("the claim's environment is not the commands': %q", out)
	}
	if strings.Contains(out, pool) || strings.Contains(out, token) || strings.Contains(out, envPoolToken) || strings.Contains(out, envPod) {
		t.Errorf("a command sees a token or the pool's variables: %q", out)
	}
	if _, err := pc.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}, Timeout: time.Minute}); err == nil {
		t.Error("a command with the pool's token after the claim: it ran")
	}
	if err := pc.Claim(ctx, envd.ClaimRequest{Pod: pod, Token: "again-0123456789abcdef0123456789abcdef"}); err == nil {
		t.Error("a second claim with the pool's token: accepted")
	}
	if err := sc.Claim(ctx, envd.ClaimRequest{Pod: pod, Token: "again-0123456789abcdef0123456789abcdef"}); err == nil {
		t.Error("a second claim with the sandbox's token: accepted")
	}
	if _, err := sc.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}, Timeout: time.Minute}); err != nil {
		t.Errorf("the sandbox's token after refused claims: %v", err)
	}
}
