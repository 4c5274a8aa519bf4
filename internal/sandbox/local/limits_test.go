//go:build linux

package local

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/testenv"
)

// requireEnforced fails (or, outside CI, skips) when the host cannot enforce a limit: the
// test would prove nothing.
func requireEnforced(t *testing.T, p *Provider, resource string) {
	t.Helper()
	for _, e := range p.Enforcement() {
		if e.Resource == resource && e.Missing != "" {
			testenv.Skipf(t, "the %s limit is not enforced here: %s", resource, e.Missing)
		}
	}
}

// Past the process limit, forks fail inside the sandbox, the sandbox keeps working once
// they end, and the host is untouched. The program forks a bounded number of children
// (never an unbounded fork bomb), notes the first refusal, and kills them itself.
func TestProcessLimit(t *testing.T) {
	p := newProvider(t, Config{Limits: Limits{Processes: 64}})
	requireEnforced(t, p, "processes")
	sb := newSandbox(t, p, sandbox.CreateOptions{})
	res := sh(t, sb, `python3 -c '
import os, signal
pids = []
for i in range(100):
    try:
        pid = os.fork()
    except OSError as e:
        print("refused errno", e.errno)
        break
    if pid == 0:
        signal.pause()
        os._exit(0)
    pids.append(pid)
for p in pids:
    os.kill(p, 9)
for p in pids:
    os.waitpid(p, 0)
print("started", len(pids))
'`)
	out := string(res.Stdout)
	if !strings.Contains(out, "refused errno 11") || strings.Contains(out, "started 100") {
		t.Fatalf("100 forks under a limit of 64 processes and threads: %q %q", out, res.Stderr)
	}
	if res := sh(t, sb, "echo alive"); string(res.Stdout) != "alive\n" {
		t.Fatalf("the sandbox did not recover: %+v", res)
	}
	// Another sandbox, and the host, were never short of processes.
	other := newSandbox(t, p, sandbox.CreateOptions{})
	if res := sh(t, other, "for i in 1 2 3 4 5; do true & done; wait; echo fine"); string(res.Stdout) != "fine\n" {
		t.Fatalf("another sandbox: %+v", res)
	}
}

// Past the memory limit the kernel kills the sandbox's own process, and the result says it
// was for memory; the agent and the host live on. Pages of /dev/shm count: 60 MiB there and
// 64 MiB in a process do not fit in 96 MiB, though either alone would.
func TestMemoryLimit(t *testing.T) {
	p := newProvider(t, Config{Limits: Limits{MemoryBytes: 96 << 20, ShmBytes: 64 << 20, TmpBytes: 16 << 20}})
	requireEnforced(t, p, "memory")
	sb := newSandbox(t, p, sandbox.CreateOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	alloc := func(mib int) sandbox.ExecResult {
		t.Helper()
		res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"python3", "-c",
			"b = bytearray(" + strconv.Itoa(mib) + " << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('survived')"}, Timeout: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	res := alloc(300)
	if res.ExitCode != -1 || !res.OOMKilled || strings.Contains(string(res.Stdout), "survived") {
		t.Fatalf("a 300 MiB allocation under a 96 MiB limit: exit %d, OOMKilled %v, stdout %q", res.ExitCode, res.OOMKilled, res.Stdout)
	}
	if res := sh(t, sb, "echo alive"); string(res.Stdout) != "alive\n" {
		t.Fatalf("the agent did not survive: %+v", res)
	}
	if res := alloc(50); res.ExitCode != 0 || res.OOMKilled {
		t.Fatalf("50 MiB alone does not fit under 96 MiB: %+v %q", res, res.Stderr)
	}
	if res := sh(t, sb, "head -c 62914560 /dev/zero > /dev/shm/fill && echo filled"); string(res.Stdout) != "filled\n" {
		t.Fatalf("60 MiB into /dev/shm: %+v %q", res, res.Stderr)
	}
	if res := alloc(50); res.ExitCode != -1 || !res.OOMKilled {
		t.Fatalf("50 MiB with 60 MiB of /dev/shm under a 96 MiB limit: exit %d, OOMKilled %v", res.ExitCode, res.OOMKilled)
	}
	if res := sh(t, sb, "rm /dev/shm/fill; echo alive"); string(res.Stdout) != "alive\n" {
		t.Fatalf("the agent did not survive: %+v", res)
	}
}

// /tmp and /dev/shm have their size; past it, writes fail with ENOSPC.
func TestTmpfsLimits(t *testing.T) {
	p := newProvider(t, Config{Limits: Limits{TmpBytes: 8 << 20, ShmBytes: 4 << 20}})
	sb := newSandbox(t, p, sandbox.CreateOptions{})
	for _, dir := range []string{"/tmp", "/dev/shm"} {
		res := sh(t, sb, "dd if=/dev/zero of="+dir+"/big bs=1M count=20 2>&1; df -k "+dir+" | tail -1")
		if !strings.Contains(string(res.Stdout), "No space left on device") {
			t.Errorf("%s: 20 MiB written past its size: %q", dir, res.Stdout)
		}
	}
}

// A private workspace is its own filesystem of the configured size: past it, ENOSPC, and
// what was written before stays.
func TestDiskLimit(t *testing.T) {
	p := newProvider(t, Config{Limits: Limits{DiskBytes: 64 << 20}})
	requireEnforced(t, p, "disk")
	ctx := context.Background()
	sbi, err := p.Create(ctx, sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sbi.Close(ctx)
	sb := sbi.(*Sandbox)
	if err := sb.WriteFile(ctx, "keep.txt", []byte("written first\n")); err != nil {
		t.Fatal(err)
	}
	res := sh(t, sb, "dd if=/dev/urandom of=big bs=1M count=100 2>&1 | grep -v records; cat keep.txt")
	out := string(res.Stdout)
	if !strings.Contains(out, "No space left on device") || !strings.Contains(out, "written first") {
		t.Fatalf("100 MiB into a 64 MiB workspace: %q", out)
	}
	// A write through the file API fails too, and leaves the old file whole.
	err = sb.WriteFile(ctx, "keep.txt", make([]byte, 80<<20))
	if err == nil {
		t.Fatal("an 80 MiB write_file into a full 64 MiB workspace succeeded")
	}
	if b, err := sb.ReadFile(ctx, "keep.txt", 0); err != nil || string(b) != "written first\n" {
		t.Fatalf("the file a failed write replaced: %q %v", b, err)
	}
	// Nothing setuid or device-like can act on the host through the volume.
	if _, err := os.Stat(sb.ws.path); err != nil {
		t.Fatal(err)
	}
}

// Open files have their limit, inherited by every process.
func TestOpenFilesLimit(t *testing.T) {
	p := newProvider(t, Config{Limits: Limits{OpenFiles: 200}})
	sb := newSandbox(t, p, sandbox.CreateOptions{})
	if res := sh(t, sb, "ulimit -n; ulimit -Hn; ulimit -c"); string(res.Stdout) != "200\n200\n0\n" {
		t.Fatalf("limits in the sandbox: %q", res.Stdout)
	}
}

// The limits in force are reported, each with its mechanism or the reason it is missing.
func TestEnforcementReport(t *testing.T) {
	p := newProvider(t, Config{Limits: Limits{CPUs: 1.5}})
	seen := map[string]bool{}
	for _, e := range p.Enforcement() {
		seen[e.Resource] = true
		if e.Mechanism == "" && e.Missing == "" && e.Limit != "none" && !strings.HasPrefix(e.Limit, "all ") {
			t.Errorf("%s: neither a mechanism nor a reason: %+v", e.Resource, e)
		}
	}
	for _, r := range []string{"memory", "processes", "cpu", "/tmp", "/dev/shm", "disk", "open files", "system calls"} {
		if !seen[r] {
			t.Errorf("no report for %s", r)
		}
	}
}

// A command cannot disarm the agent (pid 1) by lowering its limits: prlimit on another
// process is refused by the seccomp filter (EPERM), the agent's limits stay, and the
// commands after it still start. On the old filter, NOFILE 16 and NPROC 0 on pid 1 left
// every later command of the session failing.
func TestCommandsCannotLowerTheAgentsLimits(t *testing.T) {
	p := newProvider(t, Config{Limits: Limits{OpenFiles: 200}})
	sb := newSandbox(t, p, sandbox.CreateOptions{})
	res := sh(t, sb, "prlimit --pid 1 --nofile=16:16 --nproc=0:0; echo rc=$?; grep -E '^Max (open files|processes)' /proc/1/limits")
	out := string(res.Stdout) + string(res.Stderr)
	if !strings.Contains(out, "rc=1") || !strings.Contains(out, "Operation not permitted") {
		t.Errorf("prlimit on pid 1 was not refused: %q", out)
	}
	if !regexp.MustCompile(`Max open files +200 +200`).MatchString(out) {
		t.Errorf("the agent's open files limit changed: %q", out)
	}
	// Its own limits a process may still lower (ulimit is setrlimit: prlimit64 with pid 0).
	if res := sh(t, sb, "ulimit -n 50 && ulimit -n"); string(res.Stdout) != "50\n" {
		t.Errorf("ulimit -n 50 in a command: %q", res.Stdout)
	}
	if res := sh(t, sb, "ulimit -n"); string(res.Stdout) != "200\n" {
		t.Errorf("the command after one that lowered its own limit: %q", res.Stdout)
	}
}
