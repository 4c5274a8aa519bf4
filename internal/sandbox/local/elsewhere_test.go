//go:build linux

package local

import (
	"context"
	"io"
	"os/exec"
	"testing"
	"time"

	"github.com/toolhost/toolhost/internal/testenv"
)

// A mount namespace made anywhere on the host while a volume is mounted holds a copy of
// its mount, which the unmount does not reach when the namespace is private (as
// unshare(1) makes, and internal/volume's own test did, holding every volume of the host
// for seconds). The provider's spare volume, which no sandbox ever had, closes all the
// same: Close removes its mount point, which detaches such copies (found by make test at
// load 13: TestTakeScreenshotOfSandboxDevServer's Close failed, "volume still mounted in
// another mount namespace").
func TestCloseWithTheSpareVolumeHeldElsewhere(t *testing.T) {
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		testenv.Skipf(t, "unshare(1) not installed (util-linux): %v", err)
	}
	testenv.NeedBwrap(t)
	// Not newProvider: this test closes the provider itself, once.
	p, err := New(Config{RunDir: testenv.RunDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			p.Close(context.Background())
		}
	})
	if p.spare == nil {
		testenv.Skipf(t, "no workspace volumes here (root, loop devices, ext4 and mkfs.ext4)")
	}
	testenv.WaitFor(t, "the spare volume", func() bool {
		p.spare.mu.Lock()
		defer p.spare.mu.Unlock()
		return p.spare.ready != nil
	})
	// Another process's private mount namespace, with a copy of every mount of the host.
	cmd := exec.Command(unshare, "-m", "--propagation", "private", "sh", "-c", "echo ready; exec sleep 60")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if _, err := io.ReadFull(out, make([]byte, 6)); err != nil {
		t.Fatalf("wait for the namespace: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	closed = true
	if err := p.Close(ctx); err != nil {
		t.Fatalf("Close with the spare volume held by another process's namespace: %v", err)
	}
}
