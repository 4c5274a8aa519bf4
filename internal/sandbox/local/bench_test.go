//go:build linux

package local

import (
	"bytes"
	"context"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/egress"
)

// BenchmarkCreateToFirstCommand: Create → Exec true → result, with every limit, the
// seccomp filter and the cgroup on; Close is outside the timer. HostDir mounts a host
// directory (as root: handed to the sandbox user and staged by a bind mount); Private
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
