package host

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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
// can never both pass the check on the same version. (A command run by bash that changes
// the file between the check and the write is not covered: it is not an edit.)

// fileVersion is the version of a file's contents.
func fileVersion(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

func (h *Host) readVersioned(ctx context.Context, inst *instance, stack []uint64) {
	outPtr, outCap := uint32(stack[2]), uint32(stack[3])
	abs, st, ok := inst.pathArg(uint32(stack[0]), uint32(stack[1]))
	if !ok {
		stack[0] = st
		return
	}
	data, err := inst.sb.ReadFile(ctx, abs, h.cfg.MaxReadBytes)
	if err != nil {
		stack[0] = inst.fileStatus("read "+sandbox.Rel(abs), err)
		return
	}
	out := make([]byte, 0, abi.VersionLen+1+len(data))
	out = append(append(append(out, fileVersion(data)...), '\n'), data...)
	stack[0] = inst.reply(outPtr, outCap, out)
}

func (h *Host) writeVersioned(ctx context.Context, inst *instance, stack []uint64) {
	abs, st, ok := inst.pathArg(uint32(stack[0]), uint32(stack[1]))
	if !ok {
		stack[0] = st
		return
	}
	rel := sandbox.Rel(abs)
	data, s, msg := inst.guestBytes(uint32(stack[2]), uint32(stack[3]), int(h.cfg.MaxReadBytes))
	if s != 0 {
		stack[0] = inst.status(s, "write %s: %s", rel, msg)
		return
	}
	want, s, msg := inst.guestBytes(uint32(stack[4]), uint32(stack[5]), abi.VersionLen)
	if s != 0 {
		stack[0] = inst.status(s, "write %s: version: %s", rel, msg)
		return
	}
	if len(want) != 0 && len(want) != abi.VersionLen {
		stack[0] = inst.status(abi.StatusInvalid, "write %s: a version is %d hex characters (or empty for a new file), not %d bytes", rel, abi.VersionLen, len(want))
		return
	}
	unlock := h.edits.lock(inst.sb.ID() + "\x00" + abs)
	defer unlock()
	cur, err := inst.sb.ReadFile(ctx, abs, h.cfg.MaxReadBytes)
	switch {
	case errors.Is(err, sandbox.ErrNotFound) && len(want) == 0:
	case err != nil && !errors.Is(err, sandbox.ErrNotFound):
		stack[0] = inst.fileStatus("write "+rel, err)
		return
	case err != nil || fileVersion(cur) != string(want):
		stack[0] = inst.status(abi.StatusChanged, "write %s: the file changed since it was read; read it again", rel)
		return
	}
	if err := inst.sb.WriteFile(ctx, abs, data); err != nil {
		stack[0] = inst.fileStatus("write "+rel, err)
		return
	}
	stack[0] = uint64(len(data))
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
