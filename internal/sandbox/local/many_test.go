//go:build linux

package local

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/testenv"
)

// Several toolhost processes share one machine: their run and workspace directories, the
// loop devices, the mount table. These tests run this test binary as separate processes
// (TestHelperProcess, chosen by envHelper) that do what toolhost processes do.

const envHelper = "TOOLHOST_LOCAL_TEST_HELPER"

// TestHelperProcess is not a test: it is the body of the helper processes.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv(envHelper)
	if mode == "" {
		t.Skip("a helper process of other tests, not a test")
	}
	var err error
	switch mode {
	case "churn":
		err = helperChurn()
	case "cancel":
		err = helperCancel()
	case "reaper":
		err = helperReaper()
	default:
		err = fmt.Errorf("unknown helper mode %q", mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "HELPER FAILED:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// helperCmd is this test binary run as a helper in mode, with env added.
func helperCmd(mode string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), append([]string{envHelper + "=" + mode}, env...)...)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

func envInt(name string) int {
	n, _ := strconv.Atoi(os.Getenv(name))
	return n
}

// sharedDirs makes a run dir and a workspace dir for several processes to share, the
// workspace dir where the sandbox user can reach it when the host is root (below a
// directory anyone may pass through, as /var/tmp).
func sharedDirs(t *testing.T) (run, ws string) {
	base, err := os.MkdirTemp("/var/tmp", "toolhost-many-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(base, 0o711); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	return filepath.Join(base, "run"), filepath.Join(base, "ws")
}

// hostState counts what sandboxes leave on the host under the workspace dir ws: loop
// devices bound to its images, mounts below it, images, and entries other than the
// volume pool's own directories; and under the run dir, sandbox run dirs.
type hostState struct {
	loops, mounts, images, wsEntries, runDirs int
	detail                                    []string
}

func countHostState(t *testing.T, run, ws string) hostState {
	t.Helper()
	var st hostState
	backing, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range backing {
		b, err := os.ReadFile(f)
		if err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), ws+"/") {
			st.loops++
			st.detail = append(st.detail, "loop "+f+" -> "+strings.TrimSpace(string(b)))
		}
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(mi)) {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], ws+"/") {
			st.mounts++
			st.detail = append(st.detail, "mount "+f[4])
		}
	}
	imgs, _ := filepath.Glob(filepath.Join(ws, ".volumes", "*"))
	for _, f := range imgs {
		if strings.HasSuffix(f, ".img") || strings.HasSuffix(f, ".trash") {
			st.images++
			st.detail = append(st.detail, "image "+f)
		}
	}
	ents, _ := os.ReadDir(ws)
	for _, e := range ents {
		if e.Name() != ".volumes" && e.Name() != ".templates" {
			st.wsEntries++
			st.detail = append(st.detail, "workspace dir entry "+e.Name())
		}
	}
	if ents, err := os.ReadDir(filepath.Join(run, "sandboxes")); err == nil {
		st.runDirs = len(ents)
		for _, e := range ents {
			st.detail = append(st.detail, "run dir "+e.Name())
		}
	}
	return st
}

// Four processes share one workspace dir and one run dir and open and close 200
// sandboxes between them, private workspaces (volumes) and host directories (staged bind
// mounts as root, one of them on another filesystem), each starting with a prune as every
// toolhost process does, and pruning again as they go. None warns about another's
// workspace, none loses a mount (every sandbox writes and reads back its workspace), and
// nothing is left: no loop device, mount, image, run dir or lock.
func TestManyProcessesShareTheDirectories(t *testing.T) {
	testenv.NeedBwrap(t)
	if testing.Short() {
		t.Skip("-short: 200 sandboxes in four processes")
	}
	run, ws := sharedDirs(t)
	before := countHostState(t, run, ws)
	const procs, each = 4, 50
	type result struct {
		i      int
		err    error
		stderr string
	}
	results := make(chan result, procs)
	for i := range procs {
		hostBase := t.TempDir()
		if i == 0 {
			// Another filesystem than the workspace dir's: the report's case.
			d, err := os.MkdirTemp("/dev/shm", "toolhost-many-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(d) })
			hostBase = d
		}
		cmd := helperCmd("churn",
			"MANY_RUN="+run, "MANY_WS="+ws, "MANY_N="+strconv.Itoa(each), "MANY_HOST="+hostBase, "MANY_ID="+strconv.Itoa(i))
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stderr, &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { // owned by this test: ends with the helper, which has a hang bound below
			err := cmd.Wait()
			results <- result{i, err, stderr.String()}
		}()
		t.Cleanup(func() { _ = cmd.Process.Kill() })
	}
	hang := time.After(10 * time.Minute) // a hang bound, not a timing
	for range procs {
		select {
		case r := <-results:
			if r.err != nil {
				t.Errorf("process %d: %v\n%s", r.i, r.err, r.stderr)
				continue
			}
			for line := range strings.Lines(r.stderr) {
				if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
					t.Errorf("process %d logged: %s", r.i, line)
				}
			}
		case <-hang:
			t.Fatal("the processes did not finish in 10 minutes")
		}
	}
	after := settledHostState(t, run, ws, before)
	if !after.same(before) {
		t.Errorf("left behind: before %+v, after %+v:\n%s", before, after, strings.Join(after.detail, "\n"))
	}
}

func (a hostState) same(b hostState) bool {
	return a.loops == b.loops && a.mounts == b.mounts && a.images == b.images && a.wsEntries == b.wsEntries && a.runDirs == b.runDirs
}

// settledHostState counts again until the count is want's or 30 s have passed (a hang
// bound): the kernel lets a loop device go a moment after its last mount namespace ends.
func settledHostState(t *testing.T, run, ws string, want hostState) hostState {
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := countHostState(t, run, ws)
		if st.same(want) || time.Now().After(deadline) {
			return st
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// helperChurn opens and closes MANY_N sandboxes in the shared directories.
func helperChurn() error {
	id := os.Getenv("MANY_ID")
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	p, err := New(Config{RunDir: os.Getenv("MANY_RUN"), WorkspaceDir: os.Getenv("MANY_WS"), Logger: log})
	if err != nil {
		return err
	}
	ctx := context.Background()
	n := envInt("MANY_N")
	for i := range n {
		opts := sandbox.CreateOptions{}
		if i%2 == 1 {
			opts.Workspace = filepath.Join(os.Getenv("MANY_HOST"), "h"+strconv.Itoa(i))
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Minute) // hang bound
		sb, err := p.Create(cctx, opts)
		cancel()
		if err != nil {
			return fmt.Errorf("sandbox %d: %w", i, err)
		}
		want := "p" + id + "-" + strconv.Itoa(i)
		ectx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		res, err := sb.Exec(ectx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo " + want + " > f && cat f"}})
		cancel()
		if err == nil && (res.ExitCode != 0 || strings.TrimSpace(string(res.Stdout)) != want) {
			err = fmt.Errorf("exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
		}
		if err != nil {
			return fmt.Errorf("sandbox %d: write and read back its workspace: %w", i, err)
		}
		if opts.Workspace != "" {
			if b, err := os.ReadFile(filepath.Join(opts.Workspace, "f")); err != nil || strings.TrimSpace(string(b)) != want {
				return fmt.Errorf("sandbox %d: the host directory holds %q (%v), want %q", i, b, err, want)
			}
		}
		cctx, cancel = context.WithTimeout(ctx, 2*time.Minute)
		err = sb.Close(cctx)
		cancel()
		if err != nil {
			return fmt.Errorf("sandbox %d: close: %w", i, err)
		}
		if i%5 == 4 {
			p.prune() // as a toolhost process starting now would
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return p.Close(cctx)
}

// A create cancelled at any point of its start leaves nothing running, and the process
// then told to stop (SIGTERM) exits within its bound: at 0, 10, 20 ... 300 ms. Each run is
// watched by a reaper process (a child subreaper), so a sandbox process orphaned by its
// toolhost is found, not lost to init.
func TestCancelledCreateThenSIGTERM(t *testing.T) {
	testenv.NeedBwrap(t)
	run, ws := sharedDirs(t)
	t.Run("cancel", func(t *testing.T) {
		for ms := 0; ms <= 300; ms += 10 {
			t.Run(strconv.Itoa(ms)+"ms", func(t *testing.T) {
				t.Parallel() // the processes share the directories, as toolhost processes do
				cmd := helperCmd("reaper", "MANY_RUN="+run, "MANY_WS="+ws, "MANY_CANCEL_MS="+strconv.Itoa(ms))
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Errorf("create cancelled at %d ms: %v\n%s", ms, err, out)
				}
			})
		}
	})
	after := settledHostState(t, run, ws, hostState{})
	if !after.same(hostState{}) {
		t.Errorf("left behind: %+v:\n%s", after, strings.Join(after.detail, "\n"))
	}
}

// stopBound is how long a process told to stop may take: the 5 s, a hang bound.
const stopBound = 5 * time.Second

// helperReaper becomes a child subreaper, runs a "cancel" helper, sends it SIGTERM once
// its create was cancelled, and checks that it exits within stopBound and that no process
// of its sandboxes is left (they would be reparented here).
func helperReaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("become a subreaper: %w", err)
	}
	cmd := helperCmd("cancel")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	defer cmd.Process.Kill()
	// The helper says "cancelled" when its create's context ended (the create itself may
	// still be returning): then it is told to stop.
	lines := bufio.NewScanner(out)
	waitLine := func(want string) error {
		for lines.Scan() {
			if lines.Text() == want {
				return nil
			}
		}
		return fmt.Errorf("the helper ended before saying %q: %v\n%s", want, cmd.Wait(), stderr.String())
	}
	if err := waitLine("cancelled"); err != nil {
		return err
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }() // owned by the reaper: ends with the helper
	select {
	case err := <-exited:
		if err != nil {
			return fmt.Errorf("the helper failed: %w\n%s", err, stderr.String())
		}
	case <-time.After(stopBound):
		_ = cmd.Process.Kill()
		<-exited // bounded by WaitDelay; its stderr is ours to read after
		return fmt.Errorf("the helper did not exit within %s of SIGTERM\n%s", stopBound, stderr.String())
	}
	// Orphans of its sandboxes would now be our children. One that was killed with the
	// others but reparented here before it died is a zombie for us to reap, not a process
	// left running.
	var left []string
	for _, k := range children(os.Getpid()) {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(k) + "/stat")
		var ws unix.WaitStatus
		if wpid, _ := unix.Wait4(k, &ws, unix.WNOHANG, nil); wpid == k {
			continue
		}
		left = append(left, strings.TrimSpace(string(b)))
		_ = syscall.Kill(k, syscall.SIGKILL)
	}
	if len(left) > 0 {
		return fmt.Errorf("processes left running after the helper exited:\n%s", strings.Join(left, "\n"))
	}
	return nil
}

// children lists the processes whose parent is pid (zombies included: an orphan that
// died is still a process left behind until reaped).
func children(pid int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pp, err := parentPID(n); err == nil && pp == pid {
			out = append(out, n)
		}
	}
	return out
}

// helperCancel creates a sandbox whose context ends after MANY_CANCEL_MS, then waits for
// SIGTERM and stops as the toolhost CLI does: cancel, close what it has, exit.
func helperCancel() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	p, err := New(Config{RunDir: os.Getenv("MANY_RUN"), WorkspaceDir: os.Getenv("MANY_WS"), Logger: log})
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, time.Duration(envInt("MANY_CANCEL_MS"))*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	var sb sandbox.Sandbox
	var cerr error
	wg.Go(func() { sb, cerr = p.Create(cctx, sandbox.CreateOptions{}) })
	<-cctx.Done()
	fmt.Println("cancelled")
	<-ctx.Done() // SIGTERM
	wg.Wait()
	closeCtx, cancelClose := context.WithTimeout(context.Background(), stopBound)
	defer cancelClose()
	if cerr == nil {
		// The create finished before its deadline: close it like any other.
		if err := sb.Close(closeCtx); err != nil {
			return err
		}
	} else if !errors.Is(cerr, context.DeadlineExceeded) && !errors.Is(cerr, context.Canceled) {
		return fmt.Errorf("create: %w", cerr)
	}
	return p.Close(closeCtx)
}
