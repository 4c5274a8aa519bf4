//go:build linux

package local

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/envd"
	"github.com/toolhost/toolhost/internal/testenv"
)

// devServer starts `python3 -m http.server port` in the background in the workspace and
// waits until the sandbox's Ports lists it.
func devServer(t *testing.T, sb *Sandbox, port int) sandbox.Process {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pr, err := sb.Start(ctx, sandbox.ExecRequest{Argv: []string{"python3", "-m", "http.server", strconv.Itoa(port)}})
	if err != nil {
		t.Fatalf("start http.server: %v", err)
	}
	lp := waitPort(t, sb, port)
	if lp.Cmd != "python3" || lp.PID != pr.PID {
		t.Errorf("port %d listed as %+v, want python3 pid %d", port, lp, pr.PID)
	}
	return pr
}

// waitPort polls Ports until port shows up, with a deadline.
func waitPort(t *testing.T, sb *Sandbox, port int) envd.ListeningPort {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		ps, err := sb.Ports(ctx)
		if err != nil {
			t.Fatalf("Ports: %v", err)
		}
		if i := slices.IndexFunc(ps, func(p envd.ListeningPort) bool { return p.Port == port }); i >= 0 {
			return ps[i]
		}
		select {
		case <-ctx.Done():
			t.Fatalf("port %d never listed (last: %+v)", port, ps)
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// get fetches u with a client of its own (no connection reuse between tests).
func get(ctx context.Context, hc *http.Client, u string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return b, err
	}
	if resp.StatusCode != http.StatusOK {
		return b, fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return b, nil
}

func newHTTPClient(t *testing.T) *http.Client {
	tr := &http.Transport{DisableCompression: true, Proxy: nil}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// TestPreview: a dev server in a sandbox without network, seen from the host.
func TestPreview(t *testing.T) {
	p := newProvider(t, Config{})
	ws := t.TempDir()
	sb := newSandbox(t, p, sandbox.CreateOptions{Workspace: ws})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hc := newHTTPClient(t)

	page := "<h1>hello from the sandbox</h1>\n"
	if err := sb.WriteFile(ctx, "hello.html", []byte(page)); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 5<<20)
	_, _ = rand.Read(big)
	if err := os.WriteFile(filepath.Join(ws, "big.bin"), big, 0o644); err != nil {
		t.Fatal(err)
	}

	// Nothing listens yet.
	if _, err := sb.PreviewURL(ctx, 8123); !errors.Is(err, sandbox.ErrPortClosed) {
		t.Fatalf("PreviewURL before the server started: %v, want ErrPortClosed", err)
	} else if !strings.Contains(err.Error(), "8123") {
		t.Errorf("error does not name the port: %v", err)
	}
	for _, bad := range []int{0, -1, 65536} {
		if _, err := sb.PreviewURL(ctx, bad); err == nil {
			t.Errorf("PreviewURL(%d) succeeded", bad)
		}
	}

	srv := devServer(t, sb, 8123)
	if ps, err := sb.Ports(ctx); err == nil {
		t.Logf("ports: %+v", ps)
	}
	u, err := sb.PreviewURL(ctx, 8123)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("preview of 8123: %s", u)
	if host, _, _ := net.SplitHostPort(u.Host); u.Scheme != "http" || host != "127.0.0.1" || u.Path != "/" {
		t.Fatalf("preview URL %s, want http://127.0.0.1:PORT/", u)
	}
	u2, err := sb.PreviewURL(ctx, 8123)
	if err != nil || u2.String() != u.String() {
		t.Fatalf("second PreviewURL: %v %v, want the same %s", u2, err, u)
	}

	listing, err := get(ctx, hc, u.String())
	if err != nil || !bytes.Contains(listing, []byte("Directory listing")) || !bytes.Contains(listing, []byte("hello.html")) {
		t.Fatalf("directory listing: %v\n%s", err, listing)
	}
	if b, err := get(ctx, hc, u.JoinPath("hello.html").String()); err != nil || string(b) != page {
		t.Fatalf("hello.html: %q %v", b, err)
	}

	began := time.Now()
	b, err := get(ctx, hc, u.JoinPath("big.bin").String())
	if err != nil || sha256.Sum256(b) != sha256.Sum256(big) {
		t.Fatalf("5 MB file: %d bytes, %v (intact: %v)", len(b), err, bytes.Equal(b, big))
	}
	t.Logf("5 MB through the preview in %s", time.Since(began))

	// Concurrent requests, each its own connection (http.server answers HTTP/1.0 and closes).
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Go(func() {
			path := "hello.html"
			want := []byte(page)
			if i%5 == 0 {
				path, want = "big.bin", big
			}
			b, err := get(ctx, hc, u.JoinPath(path).String())
			if err != nil || !bytes.Equal(b, want) {
				errs <- fmt.Errorf("request %d for %s: %d bytes, %v", i, path, len(b), err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	// Another closed port, with the server still up.
	if _, err := sb.PreviewURL(ctx, 8124); !errors.Is(err, sandbox.ErrPortClosed) {
		t.Fatalf("PreviewURL of a closed port: %v, want ErrPortClosed", err)
	} else {
		t.Logf("closed port: %v", err)
	}

	// Once the server is gone, a connection to the existing preview ends promptly.
	if res := sh(t, sb, fmt.Sprintf("kill %d; for i in $(seq 100); do kill -0 %[1]d 2>/dev/null || exit 0; sleep 0.05; done; exit 1", srv.PID)); res.ExitCode != 0 {
		t.Fatalf("stop http.server: %+v %s", res, res.Stderr)
	}
	began = time.Now()
	if _, err := get(ctx, hc, u.String()); err == nil {
		t.Fatal("GET through the preview of a stopped server succeeded")
	} else if d := time.Since(began); d > 5*time.Second {
		t.Fatalf("GET of a stopped server took %s to fail: %v", d, err)
	} else {
		t.Logf("after the server stopped: %v (in %s)", err, d)
	}
	if _, err := sb.PreviewURL(ctx, 8123); !errors.Is(err, sandbox.ErrPortClosed) {
		t.Fatalf("PreviewURL after the server stopped: %v, want ErrPortClosed", err)
	}
}

// TestPreviewHostNetwork: with the host network the host's own listeners share the
// sandbox's TCP table; they must not be listed, previewed or dialed.
func TestPreviewHostNetwork(t *testing.T) {
	p := newProvider(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hc := newHTTPClient(t)

	// A host service on 127.0.0.1 and one on every address.
	var hostPorts []int
	for _, addr := range []string{"127.0.0.1:0", "[::]:0"} {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, "host secret")
		})}
		go func() { _ = srv.Serve(l) }()
		t.Cleanup(func() { _ = srv.Close() })
		hostPorts = append(hostPorts, l.Addr().(*net.TCPAddr).Port)
	}
	sb := newSandbox(t, p, sandbox.CreateOptions{Network: sandbox.NetworkHost})

	// The sandbox can reach the host service itself (so what follows means something)...
	if res := sh(t, sb, fmt.Sprintf("exec 3<>/dev/tcp/127.0.0.1/%d && echo connected", hostPorts[0])); string(res.Stdout) != "connected\n" {
		t.Fatalf("host network cannot reach the host listener: %+v %s", res, res.Stderr)
	}
	// ...but its ports are not the sandbox's.
	port := freePort(t)
	devServer(t, sb, port)
	ps, err := sb.Ports(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ports of the host-network sandbox: %+v", ps)
	for _, lp := range ps {
		if lp.Port != port {
			t.Errorf("Ports lists %+v, which no sandbox process holds", lp)
		}
	}
	for _, hp := range hostPorts {
		if _, err := sb.PreviewURL(ctx, hp); !errors.Is(err, sandbox.ErrPortClosed) {
			t.Errorf("PreviewURL of the host's port %d: %v, want ErrPortClosed", hp, err)
		}
		if c, err := sb.client.DialPort(ctx, hp); !errors.Is(err, sandbox.ErrPortClosed) {
			if c != nil {
				c.Close()
			}
			t.Errorf("DialPort of the host's port %d: %v, want ErrPortClosed", hp, err)
		}
	}
	// The sandbox's own server is previewable as usual.
	if err := sb.WriteFile(ctx, "index.html", []byte("sandbox page")); err != nil {
		t.Fatal(err)
	}
	u, err := sb.PreviewURL(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := get(ctx, hc, u.String()); err != nil || string(b) != "sandbox page" {
		t.Fatalf("preview in host network: %q %v", b, err)
	}
}

// freePort finds a TCP port free on the host right now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestPreviewEndsWithSandbox: Close stops the listener and the open connections, and
// leaves no goroutine behind; so does the TTL kill.
func TestPreviewEndsWithSandbox(t *testing.T) {
	p := newProvider(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	before := runtime.NumGoroutine()

	for _, ttl := range []bool{false, true} {
		sbi, err := p.Create(ctx, sandbox.CreateOptions{Workspace: t.TempDir(), Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		sb := sbi.(*Sandbox)
		t.Cleanup(func() { _ = sb.Close(context.Background()) })
		devServer(t, sb, 8000)
		u, err := sb.PreviewURL(ctx, 8000)
		if err != nil {
			t.Fatal(err)
		}
		hc := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 30 * time.Second}
		if _, err := get(ctx, hc, u.String()); err != nil {
			t.Fatal(err)
		}
		// A connection held open mid-request: http.server waits for the rest of it.
		held, err := net.Dial("tcp", u.Host)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(held, "GET / HTTP/1.1\r\n"); err != nil {
			t.Fatal(err)
		}

		if ttl {
			// The end time comes now that everything is set up, however slow that was.
			if err := sb.SetTimeout(ctx, 200*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			waitClosed(t, sb)
		} else if err := sb.Close(ctx); err != nil {
			t.Fatal(err)
		}
		_ = held.SetReadDeadline(time.Now().Add(10 * time.Second))
		if n, err := held.Read(make([]byte, 1)); n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("held connection after the sandbox ended (ttl %v): %d %v", ttl, n, err)
		}
		held.Close()
		if _, err := net.DialTimeout("tcp", u.Host, 5*time.Second); err == nil {
			t.Fatalf("the preview %s still accepts after the sandbox ended (ttl %v)", u, ttl)
		}
		if _, err := sb.PreviewURL(ctx, 8000); !errors.Is(err, sandbox.ErrClosed) {
			t.Fatalf("PreviewURL after the end (ttl %v): %v, want ErrClosed", ttl, err)
		}
		hc.CloseIdleConnections()
		if err := sb.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if !testenv.Eventually(func() bool { return runtime.NumGoroutine() <= before }) {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines before, %d after:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
	}
}

// waitClosed waits for the TTL kill to have finished.
func waitClosed(t *testing.T, sb *Sandbox) {
	t.Helper()
	select {
	case <-sb.closeDone:
	case <-time.After(30 * time.Second):
		t.Fatal("the sandbox was not killed at its end time")
	}
}

// TestPreviewIPv6: servers bound to ::1 or :: are reached on [::1] inside the sandbox.
func TestPreviewIPv6(t *testing.T) {
	p := newProvider(t, Config{})
	sb := newSandbox(t, p, sandbox.CreateOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hc := newHTTPClient(t)
	if err := sb.WriteFile(ctx, "index.html", []byte("v6 page")); err != nil {
		t.Fatal(err)
	}
	for port, bind := range map[int]string{8124: "::1", 8125: "::"} {
		if _, err := sb.Start(ctx, sandbox.ExecRequest{Argv: []string{"python3", "-m", "http.server", "--bind", bind, strconv.Itoa(port)}}); err != nil {
			t.Fatal(err)
		}
		lp := waitPort(t, sb, port)
		if want := fmt.Sprintf("[::1]:%d", port); lp.Dial != want || !slices.Equal(lp.Addrs, []string{bind}) {
			t.Errorf("bound to %s: %+v, want dial %s", bind, lp, want)
		}
		u, err := sb.PreviewURL(ctx, port)
		if err != nil {
			t.Fatal(err)
		}
		if b, err := get(ctx, hc, u.String()); err != nil || string(b) != "v6 page" {
			t.Fatalf("preview of a server bound to %s: %q %v", bind, b, err)
		}
	}
}
