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
	"github.com/toolhost/toolhost/internal/storekeys"
)

// The store capability gives each plugin a corner of the object store of its own:
// plugins/{plugin name}/. Keys are relative to it and cannot climb out.

// storeKeyRE is a key's alphabet; its length (at most 512) is checked apart, because a
// counted repetition {0,511} compiles into 511 copies of the class, which cost every
// process that imports the host 20 ms at start (the CLI's call --session included).
var storeKeyRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]*$`)

const maxStoreKey = 512

// storeKey turns a plugin's key into a store key under its prefix. A prefix (for list)
// may be empty or end in '/'.
func (inst *instance) storeKey(raw []byte, prefix bool) (string, bool) {
	k := string(raw)
	if prefix && k == "" {
		return storekeys.Plugin(inst.p.name), true
	}
	if len(k) > maxStoreKey || !storeKeyRE.MatchString(k) || strings.Contains(k, "//") {
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
	return storekeys.Plugin(inst.p.name) + k, true
}

// decodeStoreKey decodes the key argument in stack[0:2] of a store function. A store
// without an object store configured fails here, before the policy is asked.
func (h *Host) decodeStoreKey(_ context.Context, inst *instance, stack []uint64, c *hostCall) bool {
	what := c.req.Op
	if h.cfg.Store == nil {
		stack[0] = inst.status(abi.StatusIO, "store %s: this host has no object store configured", what)
		return false
	}
	raw, s, msg := inst.guestBytes(uint32(stack[0]), uint32(stack[1]), 1024)
	if s != 0 {
		stack[0] = inst.status(s, "store %s: key: %s", what, msg)
		return false
	}
	c.req.Key = string(raw)
	key, ok := inst.storeKey(raw, what == abi.FnStoreList)
	if !ok {
		stack[0] = inst.status(abi.StatusInvalid, "store %s: key %q must be relative, of letters, digits, '.', '_', '-' and '/', without '..' (at most 512 bytes)", what, raw)
		return false
	}
	c.abs = key
	return true
}

// decodeStoreKeyOut decodes (key_ptr, key_len, out_ptr, out_cap).
func (h *Host) decodeStoreKeyOut(ctx context.Context, inst *instance, stack []uint64, c *hostCall) bool {
	c.outPtr, c.outCap = uint32(stack[2]), uint32(stack[3])
	return h.decodeStoreKey(ctx, inst, stack, c)
}

// decodeStorePut decodes (key_ptr, key_len, data_ptr, data_len).
func (h *Host) decodeStorePut(ctx context.Context, inst *instance, stack []uint64, c *hostCall) bool {
	dataPtr, dataLen := uint32(stack[2]), uint32(stack[3])
	if !h.decodeStoreKey(ctx, inst, stack, c) {
		return false
	}
	data, s, msg := inst.guestBytes(dataPtr, dataLen, int(h.cfg.MaxReadBytes))
	if s != 0 {
		stack[0] = inst.status(s, "store put: %s", msg)
		return false
	}
	c.data, c.in = data, len(data)
	return true
}

// storeStatus maps a store failure to a status and a message in words; the store's own
// error (its endpoint, its protocol) goes to the host's log.
func (inst *instance) storeStatus(what, key string, err error) uint64 {
	s, why := abi.StatusIO, "the object store failed"
	switch {
	case errors.Is(err, store.ErrNotFound):
		s, why = abi.StatusNotFound, "no such object"
	case errors.Is(err, store.ErrInvalidKey):
		s, why = abi.StatusInvalid, "the store refused the key"
	case errors.Is(err, store.ErrFenced):
		why = "this session may no longer write: its project may be open on another host now; start a new session"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		s, why = abi.StatusTimeout, "the call ran out of time"
	default:
		inst.p.h.log.Warn("store call failed", "plugin", inst.p.name, "op", what, "err", err)
	}
	rel := strings.TrimPrefix(key, storekeys.Plugin(inst.p.name))
	return inst.status(s, "store %s %s: %s", what, rel, why)
}

func (h *Host) storePut(ctx context.Context, inst *instance, c *hostCall) uint64 {
	if _, err := h.storeOf(inst).Put(ctx, c.abs, bytes.NewReader(c.data), store.PutOptions{Size: int64(len(c.data))}); err != nil {
		return inst.storeStatus("put", c.abs, err)
	}
	return uint64(len(c.data))
}

func (h *Host) storeGet(ctx context.Context, inst *instance, c *hostCall) uint64 {
	rc, info, err := h.storeOf(inst).Get(ctx, c.abs)
	if err != nil {
		return inst.storeStatus("get", c.abs, err)
	}
	defer rc.Close()
	if info.Size > h.cfg.MaxReadBytes {
		return inst.status(abi.StatusTooLarge, "store get %s: object of %d bytes is over the %d limit", c.req.Key, info.Size, h.cfg.MaxReadBytes)
	}
	data, err := io.ReadAll(io.LimitReader(rc, h.cfg.MaxReadBytes+1))
	if err != nil {
		return inst.storeStatus("get", c.abs, err)
	}
	return inst.reply(c.outPtr, c.outCap, data)
}

func (h *Host) storeList(ctx context.Context, inst *instance, c *hostCall) uint64 {
	objs, err := store.ListAll(ctx, h.storeOf(inst), c.abs)
	if err != nil {
		return inst.storeStatus("list", c.abs, err)
	}
	own := storekeys.Plugin(inst.p.name)
	out := struct {
		Objects []abi.StoreObject `json:"objects"`
	}{Objects: make([]abi.StoreObject, 0, len(objs))}
	for _, o := range objs {
		out.Objects = append(out.Objects, abi.StoreObject{Key: strings.TrimPrefix(o.Key, own), Size: o.Size})
	}
	b, _ := json.Marshal(out)
	return inst.reply(c.outPtr, c.outCap, b)
}

func (h *Host) storeDelete(ctx context.Context, inst *instance, c *hostCall) uint64 {
	if err := h.storeOf(inst).Delete(ctx, c.abs); err != nil {
		return inst.storeStatus("delete", c.abs, err)
	}
	return 0
}
