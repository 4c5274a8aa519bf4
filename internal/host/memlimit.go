package host

import (
	"context"

	"github.com/tetratelabs/wazero/experimental"
)

// A plugin's own memory limit. wazero caps linear memory per runtime, so the runtime is
// given the largest limit of any plugin (runtimeMemoryMiB), and a plugin whose own limit is
// lower gets its instances' memory from an allocator that refuses to grow past it: the
// guest's memory.grow fails, as it would at the runtime's cap, and the call fails.

// memoryLimitMiB is the plugin's memory limit per instance.
func (p *plugin) memoryLimitMiB() int { return p.h.specMemoryMiB(p.spec) }

// specMemoryMiB is the memory limit per instance of the plugin of spec.
func (h *Host) specMemoryMiB(spec PluginSpec) int {
	if spec.MemoryLimitMiB > 0 {
		return spec.MemoryLimitMiB
	}
	return h.cfg.MemoryLimitMiB
}

// memoryContext is ctx carrying the allocator that holds an instance of p to its memory
// limit, when that is below the runtime's.
func (p *plugin) memoryContext(ctx context.Context) context.Context {
	limit := p.memoryLimitMiB()
	if limit >= p.h.runtimeMiB {
		return ctx
	}
	return experimental.WithMemoryAllocator(ctx, cappedAllocator(uint64(limit)<<20))
}

// runtimeMemoryMiB is the largest memory limit of the host and its plugins, within the
// 4 GiB of a wasm32 memory (a spec asking more is refused when the plugins load).
func runtimeMemoryMiB(cfg Config) int {
	n := cfg.MemoryLimitMiB
	for _, s := range cfg.Plugins {
		n = max(n, s.MemoryLimitMiB)
	}
	return min(n, 4096)
}

// cappedAllocator makes linear memories that never grow past its size in bytes.
type cappedAllocator uint64

func (a cappedAllocator) Allocate(_, maxBytes uint64) experimental.LinearMemory {
	return &cappedMemory{limit: min(uint64(a), maxBytes)}
}

// cappedMemory is a linear memory backed by a slice that grows like append's, never past
// limit. It never shrinks, so the bytes between its length and its capacity are still the
// zeros make gave them.
type cappedMemory struct {
	buf   []byte
	limit uint64
}

func (m *cappedMemory) Reallocate(size uint64) []byte {
	if size > m.limit {
		return nil
	}
	if size <= uint64(cap(m.buf)) {
		m.buf = m.buf[:size]
		return m.buf
	}
	grown := min(max(size, uint64(cap(m.buf))*5/4), m.limit)
	b := make([]byte, size, grown)
	copy(b, m.buf)
	m.buf = b
	return b
}

func (m *cappedMemory) Free() { m.buf = nil }
