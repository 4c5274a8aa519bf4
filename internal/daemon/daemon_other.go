//go:build !unix

package daemon

import (
	"context"
	"log/slog"
	"net"
	"os/exec"
	"time"
)

func checkPrivate(string) error { return ErrUnsupported }

// Listener is not available on this platform.
type Listener struct{ net.Listener }

// Listen is not available on this platform: ErrUnsupported.
func Listen(string, time.Duration, *slog.Logger) (*Listener, error) { return nil, ErrUnsupported }

// Path is the socket's path.
func (l *Listener) Path() string { return "" }

// Start is not available on this platform: ErrUnsupported.
func Start(string, []string, []string, string, string) (*exec.Cmd, error) {
	return nil, ErrUnsupported
}

// LogTail is empty on this platform.
func LogTail(string, int) string { return "" }

// DialContext is not available on this platform: ErrUnsupported.
func DialContext(context.Context, string) (net.Conn, error) { return nil, ErrUnsupported }
