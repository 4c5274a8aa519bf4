package fleet

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/storekeys"
)

// The fleet's name (storekeys.FleetID) is 32 hex digits, made once by the first replica
// that joins the store and read by every one after it.
const idLen = 32

// ID reads the fleet's name from st, making it when the store has none (the first
// replica of the fleet). Two replicas joining at once read the same name: the second's
// write is refused and it reads the first's. A record that is not a name is an error,
// never replaced: sandboxes may carry it.
func ID(ctx context.Context, st store.Store) (string, error) {
	id, err := ReadID(ctx, st)
	if err == nil || !errors.Is(err, store.ErrNotFound) {
		return id, err
	}
	b := make([]byte, idLen/2)
	rand.Read(b)
	mine := hex.EncodeToString(b)
	_, err = st.Put(ctx, storekeys.FleetID, bytes.NewReader([]byte(mine)),
		store.PutOptions{Size: int64(len(mine)), ContentType: "text/plain", IfNotExists: true})
	switch {
	case err == nil:
		return mine, nil
	case errors.Is(err, store.ErrExists):
		return ReadID(ctx, st)
	default:
		return "", fmt.Errorf("fleet: writing the fleet's name: %w", err)
	}
}

// ReadID reads the fleet's name from st: store.ErrNotFound when no replica made one.
func ReadID(ctx context.Context, st store.Store) (string, error) {
	rc, _, err := st.Get(ctx, storekeys.FleetID)
	if err != nil {
		return "", fmt.Errorf("fleet: reading the fleet's name: %w", err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, idLen+1))
	if err != nil {
		return "", fmt.Errorf("fleet: reading the fleet's name: %w", err)
	}
	if !validID(string(b)) {
		return "", fmt.Errorf("fleet: the record %s is not a fleet name (%d bytes): remove it only if no sandbox carries it", storekeys.FleetID, len(b))
	}
	return string(b), nil
}

func validID(s string) bool {
	if len(s) != idLen {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}
