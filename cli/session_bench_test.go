//go:build linux

package cli

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/internal/daemon"
	"github.com/toolhost/toolhost/internal/mcpserve"
	"github.com/toolhost/toolhost/internal/sessionapi"
	"github.com/toolhost/toolhost/internal/testenv"
)

// BenchmarkSessionCall: `bash {"command":"true"}` in a held session, three ways in one
// run: through the library (Session.Dispatch, the baseline), through the session daemon's
// API on its unix socket (what `call --session` does once started), and as the whole
// `toolhost call --session` process. The differences are what holding a session from the
// shell adds.
func BenchmarkSessionCall(b *testing.B) {
	testenv.NeedBwrap(b)
	ctx := context.Background()
	rt, err := os.MkdirTemp("", "th-bench-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(rt)
	os.Chmod(rt, 0o700)
	b.Setenv("XDG_RUNTIME_DIR", rt)

	cfg := toolhost.DefaultConfig()
	cfg.DataDir = testDataDir
	storeDir := filepath.Join(rt, "store")
	if err := cfg.Set("store.dir", storeDir); err != nil {
		b.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	th, err := toolhost.New(ctx, cfg, toolhost.WithLogger(quiet))
	if err != nil {
		b.Fatal(err)
	}
	defer th.Close(ctx)
	input := json.RawMessage(`{"command":"true"}`)

	b.Run("library", func(b *testing.B) {
		sess, err := th.Open(ctx, toolhost.SessionOptions{Project: "bench-lib"})
		if err != nil {
			b.Fatal(err)
		}
		defer sess.Close(ctx)
		for b.Loop() {
			if res, err := sess.Dispatch(ctx, "bash", input); err != nil || res.IsError {
				b.Fatal(err, res)
			}
		}
	})

	// The daemon, in this process, on the socket the CLI finds through XDG_RUNTIME_DIR.
	dir, err := daemon.Dir()
	if err != nil {
		b.Fatal(err)
	}
	ln, err := daemon.Listen(dir, time.Second, quiet)
	if err != nil {
		b.Fatal(err)
	}
	s := mcpserve.New(th, mcpserve.Options{Logger: quiet})
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.ServeDaemon(sctx, ln, 0, time.Minute) }()
	defer func() { stop(); <-done }()
	sock := daemon.SocketPath(dir)
	cl := sessionapi.NewClient(func(ctx context.Context) (net.Conn, error) { return daemon.DialContext(ctx, sock) }, "")
	defer cl.Close()
	held, err := cl.Start(ctx, sessionapi.StartRequest{Project: "bench-api"})
	if err != nil {
		b.Fatal(err)
	}

	b.Run("api", func(b *testing.B) {
		for b.Loop() {
			if res, err := cl.Call(ctx, held.ID, "bash", input); err != nil || res.IsError {
				b.Fatal(err, res)
			}
		}
	})

	b.Run("cli", func(b *testing.B) {
		env := append(os.Environ(), "TOOLHOST_DATA_DIR="+testDataDir, "TOOLHOST_STORE_DIR="+storeDir)
		for b.Loop() {
			cmd := exec.Command(toolBin, "call", "--session", held.ID, "bash", string(input))
			cmd.Env = env
			out, err := cmd.Output()
			if err != nil || !strings.Contains(string(out), `"is_error":false`) {
				b.Fatalf("%v: %s", err, out)
			}
		}
	})

	// A process that does nothing but start and exit: what any CLI command pays first.
	b.Run("cli-version", func(b *testing.B) {
		for b.Loop() {
			if err := exec.Command(toolBin, "version").Run(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkSessionStart: `toolhost session start` until its session is ready (the id
// printed), with the daemon running ("warm") and with none, so that the command starts
// it first ("cold"). Each session is stopped, untimed.
func BenchmarkSessionStart(b *testing.B) {
	testenv.NeedBwrap(b)
	rt, err := os.MkdirTemp("", "th-bench-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(rt)
	os.Chmod(rt, 0o700)
	dir := filepath.Join(rt, "toolhost")
	env := append(os.Environ(), "XDG_RUNTIME_DIR="+rt, "TOOLHOST_DATA_DIR="+testDataDir,
		"TOOLHOST_STORE_DIR="+filepath.Join(rt, "store"), "TOOLHOST_LOG_LEVEL=warn")
	cli := func(args ...string) string {
		cmd := exec.Command(toolBin, args...)
		cmd.Env = env
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			b.Fatalf("toolhost %v: %v\n%s", args, err, stderr.String())
		}
		return strings.TrimSpace(string(out))
	}
	pid := func() int {
		sock := daemon.SocketPath(dir)
		cl := sessionapi.NewClient(func(ctx context.Context) (net.Conn, error) { return daemon.DialContext(ctx, sock) }, "")
		defer cl.Close()
		info, err := cl.Info(context.Background())
		if err != nil {
			return 0
		}
		return info.PID
	}
	gone := func() {
		if p := pid(); p != 0 {
			waitGone(b, p, dir)
		}
	}
	b.Run("warm", func(b *testing.B) {
		id := cli("session", "start", "--project", "bench-keep", "--daemon-exit-idle", "1s") // keeps the daemon up
		for b.Loop() {
			id := cli("session", "start", "--project", "bench-start")
			b.StopTimer()
			cli("session", "stop", id)
			b.StartTimer()
		}
		cli("session", "stop", id)
		gone()
	})
	b.Run("cold", func(b *testing.B) {
		for b.Loop() {
			id := cli("session", "start", "--project", "bench-start", "--daemon-exit-idle", "1s")
			b.StopTimer()
			cli("session", "stop", id)
			gone()
			b.StartTimer()
		}
	})
}
