//go:build linux

package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/envd"
	"github.com/toolhost/toolhost/internal/envd/client"
	"github.com/toolhost/toolhost/internal/splice"
	"github.com/toolhost/toolhost/internal/testenv"
)

// fakeProc builds a proc directory: the tables and, per pid, its comm and socket fds.
type fakeProc struct {
	t    *testing.T
	dir  string
	tcp  []string
	tcp6 []string
}

func newFakeProc(t *testing.T) *fakeProc {
	return &fakeProc{t: t, dir: t.TempDir()}
}

func hexAddr(a netip.Addr) string {
	var b strings.Builder
	s := a.AsSlice()
	for i := 0; i < len(s); i += 4 {
		fmt.Fprintf(&b, "%02X%02X%02X%02X", s[i+3], s[i+2], s[i+1], s[i]) // little-endian words
	}
	return b.String()
}

func (f *fakeProc) listen(addr string, port int, inode uint64) {
	a := netip.MustParseAddr(addr)
	zero := strings.Repeat("0", len(hexAddr(a)))
	line := fmt.Sprintf("   %d: %s:%04X %s:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 %d 1 0 100 0 0 10 0",
		len(f.tcp)+len(f.tcp6), hexAddr(a), port, zero, inode)
	if a.Is4() {
		f.tcp = append(f.tcp, line)
	} else {
		f.tcp6 = append(f.tcp6, line)
	}
}

func (f *fakeProc) process(pid int, comm string, inodes ...uint64) {
	fd := filepath.Join(f.dir, strconv.Itoa(pid), "fd")
	if err := os.MkdirAll(fd, 0o755); err != nil {
		f.t.Fatal(err)
	}
	_ = os.WriteFile(filepath.Join(f.dir, strconv.Itoa(pid), "comm"), []byte(comm+"\n"), 0o644)
	_ = os.Symlink("/dev/null", filepath.Join(fd, "0"))
	_ = os.Symlink("pipe:[99]", filepath.Join(fd, "1"))
	for i, in := range inodes {
		if err := os.Symlink(fmt.Sprintf("socket:[%d]", in), filepath.Join(fd, strconv.Itoa(i+3))); err != nil {
			f.t.Fatal(err)
		}
	}
}

func (f *fakeProc) server() *Server {
	hdr := "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
	_ = os.MkdirAll(filepath.Join(f.dir, "net"), 0o755)
	_ = os.WriteFile(filepath.Join(f.dir, "net", "tcp"), []byte(hdr+strings.Join(f.tcp, "\n")+"\n"), 0o644)
	_ = os.WriteFile(filepath.Join(f.dir, "net", "tcp6"), []byte(hdr+strings.Join(f.tcp6, "\n")+"\n"), 0o644)
	s, err := New(Config{Workspace: f.t.TempDir(), ProcDir: f.dir})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(s.Close)
	return s
}

// TestPortsOnlyTheSandboxs: listeners nobody visible holds (the host's, sharing the
// table with the host network) are not listed, and a port they share is not dialable.
func TestPortsOnlyTheSandboxs(t *testing.T) {
	f := newFakeProc(t)
	f.listen("0.0.0.0", 22, 100)     // host's sshd
	f.listen("127.0.0.1", 5432, 101) // host's postgres
	f.listen("::", 8123, 200)        // python3 -m http.server, dual-stack
	f.listen("127.0.0.1", 3000, 201) // node
	f.listen("::1", 3000, 202)       // node, second socket
	f.listen("::1", 5433, 203)       // the sandbox's, v6 only...
	f.listen("127.0.0.1", 5433, 102) // ...next to the host's v4 one: dial ::1 only
	f.listen("127.0.0.1", 6000, 204) // the sandbox's (SO_REUSEPORT)...
	f.listen("0.0.0.0", 6000, 103)   // ...and the host's: shared, refused
	f.listen("::", 6001, 206)        // the sandbox's, so v6 only...
	f.listen("127.0.0.1", 6001, 104) // ...next to the host's: dial ::1 only
	f.listen("10.1.2.3", 7000, 205)  // not on loopback
	f.process(1, "bwrap")
	f.process(2, "agent")
	f.process(7, "python3", 200)
	f.process(9, "node", 201, 202)
	f.process(12, "node", 201) // a forked worker holding the same socket
	f.process(13, "pg", 203)
	f.process(14, "evil", 204)
	f.process(15, "bound", 205)
	f.process(16, "v6", 206)
	s := f.server()
	ps, err := s.scanPorts(0)
	if err != nil {
		t.Fatal(err)
	}
	got := ps.list()
	want := []envd.ListeningPort{
		{Port: 3000, PID: 9, Cmd: "node", Addrs: []string{"127.0.0.1", "::1"}, Dial: "127.0.0.1:3000"},
		{Port: 5433, PID: 13, Cmd: "pg", Addrs: []string{"::1"}, Dial: "[::1]:5433"},
		{Port: 6000, PID: 14, Cmd: "evil", Addrs: []string{"127.0.0.1"}},
		{Port: 6001, PID: 16, Cmd: "v6", Addrs: []string{"::"}, Dial: "[::1]:6001"},
		{Port: 7000, PID: 15, Cmd: "bound", Addrs: []string{"10.1.2.3"}},
		{Port: 8123, PID: 7, Cmd: "python3", Addrs: []string{"::"}, Dial: "[::1]:8123"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("ports:\n got %+v\nwant %+v", got, want)
	}
	for port, reason := range map[int]string{22: "no process in the sandbox", 5432: "no process in the sandbox", 6000: "also listened on outside", 7000: "only on addresses other"} {
		ts, why := ps.targets(port)
		if len(ts) != 0 || !strings.Contains(why, reason) {
			t.Errorf("port %d: targets %v (%q), want none because %q", port, ts, why, reason)
		}
	}
	if ts, _ := ps.targets(8123); fmt.Sprint(ts) != "[[::1]:8123 127.0.0.1:8123]" {
		t.Errorf("targets of a dual-stack listener: %v", ts)
	}
}

// echoListener accepts on 127.0.0.1 and echoes upper-cased until EOF, then closes.
func echoListener(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b, _ := io.ReadAll(c)
				_, _ = c.Write([]byte(strings.ToUpper(string(b))))
			}()
		}
	}()
	return l
}

// TestDialPort runs the agent on the host's own /proc: the test process is the "sandbox"
// process that listens.
func TestDialPort(t *testing.T) {
	_, c, sock := agent(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l := echoListener(t)
	port := l.Addr().(*net.TCPAddr).Port

	ps, err := c.Ports(ctx)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(ps, func(p envd.ListeningPort) bool { return p.Port == port })
	if i < 0 || ps[i].PID != os.Getpid() || ps[i].Dial != fmt.Sprintf("127.0.0.1:%d", port) {
		t.Fatalf("port %d in %+v", port, ps)
	}

	for range 3 {
		conn, err := c.DialPort(ctx, port)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write([]byte("hello through the agent")); err != nil {
			t.Fatal(err)
		}
		if err := conn.(splice.CloseWriter).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		b, err := io.ReadAll(conn)
		conn.Close()
		if err != nil || string(b) != "HELLO THROUGH THE AGENT" {
			t.Fatalf("echo: %q %v", b, err)
		}
	}

	// A port nobody listens on.
	l2, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := l2.Addr().(*net.TCPAddr).Port
	l2.Close()
	if _, err := c.DialPort(ctx, closed); !errors.Is(err, sandbox.ErrPortClosed) {
		t.Fatalf("closed port: %v, want ErrPortClosed", err)
	}
	for _, p := range []int{0, -1, 65536} {
		if _, err := c.DialPort(ctx, p); err == nil {
			t.Fatalf("port %d dialed", p)
		}
	}

	// The wire: bad ports and a missing Upgrade are refused by the agent itself.
	hc := rawClient(sock)
	for _, q := range []string{"port=0", "port=65536", "port=80a", "port=%2B80", "port=", "port=1e3", "port=127.0.0.1:80"} {
		req, _ := http.NewRequest(http.MethodGet, "http://sandbox"+envd.PathDial+"?"+q, nil)
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", envd.UpgradeTCP)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "invalid_argument") {
			t.Errorf("%s: HTTP %d %s", q, resp.StatusCode, body)
		}
	}
	resp, err := hc.Get("http://sandbox" + envd.PathDial + "?port=" + strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("dial without Upgrade: HTTP %d", resp.StatusCode)
	}
	resp, err = hc.Get("http://sandbox" + envd.PathDial + "?port=" + strconv.Itoa(closed))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("dial without Upgrade, closed port: HTTP %d", resp.StatusCode)
	}
}

// TestDialEarlyBytes: bytes the port sends at once (a banner) and bytes the client sends
// right behind its request both get through.
func TestDialEarlyBytes(t *testing.T) {
	_, c, sock := agent(t, nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			cn, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = cn.Write([]byte("BANNER\n"))
			line, _ := bufio.NewReader(cn).ReadString('\n')
			_, _ = cn.Write([]byte("got " + line))
			cn.Close()
		}
	}()
	port := l.Addr().(*net.TCPAddr).Port
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET %s?port=%d HTTP/1.1\r\nHost: sandbox\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\nearly\n", envd.PathDial, port, envd.UpgradeTCP)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("handshake: %v %v", resp, err)
	}
	rest, _ := io.ReadAll(br)
	if string(rest) != "BANNER\ngot early\n" {
		t.Fatalf("after the 101: %q", rest)
	}

	// Through the client, which keeps what it read past the 101 (the banner may come in
	// the same read).
	tc, err := c.DialPort(context.Background(), port)
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	_, _ = tc.Write([]byte("client\n"))
	_ = tc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if rest, _ := io.ReadAll(tc); string(rest) != "BANNER\ngot client\n" {
		t.Fatalf("through DialPort: %q", rest)
	}
}

// TestServerCloseEndsTunnels: an open tunnel ends when the agent closes, and leaves no
// goroutine behind.
func TestServerCloseEndsTunnels(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		srv, err := New(Config{Workspace: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		sock := filepath.Join(t.TempDir(), "envd.sock")
		ul, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- srv.Serve(ctx, ul) }()
		c, _ := client.New(client.Config{SocketPath: sock})
		defer c.Close()

		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		held := make(chan net.Conn, 1)
		go func() {
			cn, err := l.Accept()
			if err == nil {
				held <- cn
			}
			close(held)
		}()
		conn, err := c.DialPort(context.Background(), l.Addr().(*net.TCPAddr).Port)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		upstream := <-held
		defer upstream.Close()

		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := conn.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Fatalf("tunnel after the agent closed: %v, want EOF", err)
		}
		_ = upstream.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := upstream.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Fatalf("upstream after the agent closed: %v, want EOF", err)
		}
	}()
	testenv.Eventually(func() bool { return runtime.NumGoroutine() <= before })
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines before, %d after:\n%s", before, n, buf[:runtime.Stack(buf, true)])
	}
}
