package chunked_test

import (
	"testing"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/chunked/chunkedtest"
	"github.com/toolhost/toolhost/internal/store/dir"
)

func dirStore(t *testing.T) store.Store {
	st, err := dir.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// The suite on the directory store; internal/store/s3 runs it on S3.
func TestConformance(t *testing.T) { chunkedtest.Run(t, dirStore) }
