package host

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"regexp"
	"strings"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/store"
)

// The store capability gives each plugin a corner of the object store of its own:
// plugins/{plugin name}/. Keys are relative to it and cannot climb out.

var storeKeyRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]{0,511}$`)

// storeKey turns a plugin's key into a store key under its prefix. A prefix (for list)
// may be empty or end in '/'.
func (inst *instance) storeKey(raw []byte, prefix bool) (string, bool) {
	k := string(raw)
	if prefix && k == "" {
		return "plugins/" + inst.p.name + "/", true
	}
	if !storeKeyRE.MatchString(k) || strings.Contains(k, "//") {
		return "", false
	}
	for _, seg := range strings.Split(k, "/") {
		if seg == "." || seg == ".." {
			return "", false
		}
	}
	if !prefix && strings.HasSuffix(k, "/") {
		return "", false
	}
	return "plugins/" + inst.p.name + "/" + k, true
}

// storeArgs reads the key argument of a store function; ok is false when stack[0]
// already holds the status to return.
func (h *Host) storeArgs(inst *instance, stack []uint64, what string) (store.Store, string, bool) {
	if h.cfg.Store == nil {
		stack[0] = inst.status(abi.StatusIO, "store %s: this host has no object store configured", what)
		return nil, "", false
	}
	raw, s, msg := inst.guestBytes(uint32(stack[0]), uint32(stack[1]), 1024)
	if s != 0 {
		stack[0] = inst.status(s, "store %s: key: %s", what, msg)
		return nil, "", false
	}
	key, ok := inst.storeKey(raw, what == "list")
	if !ok {
		stack[0] = inst.status(abi.StatusInvalid, "store %s: key %q must be relative, of letters, digits, '.', '_', '-' and '/', without '..' (at most 512 bytes)", what, raw)
		return nil, "", false
	}
	return h.cfg.Store, key, true
}

func (inst *instance) storeStatus(what, key string, err error) uint64 {
	s := abi.StatusIO
	switch {
	case errors.Is(err, store.ErrNotFound):
		s = abi.StatusNotFound
	case errors.Is(err, store.ErrInvalidKey):
		s = abi.StatusInvalid
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		s = abi.StatusTimeout
	}
	rel := strings.TrimPrefix(key, "plugins/"+inst.p.name+"/")
	return inst.status(s, "store %s %s: %v", what, rel, err)
}

func (h *Host) storePut(ctx context.Context, inst *instance, stack []uint64) {
	st, key, ok := h.storeArgs(inst, stack, "put")
	if !ok {
		return
	}
	data, s, msg := inst.guestBytes(uint32(stack[2]), uint32(stack[3]), int(h.cfg.MaxReadBytes))
	if s != 0 {
		stack[0] = inst.status(s, "store put: %s", msg)
		return
	}
	if _, err := st.Put(ctx, key, bytes.NewReader(data), store.PutOptions{Size: int64(len(data))}); err != nil {
		stack[0] = inst.storeStatus("put", key, err)
		return
	}
	stack[0] = uint64(len(data))
}

func (h *Host) storeGet(ctx context.Context, inst *instance, stack []uint64) {
	st, key, ok := h.storeArgs(inst, stack, "get")
	if !ok {
		return
	}
	outPtr, outCap := uint32(stack[2]), uint32(stack[3])
	rc, info, err := st.Get(ctx, key)
	if err != nil {
		stack[0] = inst.storeStatus("get", key, err)
		return
	}
	defer rc.Close()
	if info.Size > h.cfg.MaxReadBytes {
		stack[0] = inst.status(abi.StatusTooLarge, "store get: object of %d bytes is over the %d limit", info.Size, h.cfg.MaxReadBytes)
		return
	}
	data, err := io.ReadAll(io.LimitReader(rc, h.cfg.MaxReadBytes+1))
	if err != nil {
		stack[0] = inst.storeStatus("get", key, err)
		return
	}
	stack[0] = inst.reply(outPtr, outCap, data)
}

func (h *Host) storeList(ctx context.Context, inst *instance, stack []uint64) {
	st, prefix, ok := h.storeArgs(inst, stack, "list")
	if !ok {
		return
	}
	outPtr, outCap := uint32(stack[2]), uint32(stack[3])
	objs, err := store.ListAll(ctx, st, prefix)
	if err != nil {
		stack[0] = inst.storeStatus("list", prefix, err)
		return
	}
	own := "plugins/" + inst.p.name + "/"
	out := struct {
		Objects []abi.StoreObject `json:"objects"`
	}{Objects: make([]abi.StoreObject, 0, len(objs))}
	for _, o := range objs {
		out.Objects = append(out.Objects, abi.StoreObject{Key: strings.TrimPrefix(o.Key, own), Size: o.Size})
	}
	b, _ := json.Marshal(out)
	stack[0] = inst.reply(outPtr, outCap, b)
}

func (h *Host) storeDelete(ctx context.Context, inst *instance, stack []uint64) {
	st, key, ok := h.storeArgs(inst, stack, "delete")
	if !ok {
		return
	}
	if err := st.Delete(ctx, key); err != nil {
		stack[0] = inst.storeStatus("delete", key, err)
		return
	}
	stack[0] = 0
}
