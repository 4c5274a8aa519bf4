//go:build wasip1

package pdk

import (
	"runtime"
	"unsafe"

	"github.com/toolhost/toolhost/abi"
)

// The exports of ABI.md section 2. Every one ends with runtime.Gosched(): the Go runtime
// only runs its background (GC) goroutines while an export runs, and without a yield the
// heap grows across calls until the instance dies.

var inBuf []byte

//go:wasmexport toolhost_abi_version
func exportABIVersion() int32 {
	runtime.Gosched()
	return abi.Version
}

//go:wasmexport toolhost_describe
func exportDescribe() uint64 {
	m := Manifest()
	runtime.Gosched()
	return pack(m)
}

//go:wasmexport toolhost_input_buffer
func exportInputBuffer(size uint32) uint32 {
	if uint64(cap(inBuf)) < uint64(size) || inBuf == nil {
		inBuf = make([]byte, max(size, 4<<10))
	}
	inBuf = inBuf[:cap(inBuf)]
	p := uint32(uintptr(unsafe.Pointer(unsafe.SliceData(inBuf))))
	runtime.Gosched()
	return p
}

//go:wasmexport toolhost_call
func exportCall(n uint32) uint64 {
	var out []byte
	if uint64(n) > uint64(len(inBuf)) {
		outBuf = appendFramed(outBuf[:0], abi.ErrorText("Error: the request is longer than the input buffer"))
		out = outBuf
	} else {
		out = Handle(inBuf[:n])
	}
	runtime.Gosched()
	return pack(out)
}

func pack(b []byte) uint64 {
	return abi.Pack(uint32(uintptr(unsafe.Pointer(unsafe.SliceData(b)))), uint32(len(b)))
}
