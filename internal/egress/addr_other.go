//go:build !linux

package egress

import "time"

// openAddrSource: without netlink, the interfaces' addresses read again at most every
// second.
func openAddrSource() (addrSource, error) {
	return &pollSource{read: interfaceAddrs, every: time.Second}, nil
}
