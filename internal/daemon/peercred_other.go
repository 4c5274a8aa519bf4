//go:build unix && !linux && !darwin

package daemon

import "net"

// peerUID: this system's peer credentials are not read; every connection is refused.
func peerUID(net.Conn) (int, error) { return -1, ErrUnsupported }
