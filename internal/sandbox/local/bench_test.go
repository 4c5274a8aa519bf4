//go:build linux

package local

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/egress"
)

// BenchmarkCreateToFirstCommand: Create → Exec true → result, with every limit, the
// seccomp filter and the cgroup on; Close is outside the timer. HostDir mounts a host
// directory (as root: staged through an idmapped mount); Private
// gives the sandbox its own workspace (as root: a fresh ext4 volume, the disk limit).
func BenchmarkCreateToFirstCommand(b *testing.B) {
	b.Run("HostDir", func(b *testing.B) { benchCreate(b, b.TempDir()) })
	b.Run("Private", func(b *testing.B) { benchCreate(b, "") })
}

func benchCreate(b *testing.B, ws string) {
	p := newProvider(b, Config{})
	ctx := context.Background()
	for b.Loop() {
		sb, err := p.Create(ctx, sandbox.CreateOptions{Workspace: ws})
		if err != nil {
			b.Fatal(err)
		}
		if res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil || res.ExitCode != 0 {
			b.Fatalf("%+v %v", res, err)
		}
		b.StopTimer()
		if err := sb.Close(ctx); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// BenchmarkExecTrue: one foreground command in a warm sandbox.
func BenchmarkExecTrue(b *testing.B) {
	p := newProvider(b, Config{})
	sb := newSandbox(b, p, sandbox.CreateOptions{})
	ctx := context.Background()
	for b.Loop() {
		if res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil || res.ExitCode != 0 {
			b.Fatalf("%+v %v", res, err)
		}
	}
}

// BenchmarkReadFile4K: GET /files of a 4 KiB workspace file through the client.
func BenchmarkReadFile4K(b *testing.B) {
	p := newProvider(b, Config{})
	sb := newSandbox(b, p, sandbox.CreateOptions{})
	ctx := context.Background()
	data := bytes.Repeat([]byte("0123456789abcdef"), 256)
	if err := sb.WriteFile(ctx, "f4k", data); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		got, err := sb.ReadFile(ctx, "f4k", 1<<20)
		if err != nil || len(got) != len(data) {
			b.Fatalf("%d %v", len(got), err)
		}
	}
}

// BenchmarkCreateVsBwrap is issue 18's "create → first command / bare bwrap start": each
// iteration times a bare bubblewrap start of /bin/true (the floor: namespaces, a minimal
// root, run as the sandbox user like the provider's) and then Create → Exec true → result
// of a sandbox with every limit, the seccomp filter and the cgroup on, on a host directory
// (Close is not timed); the ratio is of one run.
//
// A loaded machine stretches both walls by its run queue, which pulls the ratio toward 1,
// so the CPU each side used is reported too, which load does not distort as much: the
// bare start's is its processes' (bwrap, /bin/true); a create's is the host process's own
// during Create and Exec plus every process of the sandbox (bwrap, the agent, true),
// counted once the sandbox is closed and they are reaped (getrusage of children).
//
// BENCH_AGENT_BIN runs another binary of this module as the agent (the CLI's, see
// BenchmarkAgentStart) instead of this test binary.
//
//	go test -run '^$' -bench CreateVsBwrap -benchtime 20x -count 6 ./internal/sandbox/local
func BenchmarkCreateVsBwrap(b *testing.B) {
	p := newProvider(b, Config{})
	benchAgent(b, p)
	ctx := context.Background()
	ws := b.TempDir()
	var bare, create, bareCPU, createCPU time.Duration
	for b.Loop() {
		cmd := exec.Command(BwrapPath, "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr",
			"--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin",
			"--proc", "/proc", "--dev", "/dev", "/bin/true")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.id.credential()}
		c0 := cpuTime(b, syscall.RUSAGE_CHILDREN)
		t0 := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("bare bwrap: %v %s", err, out)
		}
		bare += time.Since(t0)
		bareCPU += cpuTime(b, syscall.RUSAGE_CHILDREN) - c0
		c1, s1 := cpuTime(b, syscall.RUSAGE_CHILDREN), cpuTime(b, syscall.RUSAGE_SELF)
		t1 := time.Now()
		sb, err := p.Create(ctx, sandbox.CreateOptions{Workspace: ws})
		if err != nil {
			b.Fatal(err)
		}
		if res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil || res.ExitCode != 0 {
			b.Fatalf("%+v %v", res, err)
		}
		create += time.Since(t1)
		createCPU += cpuTime(b, syscall.RUSAGE_SELF) - s1
		b.StopTimer()
		if err := sb.Close(ctx); err != nil {
			b.Fatal(err)
		}
		createCPU += cpuTime(b, syscall.RUSAGE_CHILDREN) - c1
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(float64(create.Microseconds())/n/1000, "create-ms")
	b.ReportMetric(float64(bare.Microseconds())/n/1000, "bwrap-ms")
	b.ReportMetric(float64(create)/float64(bare), "create/bwrap")
	b.ReportMetric(float64(createCPU.Microseconds())/n/1000, "create-cpu-ms")
	b.ReportMetric(float64(bareCPU.Microseconds())/n/1000, "bwrap-cpu-ms")
	b.ReportMetric(float64(createCPU)/float64(bareCPU), "cpu-create/bwrap")
}

// cpuTime is the user and system CPU time getrusage reports for who.
func cpuTime(b *testing.B, who int) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(who, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkCreatePhases: where a create's time goes, from the provider's "sandbox ready"
// debug line (its phases) and the benchmark's own clock around Create and the first Exec.
// workspace is everything before the run dir (the checks and the workspace's attach: as
// root an idmapped mount of the host directory); prepare the run dir, the agent's socket,
// the cgroup with its limits and bwrap's plan; fork bwrap's start in its cgroups; admit
// bwrap's start until it names the sandbox's first process; agent the rest of bwrap's
// setup (namespaces, mounts, seccomp), the agent's start and its first answer; exec the
// first command's round trip. Wall times: under load each phase waits in the run queue.
//
//	go test -run '^$' -bench CreatePhases -benchtime 30x ./internal/sandbox/local
func BenchmarkCreatePhases(b *testing.B) {
	p := newProvider(b, Config{})
	benchAgent(b, p)
	ph := &phaseLog{}
	p.log = slog.New(ph)
	ctx := context.Background()
	ws := b.TempDir()
	var create, first time.Duration
	for b.Loop() {
		t0 := time.Now()
		sb, err := p.Create(ctx, sandbox.CreateOptions{Workspace: ws})
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil || res.ExitCode != 0 {
			b.Fatalf("%+v %v", res, err)
		}
		first += time.Since(t1)
		create += t1.Sub(t0)
		b.StopTimer()
		if err := sb.Close(ctx); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	ph.mu.Lock()
	defer ph.mu.Unlock()
	if ph.n != b.N {
		b.Fatalf("%d creates logged their phases, want %d", ph.n, b.N)
	}
	n := float64(b.N)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / n / 1000 }
	var phases time.Duration
	for _, k := range []string{"prepare", "fork", "admit", "agent"} {
		phases += ph.sum[k]
		b.ReportMetric(ms(ph.sum[k]), k+"-ms")
	}
	b.ReportMetric(ms(create-phases), "workspace-ms")
	b.ReportMetric(ms(first), "exec-ms")
}

// phaseLog sums the phases of every "sandbox ready" record.
type phaseLog struct {
	mu  sync.Mutex
	n   int
	sum map[string]time.Duration
}

func (h *phaseLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *phaseLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *phaseLog) WithGroup(string) slog.Handler            { return h }
func (h *phaseLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "sandbox ready" {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sum == nil {
		h.sum = map[string]time.Duration{}
	}
	h.n++
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "phases" {
			for _, g := range a.Value.Group() {
				h.sum[g.Key] += g.Value.Duration()
			}
		}
		return true
	})
	return nil
}

// BenchmarkPlannedBwrap: the CPU of bubblewrap started with the provider's own plan (every
// mount, /etc's files, the second user namespace that --disable-userns needs, the seccomp
// filter) but running /bin/true instead of the agent, beside the bare start of
// BenchmarkCreateVsBwrap: what the walls cost bwrap itself, apart from the agent.
//
//	go test -run '^$' -bench PlannedBwrap -benchtime 40x ./internal/sandbox/local
func BenchmarkPlannedBwrap(b *testing.B) {
	p := newProvider(b, Config{})
	ws, err := p.newWorkspace(context.Background(), "bench-planned", b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = ws.release() })
	b.Run("bare", func(b *testing.B) {
		var cpu time.Duration
		for b.Loop() {
			cmd := exec.Command(BwrapPath, "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr",
				"--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin",
				"--proc", "/proc", "--dev", "/dev", "/bin/true")
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.id.credential()}
			c0 := cpuTime(b, syscall.RUSAGE_CHILDREN)
			if out, err := cmd.CombinedOutput(); err != nil {
				b.Fatalf("bare bwrap: %v %s", err, out)
			}
			cpu += cpuTime(b, syscall.RUSAGE_CHILDREN) - c0
		}
		b.ReportMetric(float64(cpu.Microseconds())/float64(b.N)/1000, "cpu-ms")
	})
	b.Run("planned", func(b *testing.B) {
		var cpu time.Duration
		for b.Loop() {
			cpu += runPlanned(b, p, ws)
		}
		b.ReportMetric(float64(cpu.Microseconds())/float64(b.N)/1000, "cpu-ms")
	})
}

// runPlanned runs bwrap with p's plan over ws, /bin/true in place of the agent, and returns
// the CPU its processes used.
func runPlanned(b *testing.B, p *Provider, ws *workspace) time.Duration {
	null, err := os.Open(os.DevNull) // stands for the agent's listening socket
	if err != nil {
		b.Fatal(err)
	}
	infoR, infoW, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	defer infoR.Close()
	blockR, blockW, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	defer blockW.Close()
	plan, err := p.plan(ws, null, infoW, blockR, sandbox.CreateOptions{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	argsFD, err := plan.data("args", plan.argsData())
	if err != nil {
		plan.close()
		b.Fatal(err)
	}
	cmd := exec.Command(BwrapPath, "--args", argsFD, "--", "/bin/true")
	cmd.ExtraFiles = plan.files
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.id.credential()}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	c0 := cpuTime(b, syscall.RUSAGE_CHILDREN)
	err = cmd.Start()
	plan.close()
	if err != nil {
		b.Fatal(err)
	}
	if _, err := readChildPID(infoR); err != nil {
		b.Errorf("bwrap's info: %v", err)
	}
	_, _ = blockW.Write([]byte{1})
	if err := cmd.Wait(); err != nil {
		b.Fatalf("planned bwrap: %v: %s", err, stderr.String())
	}
	return cpuTime(b, syscall.RUSAGE_CHILDREN) - c0
}

// benchAgent makes p run BENCH_AGENT_BIN as the agent when it is set.
func benchAgent(b *testing.B, p *Provider) {
	bin := os.Getenv("BENCH_AGENT_BIN")
	if bin == "" {
		return
	}
	f, err := openAgent(bin, p.id)
	if err != nil {
		b.Fatal(err)
	}
	if old, _ := p.agent(); old != nil {
		old.Close()
	}
	p.agent = func() (*os.File, error) { return f, nil } // the provider's Close closes it
}

// BenchmarkAgentStart: what starting the agent's process costs before its first own
// instruction (exec, the Go runtime, every linked package's init), in CPU time (getrusage
// of children) and wall, beside /bin/true's exec. The agent is this test binary unless
// BENCH_AGENT_BIN names another built from this module (the CLI, whose agent links
// everything the CLI does):
//
//	go build -o /tmp/toolhost ./cmd/toolhost
//	BENCH_AGENT_BIN=/tmp/toolhost go test -run '^$' -bench AgentStart -benchtime 40x ./internal/sandbox/local
//
// It is started the way the provider starts it but with an invalid listening descriptor,
// so it exits right after its inits, at its first check.
func BenchmarkAgentStart(b *testing.B) {
	agent := os.Getenv("BENCH_AGENT_BIN")
	if agent == "" {
		var err error
		if agent, err = os.Executable(); err != nil {
			b.Fatal(err)
		}
	}
	for _, bin := range []string{agent, "/bin/true"} {
		b.Run(filepath.Base(bin), func(b *testing.B) {
			var cpu time.Duration
			for b.Loop() {
				cmd := exec.Command(bin)
				cmd.Env = []string{envAgent + "=1", envAgentFD + "=none"}
				c0 := cpuTime(b, syscall.RUSAGE_CHILDREN)
				out, err := cmd.CombinedOutput()
				if bin != "/bin/true" && !bytes.Contains(out, []byte(envAgentFD)) {
					b.Fatalf("%s did not start as the agent (%v): %s", bin, err, out)
				}
				cpu += cpuTime(b, syscall.RUSAGE_CHILDREN) - c0
			}
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N)/1000, "cpu-ms")
		})
	}
}

// BenchmarkCreateToFirstCommandNetwork: the same with network none and with egress (the
// default: the agent's port to the gateway, the proxy variables, the door at the
// gateway), over a host directory, in one run.
func BenchmarkCreateToFirstCommandNetwork(b *testing.B) {
	for _, network := range []string{sandbox.NetworkNone, sandbox.NetworkEgress} {
		b.Run(network, func(b *testing.B) {
			p := newProvider(b, Config{})
			ws := b.TempDir()
			ctx := context.Background()
			opts := sandbox.CreateOptions{Workspace: ws, Network: network}
			if network == sandbox.NetworkEgress {
				pol, err := egress.Compile(egress.Spec{Preset: egress.PresetRegistries})
				if err != nil {
					b.Fatal(err)
				}
				opts.Egress = &sandbox.Egress{Gateway: egress.New(egress.Config{}).Session(egress.SessionConfig{Policy: pol})}
			}
			for b.Loop() {
				sb, err := p.Create(ctx, opts)
				if err != nil {
					b.Fatal(err)
				}
				if res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil || res.ExitCode != 0 {
					b.Fatalf("%+v %v", res, err)
				}
				b.StopTimer()
				if err := sb.Close(ctx); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

// BenchmarkAttachHostDir: attaching a host directory of 2,000 files for a sandbox and
// releasing it (no sandbox started), as root: Idmap is the idmapped mount (a user
// namespace made and dropped, open_tree, mount_setattr, move_mount, then umount), Adopt
// the walk that re-owns root's entries plus a bind mount (what --adopt does where idmapped
// mounts fail). Adopt's cost grows with the directory; Idmap's does not.
func BenchmarkAttachHostDir(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: host directories are staged only as root")
	}
	dir := b.TempDir()
	for i := range 20 {
		sub := filepath.Join(dir, strconv.Itoa(i))
		if err := os.Mkdir(sub, 0o755); err != nil {
			b.Fatal(err)
		}
		for j := range 100 {
			if err := os.WriteFile(filepath.Join(sub, strconv.Itoa(j)), []byte("x"), 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, mode := range []string{"Idmap", "Adopt"} {
		b.Run(mode, func(b *testing.B) {
			p := newProvider(b, Config{Adopt: true, Limits: Limits{DiskBytes: -1}})
			p.noIdmap = mode == "Adopt"
			ctx := context.Background()
			n := 0
			for b.Loop() {
				n++
				w, err := p.hostWorkspace(ctx, "bench-"+strconv.Itoa(n), dir)
				if err != nil {
					b.Fatal(err)
				}
				if w.idmap != (mode == "Idmap") {
					b.Fatalf("idmap %v in mode %s", w.idmap, mode)
				}
				if err := w.release(); err != nil {
					b.Fatal(err)
				}
				if mode == "Adopt" {
					b.StopTimer()
					// Give the entries back to root, so that each round re-owns them all.
					_ = filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
						if err == nil {
							_ = os.Lchown(p, 0, 0)
						}
						return nil
					})
					b.StartTimer()
				}
			}
		})
	}
}

// BenchmarkTakeSpare is issue 18's "take a pooled sandbox -> first command / warm bash
// true": each iteration waits (untimed) for the pool's spare, then times Create -> Exec
// true -> result (the spare taken, a private workspace attached), then one more Exec true
// in the same sandbox (the floor); the ratio is of one run. Needs root (the pool does).
//
//	go test -run '^$' -bench TakeSpare -benchtime 20x -count 6 ./internal/sandbox/local
func BenchmarkTakeSpare(b *testing.B) {
	p := newPooled(b, Config{})
	ctx := context.Background()
	var take, warm time.Duration
	for b.Loop() {
		b.StopTimer()
		spareIDs(b, p, sandbox.CreateOptions{}, 1)
		b.StartTimer()
		t0 := time.Now()
		sb, err := p.Create(ctx, sandbox.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil || res.ExitCode != 0 {
			b.Fatalf("%+v %v", res, err)
		}
		take += time.Since(t0)
		t1 := time.Now()
		if res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil || res.ExitCode != 0 {
			b.Fatalf("%+v %v", res, err)
		}
		warm += time.Since(t1)
		b.StopTimer()
		if err := sb.Close(ctx); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(float64(take.Microseconds())/n/1000, "take-ms")
	b.ReportMetric(float64(warm.Microseconds())/n/1000, "exec-ms")
	b.ReportMetric(float64(take)/float64(warm), "take/exec")
}

// BenchmarkHandoff: Handoff of a sandbox running a background server, then the first
// command in the next one (rotation's pause on the provider's side, without the session's
// restart of the server), interleaved per iteration: "kill" ends the old sandbox before
// the next one gets the workspace (killOnHandoff), "freeze" freezes it and kills it on
// the provider's time (retire); each with a spare taken (pool 1) and without (a start).
// Metrics: ms-kill, ms-freeze, freeze/kill; and exec-ms, a warm `true`, for the floor.
func BenchmarkHandoff(b *testing.B) {
	for _, pool := range []int{0, 1} {
		b.Run(map[int]string{0: "start", 1: "spare"}[pool], func(b *testing.B) {
			var p *Provider
			if pool > 0 {
				p = newPooled(b, Config{})
			} else {
				p = newProvider(b, Config{})
			}
			ctx := context.Background()
			sb := sandbox.Sandbox(newSandbox(b, p, sandbox.CreateOptions{}))
			var took [2]time.Duration
			var warm time.Duration
			for b.Loop() {
				for mode := range 2 {
					b.StopTimer()
					if _, err := sb.Start(ctx, sandbox.ExecRequest{Argv: []string{"python3", "-m", "http.server", "8000", "--bind", "127.0.0.1"}}); err != nil {
						b.Fatal(err)
					}
					if pool > 0 {
						spareIDs(b, p, sandbox.CreateOptions{}, 1)
					}
					killOnHandoff = mode == 0
					b.StartTimer()
					t0 := time.Now()
					next, err := p.Handoff(ctx, sb, sandbox.CreateOptions{})
					if err != nil {
						b.Fatal(err)
					}
					if res, err := next.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil || res.ExitCode != 0 {
						b.Fatalf("%+v %v", res, err)
					}
					took[mode] += time.Since(t0)
					t1 := time.Now()
					if res, err := next.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil || res.ExitCode != 0 {
						b.Fatalf("%+v %v", res, err)
					}
					warm += time.Since(t1)
					b.StopTimer()
					sb.Close(ctx) // waits for the old one's shutdown, outside the timer
					sb = next
					b.StartTimer()
				}
			}
			killOnHandoff = false
			sb.Close(ctx)
			n := float64(b.N)
			b.ReportMetric(float64(took[0].Microseconds())/n/1000, "ms-kill")
			b.ReportMetric(float64(took[1].Microseconds())/n/1000, "ms-freeze")
			b.ReportMetric(float64(warm.Microseconds())/n/2000, "exec-ms")
			b.ReportMetric(float64(took[1])/float64(took[0]), "freeze/kill")
		})
	}
}
