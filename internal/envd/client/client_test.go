package client

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/splice"
)

// TestDialKeepsBufferedBytes: bytes that came with the 101 in one read are not lost, and
// an agent without the extension (a real envd) gives an error.
func TestDialKeepsBufferedBytes(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "fake.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	answers := []string{
		"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: toolhost-tcp\r\n\r\nPAYLOAD",
		"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 19\r\n\r\n404 page not found\n",
	}
	go func() {
		for _, a := range answers {
			cn, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = http.ReadRequest(bufio.NewReader(cn))
			_, _ = io.WriteString(cn, a)
			_ = cn.(*net.UnixConn).CloseWrite()
			_, _ = io.Copy(io.Discard, cn)
			cn.Close()
		}
	}()
	c, err := New(Config{SocketPath: sock})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tc, err := c.DialPort(ctx, 80)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := tc.(*bufferedConn); !ok {
		t.Errorf("connection is a %T, want the buffered one", tc)
	}
	if err := tc.(splice.CloseWriter).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(tc)
	tc.Close()
	if err != nil || string(b) != "PAYLOAD" {
		t.Fatalf("after the 101: %q %v", b, err)
	}
	if _, err := c.DialPort(ctx, 80); err == nil || errors.Is(err, sandbox.ErrPortClosed) {
		t.Fatalf("agent without the extension: %v", err)
	} else {
		t.Logf("agent without the extension: %v", err)
	}
}
