// Command extism is the duel's plugin for Extism: the same three functions as the toolhost
// guest, in standard Go (GOOS=wasip1, -buildmode=c-shared), written directly against the
// kernel imports Extism documents (namespace extism:host/env), because Extism's Go guest
// kit is not served by the module proxy here. The loops that move bytes between the
// guest's memory and the kernel's are the ones that kit uses: eight bytes per host call,
// then single bytes. Extism's convention is bytes in, bytes out, so the inputs are raw (the
// path, the text) where toolhost's are JSON objects checked against a schema: the Extism
// guest parses nothing, which is the cheaper work.
package main

import "encoding/binary"

//go:wasmimport extism:host/env input_length
func inputLength() uint64

//go:wasmimport extism:host/env input_load_u8
func inputLoadU8(offset uint64) uint32

//go:wasmimport extism:host/env input_load_u64
func inputLoadU64(offset uint64) uint64

//go:wasmimport extism:host/env length
func length(offset uint64) uint64

//go:wasmimport extism:host/env alloc
func alloc(n uint64) uint64

//go:wasmimport extism:host/env free
func free(offset uint64)

//go:wasmimport extism:host/env output_set
func outputSet(offset, n uint64)

//go:wasmimport extism:host/env load_u8
func loadU8(offset uint64) uint32

//go:wasmimport extism:host/env load_u64
func loadU64(offset uint64) uint64

//go:wasmimport extism:host/env store_u8
func storeU8(offset uint64, v uint32)

//go:wasmimport extism:host/env store_u64
func storeU64(offset uint64, v uint64)

// readFile is the host function of the read case (namespace extism:host/user): the offset
// of a path in kernel memory in, the offset of the file's bytes out.
//
//go:wasmimport extism:host/user read_file
func readFile(path uint64) uint64

func main() {}

func input() []byte {
	n := inputLength()
	buf := make([]byte, n)
	i := uint64(0)
	for ; n-i >= 8; i += 8 {
		binary.LittleEndian.PutUint64(buf[i:], inputLoadU64(i))
	}
	for ; i < n; i++ {
		buf[i] = byte(inputLoadU8(i))
	}
	return buf
}

func load(offset uint64) []byte {
	n := length(offset)
	buf := make([]byte, n)
	i := uint64(0)
	for ; n-i >= 8; i += 8 {
		binary.LittleEndian.PutUint64(buf[i:], loadU64(offset+i))
	}
	for ; i < n; i++ {
		buf[i] = byte(loadU8(offset + i))
	}
	return buf
}

func store(data []byte) uint64 {
	n := uint64(len(data))
	offset := alloc(n)
	i := uint64(0)
	for ; n-i >= 8; i += 8 {
		storeU64(offset+i, binary.LittleEndian.Uint64(data[i:]))
	}
	for ; i < n; i++ {
		storeU8(offset+i, uint32(data[i]))
	}
	return offset
}

func output(data []byte) {
	outputSet(store(data), uint64(len(data)))
}

//go:wasmexport noop
func noop() int32 {
	output(nil)
	return 0
}

//go:wasmexport read
func read() int32 {
	p := store(input())
	data := readFile(p)
	out := load(data)
	free(data)
	output(out)
	return 0
}

//go:wasmexport echo
func echo() int32 {
	output(input())
	return 0
}
