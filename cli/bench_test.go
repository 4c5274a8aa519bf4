package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/internal/builtins"
	"github.com/toolhost/toolhost/internal/daemon"
	"github.com/toolhost/toolhost/internal/host"
	"github.com/toolhost/toolhost/internal/sessionapi"
)

// builtinConfig is the host configuration the CLI uses by default: the four built-in
// plugins, embedded in the binary, with the compilation cache in dataDir.
func builtinConfig(b *testing.B, dataDir string) host.Config {
	cfg := host.Config{DataDir: dataDir, Logger: slog.New(slog.DiscardHandler)}
	for _, p := range builtins.Builtins() {
		wasm, err := builtins.Wasm(p.File)
		if err != nil {
			b.Fatal(err)
		}
		cfg.Plugins = append(cfg.Plugins, host.PluginSpec{Path: "builtin:" + p.File, Wasm: wasm, Grants: p.Grants})
	}
	return cfg
}

func loadBuiltins(b *testing.B, cfg host.Config) {
	ctx := context.Background()
	h, err := host.New(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if n := len(h.Tools()); n != 12 {
		b.Fatalf("%d tools, want 12", n)
	}
	h.Close(ctx)
	b.StartTimer()
}

// BenchmarkLoadBuiltinsWarm: host.New with the four built-in plugins, their compilation
// cache already on disk (what every CLI start after the first one pays).
func BenchmarkLoadBuiltinsWarm(b *testing.B) {
	cfg := builtinConfig(b, b.TempDir())
	loadBuiltins(b, cfg) // fill the cache
	for b.Loop() {
		loadBuiltins(b, cfg)
	}
}

// BenchmarkLoadBuiltinsCold: the same with an empty cache: every module is compiled.
func BenchmarkLoadBuiltinsCold(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		cfg := builtinConfig(b, b.TempDir())
		b.StartTimer()
		loadBuiltins(b, cfg)
	}
}

// BenchmarkNewWarm: toolhost.New with the default configuration and a warm cache: the
// plugins plus the store, what the CLI does before its first tool call.
func BenchmarkNewWarm(b *testing.B) {
	cfg := toolhost.DefaultConfig()
	cfg.DataDir = b.TempDir()
	ctx := context.Background()
	open := func() {
		th, err := toolhost.New(ctx, cfg, toolhost.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		th.Close(ctx)
		b.StartTimer()
	}
	open() // fill the cache
	for b.Loop() {
		open()
	}
}

// BenchmarkFirstCall is what a new user (or a new CI machine) meets first: the whole CLI
// process of `toolhost call bash '{"command":"true"}'` on a fresh data dir (no compilation
// cache, no records), timed until its result is printed ("cold"), against the same
// command run next in that data dir, timed to its exit ("warm", the floor). Each iteration
// runs both, so the ratio is of one run. The cold process is timed to its result
// ("cold-ms") and to its exit ("cold-exit-ms"): it finds no session daemon, so once it has
// printed it starts one (which compiles every plugin under the data dir's compile lock,
// then takes calls), or, with an older binary, it hands the compile of the plugin it ran
// interpreted to a detached `toolhost tools --warm`; the benchmark waits for either,
// untimed, before the warm call, which the daemon then serves. "warm-cpu-ms" is the warm
// call's CPU: its process's with its reaped children's ("warm-client-cpu-ms"), plus what
// the daemon spent meanwhile, with the sandbox processes it reaped ("warm-daemon-cpu-ms":
// utime+stime+cutime+cstime of /proc/PID/stat, in ticks of 10 ms, so a mean over
// iterations). The daemon is stopped, untimed, at each iteration's end. The benchmark has
// a runtime directory of its own (XDG_RUNTIME_DIR), so its own daemon.
// BENCH_TOOLHOST_BIN names another binary to measure (an older build, for a before/after
// in one run).
//
//	go test -run '^$' -bench FirstCall -benchtime 5x -count 6 ./cli
func BenchmarkFirstCall(b *testing.B) {
	bin := toolBin
	if v := os.Getenv("BENCH_TOOLHOST_BIN"); v != "" {
		bin = v
	}
	store := b.TempDir()
	rt, err := os.MkdirTemp("", "th-rt-") // short: a socket path has at most 107 bytes
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(rt)
	os.Chmod(rt, 0o700)
	dDir := filepath.Join(rt, "toolhost")
	sock := daemon.SocketPath(dDir)
	cl := sessionapi.NewClient(func(ctx context.Context) (net.Conn, error) { return daemon.DialContext(ctx, sock) }, "")
	defer cl.Close()
	info := func() (sessionapi.Info, bool) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		i, err := cl.Info(ctx)
		return i, err == nil
	}
	var warmCPU, lastCPU time.Duration // the warm processes' CPU, with their reaped children's
	run := func(dataDir string) (result, exit time.Duration) {
		b.Helper()
		cmd := exec.Command(bin, "call", "bash", `{"command":"true"}`)
		cmd.Dir = b.TempDir()
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "TOOLHOST_") && !strings.HasPrefix(kv, "XDG_CONFIG_HOME=") && !strings.HasPrefix(kv, "XDG_RUNTIME_DIR=") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		cmd.Env = append(cmd.Env, "TOOLHOST_DATA_DIR="+dataDir, "TOOLHOST_STORE_DIR="+store,
			"XDG_CONFIG_HOME="+b.TempDir(), "XDG_RUNTIME_DIR="+rt, "TOOLHOST_LOG_LEVEL=error")
		out, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		start := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		line, err := bufio.NewReader(out).ReadString('\n')
		took := time.Since(start)
		if err != nil || !strings.Contains(line, `"is_error":false`) {
			cmd.Wait()
			b.Fatalf("toolhost call bash: %q, %v\n%s", line, err, stderr.String())
		}
		io.Copy(io.Discard, out)
		if err := cmd.Wait(); err != nil {
			b.Fatalf("toolhost call bash: %v\n%s", err, stderr.String())
		}
		took2 := time.Since(start)
		// The process's CPU and its waited-for descendants' (the sandbox's bwrap, agent
		// and command): what /usr/bin/time reports.
		lastCPU = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		return took, took2
	}
	var cold, coldExit, warm, clientCPU, daemonCPU time.Duration
	for b.Loop() {
		dataDir := filepath.Join(b.TempDir(), "data")
		r, e := run(dataDir)
		cold += r
		coldExit += e
		b.StopTimer()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		err := waitCompiled(ctx, dataDir)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		// The cold call started a daemon when it made its log (daemon.Start does, before
		// the process starts): wait until it takes calls.
		pid := 0
		if _, err := os.Stat(daemon.LogPath(dDir)); err == nil {
			deadline := time.Now().Add(10 * time.Minute) // a hang bound
			for {
				if i, ok := info(); ok && i.TakesCalls {
					pid = i.PID
					break
				}
				if time.Now().After(deadline) {
					b.Fatalf("the daemon the cold call started does not take calls; its log:\n%s", daemon.LogTail(dDir, 2000))
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		before := procCPU(pid)
		b.StartTimer()
		_, e = run(dataDir)
		b.StopTimer()
		d := procCPU(pid) - before
		if pid != 0 {
			if i, _ := info(); i.OneShots != 1 {
				b.Fatalf("the daemon ran %d one-shot calls, want 1 (the warm call)", i.OneShots)
			}
			if p, err := os.FindProcess(pid); err == nil {
				p.Signal(syscall.SIGTERM)
			}
			for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
					break // gone (it is not this process's child: init reaps it)
				}
			}
		}
		os.Remove(daemon.LogPath(dDir))
		b.StartTimer()
		warm += e
		warmCPU += lastCPU + d
		clientCPU += lastCPU
		daemonCPU += d
	}
	n := float64(b.N)
	b.ReportMetric(float64(cold.Milliseconds())/n, "cold-ms")
	b.ReportMetric(float64(coldExit.Milliseconds())/n, "cold-exit-ms")
	b.ReportMetric(float64(warm.Milliseconds())/n, "warm-ms")
	b.ReportMetric(float64(warmCPU.Microseconds())/n/1000, "warm-cpu-ms")
	b.ReportMetric(float64(clientCPU.Microseconds())/n/1000, "warm-client-cpu-ms")
	b.ReportMetric(float64(daemonCPU.Microseconds())/n/1000, "warm-daemon-cpu-ms")
	b.ReportMetric(float64(cold)/float64(warm), "cold/warm")
	b.ReportMetric(float64(coldExit)/float64(warm), "cold-exit/warm")
}

// procCPU is the CPU process pid has used, with its reaped children's (utime, stime,
// cutime and cstime of /proc/PID/stat, in ticks of 10 ms: USER_HZ is 100 on Linux); 0
// for pid 0 or where there is no /proc.
func procCPU(pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command's name, in parentheses, may hold spaces: count fields after it.
	i := bytes.LastIndex(b, []byte(") "))
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+2:])) // f[0] is field 3 (state): utime is field 14
	if len(f) < 15 {
		return 0
	}
	var ticks int64
	for _, s := range f[11:15] {
		v, _ := strconv.ParseInt(s, 10, 64)
		ticks += v
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

// BenchmarkMCPTransports is issue 18's "MCP HTTP / stdio, official TS client, bash true":
// the TypeScript SDK's client (scripts/setup-mcp-client.sh) calls bash `true` over
// streamable HTTP to `toolhost serve` and over stdio to `toolhost mcp`, the two
// interleaved call by call after five warm-up calls each (testdata/mcpbench.cjs); the
// medians and their ratio are of one run.
//
//	go test -run '^$' -bench MCPTransports -benchtime 1x -count 6 ./cli
func BenchmarkMCPTransports(b *testing.B) {
	node, err := exec.LookPath("node")
	if err != nil {
		b.Skipf("node is not installed: %v", err)
	}
	dir := os.Getenv("TOOLHOST_MCP_CLIENT_DIR")
	if dir == "" {
		home, _ := os.UserHomeDir()
		matches, _ := filepath.Glob(filepath.Join(home, ".cache", "toolhost", "mcp-client", "*"))
		if len(matches) == 0 {
			b.Skip("the MCP SDK is not installed (scripts/setup-mcp-client.sh)")
		}
		dir = matches[len(matches)-1]
	}
	script, err := filepath.Abs("testdata/mcpbench.cjs")
	if err != nil {
		b.Fatal(err)
	}
	store := "TOOLHOST_STORE_DIR=" + b.TempDir()
	_, url, _, _ := startServe(b, []string{store})
	var httpMs, stdioMs []float64
	for b.Loop() {
		cmd := exec.Command(node, script)
		cmd.Env = append(cliEnv(b, store), "TOOLHOST_MCP_CLIENT_DIR="+dir, "MCP_URL="+url, "MCP_BIN="+toolBin, "MCP_CALLS=40")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			b.Fatalf("node mcpbench.cjs: %v\n%s", err, stderr.String())
		}
		var got struct{ HTTP, Stdio []float64 }
		if err := json.Unmarshal(out, &got); err != nil {
			b.Fatalf("%v: %s", err, out)
		}
		httpMs = append(httpMs, got.HTTP...)
		stdioMs = append(stdioMs, got.Stdio...)
	}
	slices.Sort(httpMs)
	slices.Sort(stdioMs)
	h, s := httpMs[len(httpMs)/2], stdioMs[len(stdioMs)/2]
	b.ReportMetric(h, "http-ms")
	b.ReportMetric(s, "stdio-ms")
	b.ReportMetric(h/s, "http/stdio")
}
