package egress

import (
	"bufio"
	"errors"
	"io"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// A tunnel's bytes move with splice(2) through a pipe where both ends are sockets: the
// kernel hands pages from one socket to the other and the gateway never copies them,
// which is most of what makes a tunnel cost little more than a direct connection. Every
// splice is counted as it happens, so the budget and the idle timeout see a slow stream
// move, not only the end of a big chunk. Where a side has no descriptor (a TLS
// connection, an upgraded response body), the bytes are copied through the meter.

// spliceMax is the most one splice moves: the pipe's size.
const spliceMax = 1 << 20

// pipeDown copies the upstream connection to the sandbox until it ends, then half-closes
// the sandbox's side (or closes both on a failure).
func (m *meter) pipeDown(up net.Conn) {
	handled, err := m.splice(m.Conn, up, true)
	if !handled {
		bp := copyBufs.Get().(*[]byte)
		_, err = io.CopyBuffer(onlyWriter{m}, onlyReader{up}, *bp)
		copyBufs.Put(bp)
	}
	endPipe(err, up, m.Conn)
}

// pipeUp copies the sandbox to the upstream connection: first what br holds already,
// then the rest.
func (m *meter) pipeUp(br *bufio.Reader, up net.Conn) {
	var err error
	if n := br.Buffered(); n > 0 {
		b, _ := br.Peek(n)
		_, err = up.Write(b)
		_, _ = br.Discard(n)
	}
	if err == nil {
		var handled bool
		handled, err = m.splice(up, m.Conn, false)
		if !handled {
			bp := copyBufs.Get().(*[]byte)
			_, err = io.CopyBuffer(onlyWriter{up}, onlyReader{br}, *bp)
			copyBufs.Put(bp)
		}
	}
	endPipe(err, m.Conn, up)
}

// endPipe passes an end of stream on as a half-close; a failure ends both sides.
func endPipe(err error, src, dst net.Conn) {
	if err == nil {
		if cw, ok := dst.(closeWriter); ok && cw.CloseWrite() == nil {
			return
		}
	}
	dst.Close()
	src.Close()
}

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

// reserve takes up to want bytes of budget for a splice (all of it outside a data
// phase); 0 when the budget is spent, which reports the cut.
func (m *meter) reserve(want int) int {
	f := m.onCut.Load()
	if f == nil {
		return want
	}
	// Near the end of the budget, smaller bites, so that one connection's reservation
	// does not look like the end to another.
	if left := m.budget.left(); left >= 0 {
		want = int(min(int64(want), max(left/8, 16<<10)))
	}
	got := m.budget.take(want)
	if got == 0 && !m.cut.Swap(true) {
		(*f)()
	}
	return got
}

// refund gives back what a splice reserved and did not move.
func (m *meter) refund(n int) {
	if n > 0 && m.onCut.Load() != nil {
		m.budget.give(n)
	}
}
