//go:build !unix

package cli

import (
	"io"
	"os"
)

// protocolStdout is where the MCP messages go: the process's stdout. (On Unix systems
// descriptor 1 is also pointed at stderr, so nothing else can write into the stream.)
func (c *cli) protocolStdout() (io.WriteCloser, error) {
	if c.stdout != os.Stdout {
		return nopWriteCloser{c.stdout}, nil
	}
	return os.Stdout, nil
}
