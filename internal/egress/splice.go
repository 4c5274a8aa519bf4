package egress

import (
	"bufio"
	"io"
	"net"
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
