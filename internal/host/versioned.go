package host

import (
	"context"
	"errors"
	"sync"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
)

// A versioned read and write let a plugin change a file without losing a change another
// call made meanwhile: read_versioned returns the contents with their version (the hex
// SHA-256), and write_versioned writes only if the file still has that version, else it
// answers StatusChanged and the plugin reads again and redoes its change. The check and the
// write run under a lock per session and path, so two edits of one file through this host
// can never both pass the check on the same version. A sandbox that can check the version
// itself (sandbox.GuardedFiles: the local one's agent) does the check and the write as one
// step under a lock on the file's directory, which every sandbox sharing the directory
// takes: so two host processes, or two hosts, sharing a host directory lose no edit
// either. (A command run by bash that changes the file between the check and the write is
// not covered: it is not an edit.)

// fileVersion is the version of a file's contents.
func fileVersion(data []byte) string { return sandbox.FileVersion(data) }

// changedStatus is the answer to the loser of a versioned write.
func (inst *instance) changedStatus(rel string) uint64 {
	return inst.status(abi.StatusChanged, "write %s: the file changed since it was read; read it again", rel)
}

func (h *Host) readVersioned(ctx context.Context, inst *instance, c *hostCall) uint64 {
	data, err := inst.sbRead(ctx, c, h.cfg.MaxReadBytes)
	if err != nil {
		return inst.fileStatus("read "+c.req.Path, err)
	}
	out := make([]byte, 0, abi.VersionLen+1+len(data))
	out = append(append(append(out, fileVersion(data)...), '\n'), data...)
	return inst.reply(c.outPtr, c.outCap, out)
}

// decodeWriteVersioned decodes (path_ptr, path_len, data_ptr, data_len, version_ptr,
// version_len).
func (h *Host) decodeWriteVersioned(ctx context.Context, inst *instance, stack []uint64, c *hostCall) bool {
	verPtr, verLen := uint32(stack[4]), uint32(stack[5])
	if !h.decodePathData(ctx, inst, stack, c) {
		return false
	}
	want, s, msg := inst.guestBytes(verPtr, verLen, abi.VersionLen)
	if s != 0 {
		stack[0] = inst.status(s, "write %s: version: %s", c.req.Path, msg)
		return false
	}
	if len(want) != 0 && len(want) != abi.VersionLen {
		stack[0] = inst.status(abi.StatusInvalid, "write %s: a version is %d hex characters (or empty for a new file), not %d bytes", c.req.Path, abi.VersionLen, len(want))
		return false
	}
	c.version = want
	return true
}

func (h *Host) writeVersioned(ctx context.Context, inst *instance, c *hostCall) uint64 {
	rel, abs := c.req.Path, c.abs
	unlock := h.edits.lock(inst.sb.ID() + "\x00" + abs)
	defer unlock()
	if gf, ok := sandbox.As[sandbox.GuardedFiles](inst.sb); ok {
		err := gf.WriteFileGuarded(ctx, abs, c.data, sandbox.FileGuard{NoLinks: c.noLinks, Versioned: true, Version: string(c.version)})
		switch {
		case errors.Is(err, sandbox.ErrChanged):
			return inst.changedStatus(rel)
		case errors.Is(err, sandbox.ErrUnsupported):
			// Checked here, within this host process only.
		case err != nil:
			return inst.fileStatus("write "+rel, err)
		default:
			return uint64(len(c.data))
		}
	}
	cur, err := inst.sb.ReadFile(ctx, abs, h.cfg.MaxReadBytes)
	switch {
	case errors.Is(err, sandbox.ErrNotFound) && len(c.version) == 0:
	case err != nil && !errors.Is(err, sandbox.ErrNotFound):
		return inst.fileStatus("write "+rel, err)
	case err != nil || fileVersion(cur) != string(c.version):
		return inst.changedStatus(rel)
	}
	if err := inst.sbWrite(ctx, c, c.data); err != nil {
		return inst.fileStatus("write "+rel, err)
	}
	return uint64(len(c.data))
}

// keyLocks serialises work on the same key; a key's lock exists only while used.
type keyLocks struct {
	mu    sync.Mutex
	locks map[string]*keyLock
}

type keyLock struct {
	mu   sync.Mutex
	refs int
}

// lock locks key and returns its unlock.
func (l *keyLocks) lock(key string) func() {
	l.mu.Lock()
	if l.locks == nil {
		l.locks = map[string]*keyLock{}
	}
	k := l.locks[key]
	if k == nil {
		k = &keyLock{}
		l.locks[key] = k
	}
	k.refs++
	l.mu.Unlock()
	k.mu.Lock()
	return func() {
		k.mu.Unlock()
		l.mu.Lock()
		if k.refs--; k.refs == 0 {
			delete(l.locks, key)
		}
		l.mu.Unlock()
	}
}
