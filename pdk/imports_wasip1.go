//go:build wasip1

package pdk

import "unsafe"

// Host functions, ABI.md section 3. Each capability is its own import module, and Go's
// linker drops an import nothing calls, so a plugin imports only what it uses.

//go:wasmimport toolhost take
func hostTake(out unsafe.Pointer, outCap uint32) int64

//go:wasmimport toolhost last_error
func hostLastError(out unsafe.Pointer, outCap uint32) int64

//go:wasmimport toolhost_log write
func hostLog(level int32, msg string)

//go:wasmimport toolhost_sandbox_exec run
func hostExec(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outCap uint32) int64

//go:wasmimport toolhost_sandbox_files read
func hostRead(path string, out unsafe.Pointer, outCap uint32) int64

//go:wasmimport toolhost_sandbox_files read_text
func hostReadText(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outCap uint32) int64

//go:wasmimport toolhost_sandbox_files write
func hostWrite(path string, data unsafe.Pointer, dataLen uint32) int64

//go:wasmimport toolhost_sandbox_files read_versioned
func hostReadVersioned(path string, out unsafe.Pointer, outCap uint32) int64

//go:wasmimport toolhost_sandbox_files write_versioned
func hostWriteVersioned(path string, data unsafe.Pointer, dataLen uint32, version string) int64

//go:wasmimport toolhost_sandbox_files stat
func hostStat(path string, out unsafe.Pointer, outCap uint32) int64

//go:wasmimport toolhost_sandbox_files list
func hostList(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outCap uint32) int64

//go:wasmimport toolhost_sandbox_files remove
func hostRemove(path string) int64

//go:wasmimport toolhost_sandbox_exec process
func hostProcess(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outCap uint32) int64

//go:wasmimport toolhost_sandbox_exec terminal_start
func hostTerminalStart(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outCap uint32) int64

//go:wasmimport toolhost_sandbox_exec terminal_io
func hostTerminalIO(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outCap uint32) int64

//go:wasmimport toolhost_session get
func hostSessionGet(key string, out unsafe.Pointer, outCap uint32) int64

//go:wasmimport toolhost_session set
func hostSessionSet(key string, data unsafe.Pointer, dataLen uint32) int64

//go:wasmimport toolhost_capture capture
func hostCapture(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outCap uint32) int64

//go:wasmimport toolhost_store put
func hostStorePut(key string, data unsafe.Pointer, dataLen uint32) int64

//go:wasmimport toolhost_store get
func hostStoreGet(key string, out unsafe.Pointer, outCap uint32) int64

//go:wasmimport toolhost_store list
func hostStoreList(prefix string, out unsafe.Pointer, outCap uint32) int64

//go:wasmimport toolhost_store delete
func hostStoreDelete(key string) int64

func ptr(b []byte) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(b)) }

func rawTake(out []byte) int64       { return hostTake(ptr(out), uint32(len(out))) }
func rawLastError(out []byte) int64  { return hostLastError(ptr(out), uint32(len(out))) }
func rawLog(level int32, msg string) { hostLog(level, msg) }
func rawExec(req, out []byte) int64 {
	return hostExec(ptr(req), uint32(len(req)), ptr(out), uint32(len(out)))
}
func rawRead(path string, out []byte) int64 { return hostRead(path, ptr(out), uint32(len(out))) }
func rawReadText(req, out []byte) int64 {
	return hostReadText(ptr(req), uint32(len(req)), ptr(out), uint32(len(out)))
}
func rawWrite(path string, data []byte) int64 {
	return hostWrite(path, ptr(data), uint32(len(data)))
}
func rawReadVersioned(path string, out []byte) int64 {
	return hostReadVersioned(path, ptr(out), uint32(len(out)))
}
func rawWriteVersioned(path string, data []byte, version string) int64 {
	return hostWriteVersioned(path, ptr(data), uint32(len(data)), version)
}
func rawStat(path string, out []byte) int64 { return hostStat(path, ptr(out), uint32(len(out))) }
func rawList(req, out []byte) int64 {
	return hostList(ptr(req), uint32(len(req)), ptr(out), uint32(len(out)))
}
func rawCapture(req, out []byte) int64 {
	return hostCapture(ptr(req), uint32(len(req)), ptr(out), uint32(len(out)))
}
func rawStorePut(key string, data []byte) int64 {
	return hostStorePut(key, ptr(data), uint32(len(data)))
}
func rawStoreGet(key string, out []byte) int64 {
	return hostStoreGet(key, ptr(out), uint32(len(out)))
}
func rawStoreList(prefix string, out []byte) int64 {
	return hostStoreList(prefix, ptr(out), uint32(len(out)))
}
func rawStoreDelete(key string) int64 { return hostStoreDelete(key) }
func rawRemove(path string) int64     { return hostRemove(path) }
func rawProcess(req, out []byte) int64 {
	return hostProcess(ptr(req), uint32(len(req)), ptr(out), uint32(len(out)))
}
func rawTerminalStart(req, out []byte) int64 {
	return hostTerminalStart(ptr(req), uint32(len(req)), ptr(out), uint32(len(out)))
}
func rawTerminalIO(req, out []byte) int64 {
	return hostTerminalIO(ptr(req), uint32(len(req)), ptr(out), uint32(len(out)))
}
func rawSessionGet(key string, out []byte) int64 {
	return hostSessionGet(key, ptr(out), uint32(len(out)))
}
func rawSessionSet(key string, data []byte) int64 {
	return hostSessionSet(key, ptr(data), uint32(len(data)))
}

//go:wasmimport toolhost_web fetch
func hostFetch(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outCap uint32) int64

func rawFetch(req, out []byte) int64 {
	return hostFetch(ptr(req), uint32(len(req)), ptr(out), uint32(len(out)))
}
