//go:build !wasip1

package pdk

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"sync"

	"github.com/toolhost/toolhost/abi"
)

// Host receives the host-function calls of a plugin built natively (not for wasip1), so
// plugin logic can be tested with go test. The calls cross the same byte-level two-call
// protocol and JSON wire format as in wasm. Return an *Error to choose the status and the
// message; any other error becomes abi.StatusIO. Package pdktest has a Host backed by a
// directory.
type Host interface {
	Exec(req abi.ExecRequest) (abi.ExecResult, error)
	ReadFile(path string) ([]byte, error)
	WriteFile(path string, data []byte) error
	Stat(path string) (abi.FileInfo, error)
	List(req abi.ListRequest) (abi.ListResult, error)
	Log(level int32, msg string)
}

var native struct {
	sync.Mutex
	host    Host
	parked  []byte
	lastErr string
}

// SetHost routes the host functions of a native build to h (nil: every call fails with
// abi.StatusIO) and returns the previous Host.
func SetHost(h Host) Host {
	native.Lock()
	defer native.Unlock()
	old := native.host
	native.host = h
	clear(nativeState)
	return old
}

// hostCall runs one host function the way the real host does: it drops any parked reply,
// turns an error into a status plus a last_error message, and parks a reply that does not
// fit in out.
func hostCall(out []byte, fn func(h Host) (any, error)) int64 {
	native.Lock()
	h := native.host
	native.parked = nil
	native.Unlock()
	var v any
	err := errors.New("pdk: no Host set (call pdk.SetHost)")
	if h != nil {
		v, err = fn(h)
	}
	native.Lock()
	defer native.Unlock()
	if err != nil {
		var e *Error
		if !errors.As(err, &e) {
			e = &Error{Status: abi.StatusIO, Msg: err.Error()}
		}
		native.lastErr = e.Error()
		return int64(e.Status)
	}
	var b []byte
	switch v := v.(type) {
	case []byte:
		b = v
	case int:
		return int64(v)
	case abi.ExecResult: // a JSON header line, then the raw streams
		v.StdoutLen, v.StderrLen = len(v.Stdout), len(v.Stderr)
		if b, err = json.Marshal(v); err != nil {
			native.lastErr = err.Error()
			return int64(abi.StatusIO)
		}
		b = append(append(append(b, '\n'), v.Stdout...), v.Stderr...)
	default:
		if b, err = json.Marshal(v); err != nil {
			native.lastErr = err.Error()
			return int64(abi.StatusIO)
		}
	}
	if len(b) <= len(out) {
		copy(out, b)
	} else {
		native.parked = b
	}
	return int64(len(b))
}

func rawTake(out []byte) int64 {
	native.Lock()
	defer native.Unlock()
	if native.parked == nil {
		native.lastErr = "take: no parked reply"
		return int64(abi.StatusNotFound)
	}
	if len(out) < len(native.parked) {
		native.lastErr = "take: buffer too small"
		return int64(abi.StatusTooLarge)
	}
	n := copy(out, native.parked)
	native.parked = nil
	return int64(n)
}

func rawLastError(out []byte) int64 {
	native.Lock()
	defer native.Unlock()
	copy(out, native.lastErr)
	return int64(len(native.lastErr))
}

func rawLog(level int32, msg string) {
	hostCall(nil, func(h Host) (any, error) { h.Log(level, msg); return 0, nil })
}

func invalid(op string, err error) error {
	return &Error{Op: op, Status: abi.StatusInvalid, Msg: op + ": " + err.Error()}
}

func rawExec(req, out []byte) int64 {
	return hostCall(out, func(h Host) (any, error) {
		var r abi.ExecRequest
		if err := json.Unmarshal(req, &r); err != nil {
			return nil, invalid("exec", err)
		}
		return h.Exec(r)
	})
}

func rawRead(path string, out []byte) int64 {
	return hostCall(out, func(h Host) (any, error) { return h.ReadFile(path) })
}

func rawReadText(req, out []byte) int64 {
	return hostCall(out, func(h Host) (any, error) {
		var r abi.ReadTextRequest
		if err := json.Unmarshal(req, &r); err != nil {
			return nil, invalid("read_text", err)
		}
		data, err := h.ReadFile(r.Path)
		if err != nil {
			return nil, err
		}
		header, text := abi.TextWindow(data, r)
		if r.Version {
			header.Version = version(data)
		}
		hb, err := json.Marshal(header)
		return append(append(hb, '\n'), text...), err
	})
}

func rawWrite(path string, data []byte) int64 {
	return hostCall(nil, func(h Host) (any, error) {
		return len(data), h.WriteFile(path, append([]byte(nil), data...))
	})
}

// The native versioned read and write work as the host's do, on the Host's ReadFile and
// WriteFile, with the check and the write under one lock.
var nativeEdits sync.Mutex

func rawReadVersioned(path string, out []byte) int64 {
	return hostCall(out, func(h Host) (any, error) {
		data, err := h.ReadFile(path)
		if err != nil {
			return nil, err
		}
		return append(append([]byte(version(data)), '\n'), data...), nil
	})
}

func rawWriteVersioned(path string, data []byte, want string) int64 {
	return hostCall(nil, func(h Host) (any, error) {
		nativeEdits.Lock()
		defer nativeEdits.Unlock()
		cur, err := h.ReadFile(path)
		switch {
		case errors.Is(err, fs.ErrNotExist) && want == "":
		case err != nil && !errors.Is(err, fs.ErrNotExist):
			return nil, err
		case err != nil || version(cur) != want:
			return nil, &Error{Op: "write", Status: abi.StatusChanged, Msg: "write " + path + ": the file changed since it was read; read it again"}
		}
		return len(data), h.WriteFile(path, append([]byte(nil), data...))
	})
}

func version(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

func rawStat(path string, out []byte) int64 {
	return hostCall(out, func(h Host) (any, error) { return h.Stat(path) })
}

func rawList(req, out []byte) int64 {
	return hostCall(out, func(h Host) (any, error) {
		var r abi.ListRequest
		if err := json.Unmarshal(req, &r); err != nil {
			return nil, invalid("list", err)
		}
		return h.List(r)
	})
}

// CaptureHost is a native Host that can also take screenshots (capability capture).
type CaptureHost interface {
	Capture(req abi.CaptureRequest) (reply abi.CaptureReply, desktop, mobile []byte, err error)
}

// StoreHost is a native Host with an object store (capability store).
type StoreHost interface {
	StorePut(key string, data []byte) error
	StoreGet(key string) ([]byte, error)
	StoreList(prefix string) ([]abi.StoreObject, error)
	StoreDelete(key string) error
}

var errNativeUnsupported = errors.New("pdk: the native Host does not provide this capability")

func rawCapture(req, out []byte) int64 {
	return hostCall(out, func(h Host) (any, error) {
		ch, ok := h.(CaptureHost)
		if !ok {
			return nil, errNativeUnsupported
		}
		var r abi.CaptureRequest
		if err := json.Unmarshal(req, &r); err != nil {
			return nil, invalid("capture", err)
		}
		reply, d, m, err := ch.Capture(r)
		if err != nil {
			return nil, err
		}
		reply.Desktop.Bytes, reply.Mobile.Bytes = len(d), len(m)
		hb, _ := json.Marshal(reply)
		return append(append(append(hb, '\n'), d...), m...), nil
	})
}

func storeHost(h Host) (StoreHost, error) {
	sh, ok := h.(StoreHost)
	if !ok {
		return nil, errNativeUnsupported
	}
	return sh, nil
}

func rawStorePut(key string, data []byte) int64 {
	return hostCall(nil, func(h Host) (any, error) {
		sh, err := storeHost(h)
		if err != nil {
			return nil, err
		}
		return len(data), sh.StorePut(key, data)
	})
}

func rawStoreGet(key string, out []byte) int64 {
	return hostCall(out, func(h Host) (any, error) {
		sh, err := storeHost(h)
		if err != nil {
			return nil, err
		}
		return sh.StoreGet(key)
	})
}

func rawStoreList(prefix string, out []byte) int64 {
	return hostCall(out, func(h Host) (any, error) {
		sh, err := storeHost(h)
		if err != nil {
			return nil, err
		}
		objs, err := sh.StoreList(prefix)
		if err != nil {
			return nil, err
		}
		return json.Marshal(struct {
			Objects []abi.StoreObject `json:"objects"`
		}{objs})
	})
}

func rawStoreDelete(key string) int64 {
	return hostCall(nil, func(h Host) (any, error) {
		sh, err := storeHost(h)
		if err != nil {
			return nil, err
		}
		return 0, sh.StoreDelete(key)
	})
}

// The native session state is the package's own, emptied by SetHost, unless the Host
// keeps it (StateHost).
var nativeState = map[string][]byte{}

// StateHost is a native Host that keeps the plugin's session state itself.
type StateHost interface {
	SessionGet(key string) ([]byte, bool)
	SessionSet(key string, value []byte)
}

func rawSessionGet(key string, out []byte) int64 {
	return hostCall(out, func(h Host) (any, error) {
		var v []byte
		var ok bool
		if sh, isState := h.(StateHost); isState {
			v, ok = sh.SessionGet(key)
		} else {
			native.Lock()
			v, ok = nativeState[key]
			native.Unlock()
		}
		if !ok {
			return nil, &Error{Op: "session get", Status: abi.StatusNotFound, Msg: "session get " + key + ": no such key"}
		}
		return append([]byte(nil), v...), nil
	})
}

func rawSessionSet(key string, data []byte) int64 {
	return hostCall(nil, func(h Host) (any, error) {
		v := append([]byte(nil), data...)
		if sh, isState := h.(StateHost); isState {
			sh.SessionSet(key, v)
			return len(data), nil
		}
		native.Lock()
		if len(v) == 0 {
			delete(nativeState, key)
		} else {
			nativeState[key] = v
		}
		native.Unlock()
		return len(data), nil
	})
}

// RemoveHost is a native Host that can remove files (sandbox_files.remove).
type RemoveHost interface {
	Remove(path string) error
}

func rawRemove(path string) int64 {
	return hostCall(nil, func(h Host) (any, error) {
		rh, ok := h.(RemoveHost)
		if !ok {
			return nil, errNativeUnsupported
		}
		return 0, rh.Remove(path)
	})
}

// ProcessHost is a native Host that can ask after and signal background commands
// (sandbox_exec.process).
type ProcessHost interface {
	Process(req abi.ProcessRequest) (abi.ProcessReply, error)
}

func rawProcess(req, out []byte) int64 {
	return hostCall(out, func(h Host) (any, error) {
		ph, ok := h.(ProcessHost)
		if !ok {
			return nil, errNativeUnsupported
		}
		var r abi.ProcessRequest
		if err := json.Unmarshal(req, &r); err != nil {
			return nil, invalid("process", err)
		}
		return ph.Process(r)
	})
}

// TerminalHost is a native Host with terminals (sandbox_exec.terminal_start and
// terminal_io). Output is what the program wrote.
type TerminalHost interface {
	TerminalStart(req abi.TerminalStartRequest) (abi.TerminalReply, []byte, error)
	TerminalIO(req abi.TerminalIORequest) (abi.TerminalReply, []byte, error)
}

func terminalCall(out []byte, fn func(th TerminalHost) (abi.TerminalReply, []byte, error)) int64 {
	return hostCall(out, func(h Host) (any, error) {
		th, ok := h.(TerminalHost)
		if !ok {
			return nil, errNativeUnsupported
		}
		r, output, err := fn(th)
		if err != nil {
			return nil, err
		}
		r.OutputLen = len(output)
		hb, err := json.Marshal(r)
		return append(append(hb, '\n'), output...), err
	})
}

func rawTerminalStart(req, out []byte) int64 {
	return terminalCall(out, func(th TerminalHost) (abi.TerminalReply, []byte, error) {
		var r abi.TerminalStartRequest
		if err := json.Unmarshal(req, &r); err != nil {
			return abi.TerminalReply{}, nil, invalid("terminal_start", err)
		}
		return th.TerminalStart(r)
	})
}

func rawTerminalIO(req, out []byte) int64 {
	return terminalCall(out, func(th TerminalHost) (abi.TerminalReply, []byte, error) {
		var r abi.TerminalIORequest
		if err := json.Unmarshal(req, &r); err != nil {
			return abi.TerminalReply{}, nil, invalid("terminal_io", err)
		}
		return th.TerminalIO(r)
	})
}

// WebHost is a native Host that can fetch web pages (capability web).
type WebHost interface {
	Fetch(req abi.FetchRequest) (reply abi.FetchReply, body []byte, err error)
}

func rawFetch(req, out []byte) int64 {
	return hostCall(out, func(h Host) (any, error) {
		wh, ok := h.(WebHost)
		if !ok {
			return nil, errNativeUnsupported
		}
		var r abi.FetchRequest
		if err := json.Unmarshal(req, &r); err != nil {
			return nil, invalid("fetch", err)
		}
		reply, body, err := wh.Fetch(r)
		if err != nil {
			return nil, err
		}
		reply.BodyLen = len(body)
		hb, _ := json.Marshal(reply)
		return append(append(hb, '\n'), body...), nil
	})
}
