package egress

import (
	"errors"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// splice moves src to dst with splice(2) until src ends (nil) or either fails; handled is
// false, with nothing moved, when a side has no descriptor. down says the bytes go to the
// sandbox (for the counts).
func (m *meter) splice(dst, src net.Conn, down bool) (handled bool, err error) {
	sc, ok1 := src.(syscall.Conn)
	dc, ok2 := dst.(syscall.Conn)
	if !ok1 || !ok2 {
		return false, nil
	}
	sraw, err1 := sc.SyscallConn()
	draw, err2 := dc.SyscallConn()
	if err1 != nil || err2 != nil {
		return false, nil
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return false, nil
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	_, _ = unix.FcntlInt(uintptr(p[1]), unix.F_SETPIPE_SZ, spliceMax)
	const flags = unix.SPLICE_F_MOVE | unix.SPLICE_F_NONBLOCK
	for {
		if m.cut.Load() {
			return true, errBudget
		}
		room := m.reserve(spliceMax)
		if room == 0 {
			return true, errBudget
		}
		var n int
		var serr error
		rerr := sraw.Read(func(fd uintptr) bool {
			var k int64
			k, serr = unix.Splice(int(fd), nil, p[1], nil, room, flags)
			n = int(k)
			if errors.Is(serr, unix.EINTR) {
				serr = nil
				return false // try again (after waiting for readability)
			}
			return !errors.Is(serr, unix.EAGAIN) // the pipe is empty: EAGAIN is "no data yet"
		})
		m.refund(room - max(n, 0))
		switch {
		case rerr != nil:
			return true, rerr
		case serr != nil:
			return true, serr
		case n <= 0:
			return true, nil // end of stream
		}
		m.touch()
		for n > 0 {
			var w int
			werr := draw.Write(func(fd uintptr) bool {
				var k int64
				k, serr = unix.Splice(p[0], nil, int(fd), nil, n, flags)
				w = int(k)
				if errors.Is(serr, unix.EINTR) {
					serr = nil
					return false
				}
				return !errors.Is(serr, unix.EAGAIN) // the socket's buffer is full: wait
			})
			if w > 0 {
				n -= w
				m.touch()
				if down {
					m.down.Add(int64(w))
				} else {
					m.up.Add(int64(w))
				}
			}
			switch {
			case werr != nil:
				return true, werr
			case serr != nil:
				return true, serr
			}
		}
	}
}
