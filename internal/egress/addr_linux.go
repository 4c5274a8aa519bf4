package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// netlinkSource is a network namespace's addresses through two NETLINK_ROUTE sockets made
// in it: one subscribed to the changes of IPv4 and IPv6 addresses (non-blocking, drained by
// changed), one to ask for the list. A socket stays in the namespace it was made in, so
// both work from any thread after.
type netlinkSource struct {
	events, dump int
	seq          uint32
	buf          []byte
}

// dumpTimeout bounds one reading of the list (the kernel answers at once).
const dumpTimeout = 5

func openAddrSource() (addrSource, error) {
	events, err := netlinkSocket(unix.SOCK_NONBLOCK, unix.RTMGRP_IPV4_IFADDR|unix.RTMGRP_IPV6_IFADDR)
	if err != nil {
		return nil, err
	}
	dump, err := netlinkSocket(0, 0)
	if err != nil {
		unix.Close(events)
		return nil, err
	}
	tv := unix.Timeval{Sec: dumpTimeout}
	if err := unix.SetsockoptTimeval(dump, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(events)
		unix.Close(dump)
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	return &netlinkSource{events: events, dump: dump, buf: make([]byte, 64<<10)}, nil
}

func netlinkSocket(flags int, groups uint32) (int, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|flags, unix.NETLINK_ROUTE)
	if err != nil {
		return -1, fmt.Errorf("netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: groups}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind a netlink socket: %w", err)
	}
	return fd, nil
}

// changed drains the notifications: any of them (or the kernel's word that some were
// dropped, ENOBUFS, or a socket that fails) means the list must be read again.
func (s *netlinkSource) changed() bool {
	changed := false
	for {
		n, err := unix.Read(s.events, s.buf) // non-blocking: SOCK_NONBLOCK
		switch {
		case errors.Is(err, unix.EAGAIN):
			return changed
		case errors.Is(err, unix.EINTR):
		case err != nil:
			// ENOBUFS: notifications were dropped. Anything else: nothing more is
			// known, so every check reads the list.
			if !errors.Is(err, unix.ENOBUFS) {
				return true
			}
			changed = true
		case n > 0:
			changed = true
		}
	}
}

// list asks the kernel for every address of the namespace (RTM_GETADDR, both families),
// again when a change interrupted the answer.
func (s *netlinkSource) list() ([]netip.Addr, error) {
	for range 3 {
		as, interrupted, err := s.dumpOnce()
		if err != nil || !interrupted {
			return as, err
		}
	}
	return nil, errors.New("the addresses kept changing while they were read")
}

func (s *netlinkSource) dumpOnce() (_ []netip.Addr, interrupted bool, _ error) {
	s.seq++
	req := make([]byte, unix.NLMSG_HDRLEN+unix.SizeofIfAddrmsg)
	binary.NativeEndian.PutUint32(req[0:4], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:6], unix.RTM_GETADDR)
	binary.NativeEndian.PutUint16(req[6:8], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	binary.NativeEndian.PutUint32(req[8:12], s.seq)
	req[unix.NLMSG_HDRLEN] = unix.AF_UNSPEC // ifa_family: both
	if err := unix.Sendto(s.dump, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, false, fmt.Errorf("ask the kernel for the addresses: %w", err)
	}
	var out []netip.Addr
	for {
		n, from, err := unix.Recvfrom(s.dump, s.buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, false, fmt.Errorf("read the kernel's addresses: %w", err)
		}
		if nl, ok := from.(*unix.SockaddrNetlink); !ok || nl.Pid != 0 {
			continue // not the kernel's
		}
		msgs, err := syscall.ParseNetlinkMessage(s.buf[:n])
		if err != nil {
			return nil, false, fmt.Errorf("read the kernel's addresses: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Seq != s.seq {
				continue // the rest of an earlier answer
			}
			if m.Header.Flags&unix.NLM_F_DUMP_INTR != 0 {
				interrupted = true
			}
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return out, interrupted, nil
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if errno := -int32(binary.NativeEndian.Uint32(m.Data[:4])); errno != 0 {
						return nil, false, fmt.Errorf("the kernel's addresses: %w", syscall.Errno(errno))
					}
				}
				return nil, false, errors.New("the kernel's addresses: an error without a number")
			case unix.RTM_NEWADDR:
				if a, ok := ifaAddr(&m); ok {
					out = append(out, a)
				}
			}
		}
	}
}

// ifaAddr is the local address of an RTM_NEWADDR message: IFA_LOCAL where there is one (on
// a point-to-point link IFA_ADDRESS is the peer's), else IFA_ADDRESS, as net.InterfaceAddrs
// reads it.
func ifaAddr(m *syscall.NetlinkMessage) (netip.Addr, bool) {
	if len(m.Data) < unix.SizeofIfAddrmsg {
		return netip.Addr{}, false
	}
	attrs, err := syscall.ParseNetlinkRouteAttr(m)
	if err != nil {
		return netip.Addr{}, false
	}
	var local, addr []byte
	for _, a := range attrs {
		switch a.Attr.Type {
		case unix.IFA_LOCAL:
			local = a.Value
		case unix.IFA_ADDRESS:
			addr = a.Value
		}
	}
	if local == nil {
		local = addr
	}
	ip, ok := netip.AddrFromSlice(local)
	return ip.Unmap(), ok
}

func (s *netlinkSource) close() error {
	return errors.Join(unix.Close(s.events), unix.Close(s.dump))
}
