package envd

// headTail keeps the first and the last bytes of a stream within a fixed budget and counts
// what it drops from the middle, so a flood of output costs a bounded amount of memory.
// The head gets limit/2 bytes, the tail the rest.
type HeadTail struct {
	headMax int
	head    []byte
	ring    []byte // tail ring, allocated lazily once the head is full
	w       int    // next write position in ring
	full    bool   // ring has wrapped at least once
	total   int64  // bytes written
}

func NewHeadTail(limit int) *HeadTail {
	if limit < 2 {
		limit = 2
	}
	return &HeadTail{headMax: limit / 2, ring: make([]byte, 0, limit-limit/2)}
}

// Write stores p and returns the part of p that went into the head (callers that forward
// output as it arrives send exactly that part; the tail is sent at the end).
func (h *HeadTail) Write(p []byte) (toHead []byte) {
	h.total += int64(len(p))
	if n := h.headMax - len(h.head); n > 0 {
		if n > len(p) {
			n = len(p)
		}
		toHead = p[:n]
		h.head = append(h.head, toHead...)
		p = p[n:]
	}
	if len(p) == 0 {
		return toHead
	}
	size := cap(h.ring)
	if len(p) >= size { // only the last size bytes can survive
		h.ring = append(h.ring[:0], p[len(p)-size:]...)
		h.w, h.full = 0, true
		return toHead
	}
	if !h.full { // still filling
		room := size - len(h.ring)
		if len(p) <= room {
			h.ring = append(h.ring, p...)
			h.w = len(h.ring) % size
			h.full = len(h.ring) == size
			return toHead
		}
		h.ring = append(h.ring, p[:room]...)
		p = p[room:]
		h.w, h.full = 0, true
	}
	n := copy(h.ring[h.w:], p)
	if n < len(p) {
		copy(h.ring, p[n:])
	}
	h.w = (h.w + len(p)) % size
	return toHead
}

// Tail returns the kept tail in order.
func (h *HeadTail) Tail() []byte {
	if !h.full {
		return append([]byte(nil), h.ring...)
	}
	out := make([]byte, 0, len(h.ring))
	out = append(out, h.ring[h.w:]...)
	return append(out, h.ring[:h.w]...)
}

// Head returns the kept head.
func (h *HeadTail) Head() []byte { return h.head }

// Dropped counts the bytes lost between head and tail.
func (h *HeadTail) Dropped() int64 {
	return h.total - int64(len(h.head)) - int64(len(h.ring))
}
