//go:build linux

package local

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/pgzip"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/testenv"
	"golang.org/x/sys/unix"
)

// A snapshot is packed from the sandbox's own view: a background loop that swaps a
// workspace entry thousands of times between a regular file and a symbolic link to a host
// file (one the host could read) while snapshots are taken never brings a host byte into
// any of them.
func TestSnapshotRaceFindsNoHostByte(t *testing.T) {
	p := newProvider(t, Config{})
	secretDir := t.TempDir()
	secret := "HOST-ONLY-" + strings.Repeat("x", 40)
	if err := os.WriteFile(filepath.Join(secretDir, "shadow"), []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	sb := newSandbox(t, p, sandbox.CreateOptions{})
	ctx := context.Background()
	target := filepath.Join(secretDir, "shadow")
	_, err := sb.Start(ctx, sandbox.ExecRequest{Argv: []string{"python3", "-c", `
import os
n = 0
while True:
    for make in (lambda p: os.symlink("` + target + `", p), lambda p: open(p, "w").write("decoy"), lambda p: os.symlink("/etc/shadow", p)):
        try:
            os.unlink("e.tmp")
        except FileNotFoundError:
            pass
        make("e.tmp")
        os.replace("e.tmp", "entry")
        n += 1
    if n % 300 == 0:
        open("/tmp/swaps.tmp", "w").write(str(n))
        os.replace("/tmp/swaps.tmp", "/tmp/swaps")
`}})
	if err != nil {
		t.Fatal(err)
	}
	swapsSoFar := func() int {
		res := sh(t, sb, "cat /tmp/swaps 2>/dev/null || echo 0")
		n, _ := strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
		return n
	}
	saves, swaps := 0, 0
	for ; saves < 2000 && (saves < 100 || swaps < 3000); saves++ {
		var buf bytes.Buffer
		if err := sb.Archive(ctx, &buf, nil); err != nil {
			t.Fatalf("archive %d: %v", saves, err)
		}
		for name, b := range archiveFiles(t, buf.Bytes()) {
			if bytes.Contains(b, []byte("HOST-ONLY")) {
				t.Fatalf("archive %d: %s holds the host's file", saves, name)
			}
		}
		if saves%20 == 0 {
			swaps = swapsSoFar()
		}
	}
	if swaps = swapsSoFar(); swaps < 3000 {
		t.Fatalf("only %d swaps during %d saves: the race was not exercised", swaps, saves)
	}
	t.Logf("%d saves during %d swaps", saves, swaps)
}

func archiveFiles(t *testing.T, data []byte) map[string][]byte {
	t.Helper()
	zr, err := pgzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	out := map[string][]byte{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag == tar.TypeReg {
			b, _ := io.ReadAll(tr)
			out[hdr.Name] = b
		}
	}
}

// The agent stopped with SIGSTOP (only the host can: from inside, pid 1 ignores it): a
// call with a short timeout fails within timeout + grace saying the sandbox stopped
// answering, the sandbox is ended, and its workspace is kept for a handoff.
func TestStoppedAgent(t *testing.T) {
	p := newProvider(t, Config{})
	ctx := context.Background()
	sbi, err := p.Create(ctx, sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sb := sbi.(*Sandbox)
	defer sb.Close(ctx)
	if err := sb.WriteFile(ctx, "work.txt", []byte("unsaved work\n")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(sb.initPID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}, Timeout: time.Second})
		done <- err
	}()
	select {
	case err = <-done:
	case <-time.After(2 * time.Minute): // a liveness bound, far above timeout + grace
		t.Fatal("a call to a stopped agent never returned")
	}
	if !errors.Is(err, sandbox.ErrUnresponsive) || !errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("call to a stopped agent: %v (want ErrUnresponsive and ErrClosed)", err)
	}
	// The workspace survives for the next sandbox.
	next, err := p.Handoff(ctx, sb, sandbox.CreateOptions{})
	if err != nil {
		t.Fatalf("handoff from the stopped sandbox: %v", err)
	}
	defer next.Close(ctx)
	if b, err := next.ReadFile(ctx, "work.txt", 0); err != nil || string(b) != "unsaved work\n" {
		t.Fatalf("the work after the handoff: %q %v", b, err)
	}
}

// write_file refuses a FIFO at once (opening it for writing would wait for a reader), and
// a socket or a directory too.
func TestWriteRefusesSpecialFiles(t *testing.T) {
	p := newProvider(t, Config{})
	sb := newSandbox(t, p, sandbox.CreateOptions{})
	sh(t, sb, "mkfifo fifo; mkdir dir; python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"sock\")'")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for name, want := range map[string]error{"fifo": sandbox.ErrNotRegular, "sock": sandbox.ErrNotRegular, "dir": sandbox.ErrIsDir} {
		err := sb.WriteFile(ctx, name, []byte("x"))
		if !errors.Is(err, want) {
			t.Errorf("write %s: %v, want %v", name, err, want)
		}
		if _, err := sb.ReadFile(ctx, name, 0); err == nil {
			t.Errorf("read %s succeeded", name)
		}
	}
	if ctx.Err() != nil {
		t.Fatal("a write to a special file waited")
	}
}

// Writes are atomic: a reader in the sandbox never sees a file half written, and the
// replaced file's mode is kept.
func TestWriteIsAtomic(t *testing.T) {
	p := newProvider(t, Config{})
	sb := newSandbox(t, p, sandbox.CreateOptions{})
	ctx := context.Background()
	a, b := bytes.Repeat([]byte("a"), 1<<20), bytes.Repeat([]byte("b"), 1<<20)
	if err := sb.WriteFile(ctx, "f", a); err != nil {
		t.Fatal(err)
	}
	sh(t, sb, "chmod 0751 f")
	reader, err := sb.Start(ctx, sandbox.ExecRequest{Argv: []string{"python3", "-c", `
import time
bad = 0
end = time.time() + 3
while time.time() < end:
    with open("f", "rb") as f:
        d = f.read()
    if len(d) != 1 << 20 or len(set(d)) != 1:
        bad += 1
open("/tmp/bad", "w").write(str(bad))
`}})
	if err != nil {
		t.Fatal(err)
	}
	_ = reader
	for i := 0; i < 40; i++ {
		data := a
		if i%2 == 1 {
			data = b
		}
		if err := sb.WriteFile(ctx, "f", data); err != nil {
			t.Fatal(err)
		}
	}
	var res sandbox.ExecResult
	testenv.Eventually(func() bool { res = sh(t, sb, "cat /tmp/bad 2>/dev/null"); return len(res.Stdout) > 0 })
	if string(res.Stdout) != "0" {
		t.Fatalf("the reader saw %q torn reads", res.Stdout)
	}
	if res := sh(t, sb, "stat -c %a f; ls -A | grep -c toolhost- || true"); string(res.Stdout) != "751\n0\n" {
		t.Fatalf("mode after rewrites, and temporary files left: %q", res.Stdout)
	}
}

// An agent binary the sandbox user may not execute (mode 0700, root's) is copied into a
// sealed memfd, which it may execute and no one can change.
func TestAgentExecutableCopy(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI runs as root; this test needs root to run a program as another uid")
		}
		t.Skip("needs root to run a program as another uid")
	}
	exe := filepath.Join(t.TempDir(), "agent")
	echoAgent(t, exe)
	id := identity{root: true, uid: DefaultHostID, gid: DefaultHostID}
	f, err := openAgent(exe, id)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	checkSealedCopy(t, f, id)
	// An agent the sandbox user may execute is used as it is.
	if err := os.Chmod(exe, 0o755); err != nil {
		t.Fatal(err)
	}
	g, err := openAgent(exe, id)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if link, _ := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", g.Fd())); link != exe {
		t.Fatalf("a 0755 agent was copied: %s", link)
	}
}

// TestAgentOnlyIsChecked: the agent-only executable is used only when its SHA-256 is the
// digest linked into the host: as it is when the sandbox user may execute it, else as a
// sealed copy hashed as it is copied; another file, a file that is not regular (a FIFO
// would block a plain open forever) or a missing one is refused, each with its own error,
// and none hangs.
func TestAgentOnlyIsChecked(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Skipf(t, "needs root to run a program as another uid")
	}
	id := identity{root: true, uid: DefaultHostID, gid: DefaultHostID}
	dir := t.TempDir()
	exe := filepath.Join(dir, agentFile)
	b := echoAgent(t, exe)
	sum := sha256.Sum256(b)
	digest := hex.EncodeToString(sum[:])

	f, err := openAgentOnly(exe, digest, id)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	checkSealedCopy(t, f, id)
	// One the sandbox user may execute is used as it is.
	if err := os.Chmod(exe, 0o755); err != nil {
		t.Fatal(err)
	}
	g, err := openAgentOnly(exe, digest, id)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if link, _ := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", g.Fd())); link != exe {
		t.Fatalf("a 0755 agent-only executable was copied: %s", link)
	}

	if err := os.WriteFile(exe, append(b, 0), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := openAgentOnly(exe, digest, id); err == nil || !strings.Contains(err.Error(), "not the agent this binary was built with") {
		t.Errorf("a changed agent: %v", err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { // owned by this test; a hang fails it at the bound below
		_, err := openAgentOnly(fifo, digest, id)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("a FIFO: %v", err)
		}
	case <-time.After(testenv.HangBound):
		// Unblock the open so the goroutine ends, then fail.
		w, _ := os.OpenFile(fifo, os.O_WRONLY, 0)
		w.Close()
		<-done
		t.Fatal("a FIFO as the agent-only executable hung the provider")
	}
	if _, err := openAgentOnly(filepath.Join(dir, "missing"), digest, id); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing agent: %v", err)
	}
}

// checkSealedCopy fails t unless f (a copy of /usr/bin/echo) is a memfd that cannot be
// written and that the sandbox user id can execute.
func checkSealedCopy(t *testing.T, f *os.File, id identity) {
	t.Helper()
	if link, _ := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", f.Fd())); !strings.HasPrefix(link, "/memfd:toolhost-agent") {
		t.Fatalf("a 0700 agent was not copied: %s", link)
	}
	if _, err := f.Write([]byte("x")); err == nil {
		t.Fatal("the memfd copy is writable")
	}
	cmd := exec.Command("/proc/self/fd/3", "ran as the sandbox user")
	cmd.ExtraFiles = []*os.File{f}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: id.credential()}
	if out, err := cmd.CombinedOutput(); err != nil || string(out) != "ran as the sandbox user\n" {
		t.Fatalf("exec of the copy as uid %d: %q %v", id.uid, out, err)
	}
}

// echoAgent writes a copy of /usr/bin/echo at path, mode 0700, and returns its bytes.
func echoAgent(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile("/usr/bin/echo")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o700); err != nil {
		t.Fatal(err)
	}
	return b
}
