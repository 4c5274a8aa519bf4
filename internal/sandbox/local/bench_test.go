//go:build linux

package local

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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
//	go test -run '^$' -bench CreateVsBwrap -benchtime 20x -count 6 ./internal/sandbox/local
func BenchmarkCreateVsBwrap(b *testing.B) {
	p := newProvider(b, Config{})
	ctx := context.Background()
	ws := b.TempDir()
	var bare, create time.Duration
	for b.Loop() {
		cmd := exec.Command(BwrapPath, "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr",
			"--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin",
			"--proc", "/proc", "--dev", "/dev", "/bin/true")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.id.credential()}
		t0 := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("bare bwrap: %v %s", err, out)
		}
		bare += time.Since(t0)
		t1 := time.Now()
		sb, err := p.Create(ctx, sandbox.CreateOptions{Workspace: ws})
		if err != nil {
			b.Fatal(err)
		}
		if res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil || res.ExitCode != 0 {
			b.Fatalf("%+v %v", res, err)
		}
		create += time.Since(t1)
		b.StopTimer()
		if err := sb.Close(ctx); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(float64(create.Microseconds())/n/1000, "create-ms")
	b.ReportMetric(float64(bare.Microseconds())/n/1000, "bwrap-ms")
	b.ReportMetric(float64(create)/float64(bare), "create/bwrap")
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
