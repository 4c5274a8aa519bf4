// Package abi is the contract between the toolhost and its plugins: the ABI version, the
// names of the exports a plugin provides and of the host functions it may import, the status
// codes host functions return, and the JSON wire types that cross the boundary.
//
// It has no dependency on wazero or on any build tag, so the host, the Go plugin kit and
// tests import it alike. ABI.md in this directory is the language-neutral specification.
package abi

// Version is the ABI version this package describes. A plugin reports the version it was
// built against from its Version export and in its manifest; the host refuses any other.
const Version = 1

// Exports every plugin provides (besides "memory").
const (
	ExportInitialize = "_initialize"           // WASI reactor initialisation, run once by the host
	ExportVersion    = "toolhost_abi_version"  // () -> i32: the ABI version
	ExportDescribe   = "toolhost_describe"     // () -> i64: packed ptr/len of the manifest JSON
	ExportInput      = "toolhost_input_buffer" // (size i32) -> i32: ptr of a guest buffer >= size
	ExportCall       = "toolhost_call"         // (len i32) -> i64: packed ptr/len of the Result JSON
	ExportMemory     = "memory"
)

// Capability names a group of host functions. A plugin is granted capabilities; each one
// is imported from its own module, named ModulePrefix + capability, so the host can check
// a plugin's import list against its grants before running any of its code.
type Capability string

const (
	CapLog          Capability = "log"
	CapSandboxExec  Capability = "sandbox_exec"
	CapSandboxFiles Capability = "sandbox_files"
	CapStore        Capability = "store"
	CapCapture      Capability = "capture"
	// CapWeb fetches pages from the web through the host's egress gateway, within the
	// plugin's own egress scope.
	CapWeb Capability = "web"
)

// ModulePrefix prefixes every capability's import module name.
const ModulePrefix = "toolhost_"

// ModuleCore holds the functions every plugin may import without a grant: fetching a
// parked reply and the message of the last failed host call.
const ModuleCore = "toolhost"

// ModuleSession holds the functions of a plugin's session state (get, set), which every
// plugin may import without a grant: they reach nothing but a few bytes the host keeps for
// that plugin in that session (ABI.md section 3.4).
const ModuleSession = "toolhost_session"

// CapSession names the session-state functions for the policy and the audit. It is not a
// grant: every plugin has it, and Capabilities does not list it.
const CapSession Capability = "session"

// ModuleWASI is WASI preview1. Every plugin may import it; the host gives it no
// preopened directories, so it reaches nothing but clocks, randomness and stderr.
const ModuleWASI = "wasi_snapshot_preview1"

// Module returns the import module name of a capability.
func (c Capability) Module() string { return ModulePrefix + string(c) }

// Capabilities lists every capability the host knows, in a stable order.
func Capabilities() []Capability {
	return []Capability{CapLog, CapSandboxExec, CapSandboxFiles, CapStore, CapCapture, CapWeb}
}

// CapabilityOfModule returns the capability whose module name is module.
func CapabilityOfModule(module string) (Capability, bool) {
	for _, c := range Capabilities() {
		if c.Module() == module {
			return c, true
		}
	}
	return "", false
}

// Host function names, by module. Signatures are in ABI.md; i32 pointers and lengths,
// i64 results that are a length (>= 0) or a negative Status.
const (
	FnTake      = "take"       // toolhost.take(out_ptr, out_cap) -> i64
	FnLastError = "last_error" // toolhost.last_error(out_ptr, out_cap) -> i64

	FnLog = "write" // toolhost_log.write(level i32, msg_ptr, msg_len)

	FnExec = "run" // toolhost_sandbox_exec.run(req_ptr, req_len, out_ptr, out_cap) -> i64
	// toolhost_sandbox_exec.process(req_ptr, req_len, out_ptr, out_cap) -> i64
	FnProcess = "process"
	// toolhost_sandbox_exec.terminal_start(req_ptr, req_len, out_ptr, out_cap) -> i64
	FnTerminalStart = "terminal_start"
	// toolhost_sandbox_exec.terminal_io(req_ptr, req_len, out_ptr, out_cap) -> i64
	FnTerminalIO = "terminal_io"

	FnRead     = "read"      // toolhost_sandbox_files.read(path_ptr, path_len, out_ptr, out_cap) -> i64
	FnReadText = "read_text" // toolhost_sandbox_files.read_text(req_ptr, req_len, out_ptr, out_cap) -> i64
	FnWrite    = "write"     // toolhost_sandbox_files.write(path_ptr, path_len, data_ptr, data_len) -> i64
	// toolhost_sandbox_files.read_versioned(path_ptr, path_len, out_ptr, out_cap) -> i64
	FnReadVersioned = "read_versioned"
	// toolhost_sandbox_files.write_versioned(path_ptr, path_len, data_ptr, data_len, version_ptr, version_len) -> i64
	FnWriteVersioned = "write_versioned"
	FnStat           = "stat"   // toolhost_sandbox_files.stat(path_ptr, path_len, out_ptr, out_cap) -> i64
	FnList           = "list"   // toolhost_sandbox_files.list(req_ptr, req_len, out_ptr, out_cap) -> i64
	FnRemove         = "remove" // toolhost_sandbox_files.remove(path_ptr, path_len) -> i64

	FnCapture = "capture" // toolhost_capture.capture(req_ptr, req_len, out_ptr, out_cap) -> i64

	FnStorePut    = "put"    // toolhost_store.put(key_ptr, key_len, data_ptr, data_len) -> i64
	FnStoreGet    = "get"    // toolhost_store.get(key_ptr, key_len, out_ptr, out_cap) -> i64
	FnStoreList   = "list"   // toolhost_store.list(prefix_ptr, prefix_len, out_ptr, out_cap) -> i64
	FnStoreDelete = "delete" // toolhost_store.delete(key_ptr, key_len) -> i64

	FnFetch = "fetch" // toolhost_web.fetch(req_ptr, req_len, out_ptr, out_cap) -> i64

	FnSessionGet = "get" // toolhost_session.get(key_ptr, key_len, out_ptr, out_cap) -> i64
	FnSessionSet = "set" // toolhost_session.set(key_ptr, key_len, data_ptr, data_len) -> i64
)

// Status is a negative i64 a host function returns instead of a length. The values are
// the negated Linux errno numbers, so every language already has names for them.
type Status int64

const (
	StatusPermission Status = -1  // EPERM: the operation is not allowed by policy
	StatusNotFound   Status = -2  // ENOENT: no such file, or no parked reply to take
	StatusIO         Status = -5  // EIO: the host failed to do the operation
	StatusBadPointer Status = -14 // EFAULT: a pointer or length lies outside guest memory
	StatusExists     Status = -17 // EEXIST
	StatusNotDir     Status = -20 // ENOTDIR
	StatusIsDir      Status = -21 // EISDIR
	StatusInvalid    Status = -22 // EINVAL: the request could not be decoded or is invalid
	StatusTooLarge   Status = -27 // EFBIG: the file or request exceeds a host limit
	StatusTimeout    Status = -62 // ETIME: the operation ran out of time
	StatusOutside    Status = -18 // EXDEV: the path leaves the workspace
	// StatusChanged (ESTALE): write_versioned found the file changed since the version
	// the plugin read; read it again and redo the change.
	StatusChanged Status = -116
)

// String names the status for error messages.
func (s Status) String() string {
	switch s {
	case StatusPermission:
		return "not permitted"
	case StatusNotFound:
		return "no such file or directory"
	case StatusIO:
		return "i/o error"
	case StatusBadPointer:
		return "bad pointer"
	case StatusExists:
		return "file exists"
	case StatusNotDir:
		return "not a directory"
	case StatusIsDir:
		return "is a directory"
	case StatusInvalid:
		return "invalid request"
	case StatusTooLarge:
		return "too large"
	case StatusTimeout:
		return "timed out"
	case StatusOutside:
		return "path is outside the workspace"
	case StatusChanged:
		return "changed since it was read"
	}
	return "unknown status"
}

// Pack and Unpack convert between a (ptr, len) pair and the single i64 the exports return.
func Pack(ptr, length uint32) uint64 { return uint64(ptr)<<32 | uint64(length) }

// Unpack splits a packed i64 into its pointer and length.
func Unpack(v uint64) (ptr, length uint32) { return uint32(v >> 32), uint32(v) }

// Log levels for toolhost_log.write, matching log/slog's numeric levels.
const (
	LevelDebug int32 = -4
	LevelInfo  int32 = 0
	LevelWarn  int32 = 4
	LevelError int32 = 8
)

// VersionLen is the length of a file version: the lowercase hex SHA-256 of its contents.
const VersionLen = 64
