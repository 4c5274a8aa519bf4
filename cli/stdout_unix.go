//go:build unix

package cli

import (
	"fmt"
	"io"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// protocolStdout is where the MCP messages go: the process's stdout, which from then on
// is only theirs. When c.stdout is the process's stdout, the stream moves to a duplicate
// of file descriptor 1 (owned by the transport, which closes it) and descriptor 1 is
// pointed at stderr until the process exits, so nothing else (a library, a child
// process) can write into the protocol stream.
func (c *cli) protocolStdout() (io.WriteCloser, error) {
	if c.stdout != os.Stdout {
		return nopWriteCloser{c.stdout}, nil
	}
	fd, err := syscall.Dup(1)
	if err != nil {
		return nil, fmt.Errorf("keeping stdout for the protocol: %w", err)
	}
	syscall.CloseOnExec(fd)
	if err := unix.Dup2(2, 1); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("pointing stdout at stderr: %w", err)
	}
	return os.NewFile(uintptr(fd), "mcp-stdout"), nil
}
