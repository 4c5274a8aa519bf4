package splice

import (
	"io"
	"net"
	"sync"
)

// closeWriter is a connection that can end its write half (TCP, unix sockets).
type CloseWriter interface{ CloseWrite() error }

// Splice copies between a and b in both directions until both have ended, then closes
// both. When one side ends its stream, the end is passed on to the other with CloseWrite
// (a half-close), so request-then-response protocols finish; a failure on either side, or
// a side that cannot half-close, ends both directions. Closing a or b from elsewhere stops
// it. It returns the bytes copied each way.
func Splice(a, b net.Conn) (aToB, bToA int64) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // owned by Splice, which waits for it
		defer wg.Done()
		bToA = pipe(a, b)
	}()
	aToB = pipe(b, a)
	wg.Wait()
	a.Close()
	b.Close()
	return aToB, bToA
}

func pipe(dst, src net.Conn) int64 {
	n, err := io.Copy(dst, src)
	if err == nil {
		if cw, ok := dst.(CloseWriter); ok && cw.CloseWrite() == nil {
			return n
		}
	}
	dst.Close()
	src.Close()
	return n
}
