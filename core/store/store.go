// Package store is toolhost's object store: a small interface with the semantics of S3
// (flat keys, whole-object puts, lexically ordered paged listing) and two backends,
// store/s3 for AWS and any S3-compatible endpoint, and store/dir, a directory on local
// disk that needs no setup.
//
// Keys are slash-separated UTF-8 paths such as "projects/p1/snapshots/x.tar.gz". ValidKey
// states the rules every backend accepts; a prefix meant as a folder should end in "/"
// ("projects/1/" does not match "projects/10/...").
package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"
)

// Errors callers branch on; backends wrap them, so test with errors.Is.
var (
	// ErrNotFound: no object has the key.
	ErrNotFound = errors.New("object not found")
	// ErrExists: PutOptions.IfNotExists was set and the key already holds an object.
	ErrExists = errors.New("object already exists")
	// ErrInvalidKey: the key breaks ValidKey's rules (or a backend's own).
	ErrInvalidKey = errors.New("invalid object key")
	// ErrChecksum: the bytes read do not match the checksum the store holds for the
	// object (reported by reads from Get, when the backend validates).
	ErrChecksum = errors.New("object checksum mismatch")
	// ErrFenced: a store wrapper refused a write before sending it, or cut it short,
	// because the writer may no longer write: it lost the lease that made it the writer
	// of what the write belongs to (a project's lease: internal/lease), and another
	// writer may have taken over. Retrying cannot help (Permanent).
	ErrFenced = errors.New("writes fenced off")

	// The store could not serve a request at all. Backends wrap one of these (with a
	// one-line message naming the store) so callers can tell a passing outage from a
	// setting that retrying cannot fix (see Permanent).

	// ErrUnreachable: the store did not answer (connection refused, no such host, a
	// timeout, a TLS failure) or answered with a server error. Retrying may help.
	ErrUnreachable = errors.New("store unreachable")
	// ErrNoCredentials: no credentials were found to sign requests with.
	ErrNoCredentials = errors.New("no credentials")
	// ErrAccessDenied: the store refused the credentials or their permissions.
	ErrAccessDenied = errors.New("access denied")
	// ErrNoBucket: the bucket (or the store's directory) does not exist.
	ErrNoBucket = errors.New("bucket does not exist")
)

// Permanent reports whether err is a failure that retrying the same request cannot fix:
// missing credentials, access denied, a missing bucket, an invalid key or a fenced-off
// writer.
func Permanent(err error) bool {
	for _, e := range []error{ErrNoCredentials, ErrAccessDenied, ErrNoBucket, ErrInvalidKey, ErrFenced} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// MaxListKeys is the largest page List returns, as in S3.
const MaxListKeys = 1000

// Store holds objects. Implementations are safe for concurrent use.
type Store interface {
	// Put stores the bytes read from r under key, replacing any object there unless
	// opts.IfNotExists is set. The object becomes visible whole or not at all.
	Put(ctx context.Context, key string, r io.Reader, opts PutOptions) (ObjectInfo, error)
	// Get opens an object for reading; the caller closes the reader. The info carries the
	// object's metadata.
	Get(ctx context.Context, key string) (io.ReadCloser, ObjectInfo, error)
	// Head describes an object, metadata included, without reading it.
	Head(ctx context.Context, key string) (ObjectInfo, error)
	// List returns one page of the objects whose keys start with opts.Prefix, in
	// lexical (byte) order of the keys. ListPage.Next is the token for the following
	// page, empty after the last one. Metadata is not filled in.
	List(ctx context.Context, opts ListOptions) (ListPage, error)
	// Delete removes objects; keys that do not exist are not an error.
	Delete(ctx context.Context, keys ...string) error
}

// URLer is implemented by stores that can give a location for an object: a presigned
// HTTPS URL for S3 (valid for ttl), a file path for the directory store.
type URLer interface {
	URL(ctx context.Context, key string, ttl time.Duration) (string, error)
}

// PutOptions describe an object being stored.
type PutOptions struct {
	// Size is the number of bytes r will yield, or -1 (or 0 with an empty reader) when
	// unknown. When known, a reader that yields a different count fails the Put.
	Size int64
	// ContentType is stored as the object's media type (default application/octet-stream).
	ContentType string
	// Metadata is stored with the object and returned by Get and Head. Keys are
	// lower-case ASCII letters, digits and '-'; values are printable ASCII.
	Metadata map[string]string
	// IfNotExists makes the Put fail with ErrExists instead of replacing an object.
	IfNotExists bool
}

// ObjectInfo describes a stored object.
type ObjectInfo struct {
	Key          string
	Size         int64
	LastModified time.Time
	ETag         string
	ContentType  string
	// Metadata is filled in by Get and Head, not by List.
	Metadata map[string]string
}

// ListOptions select a page of keys.
type ListOptions struct {
	Prefix string
	// Token continues a listing: ListPage.Next from the previous page.
	Token string
	// MaxKeys bounds the page size; 0 or more than MaxListKeys means MaxListKeys.
	MaxKeys int
}

// ListPage is one page of a listing.
type ListPage struct {
	Objects []ObjectInfo
	// Next is the Token for the following page; empty when this page is the last.
	Next string
}

// ListAll pages through every object under prefix.
func ListAll(ctx context.Context, s Store, prefix string) ([]ObjectInfo, error) {
	var all []ObjectInfo
	opts := ListOptions{Prefix: prefix}
	for {
		page, err := s.List(ctx, opts)
		if err != nil {
			return all, err
		}
		all = append(all, page.Objects...)
		if page.Next == "" {
			return all, nil
		}
		opts.Token = page.Next
	}
}

// MaxKeyLen is the longest key accepted, in bytes, as in S3.
const MaxKeyLen = 1024

// ValidKey reports why key is not portable across backends, or nil. A valid key is
// 1 to MaxKeyLen bytes of UTF-8 without NUL, backslash or control characters, does not
// start or end with "/", and has no empty, "." or ".." segment, so it maps onto a
// relative file path that stays below a directory.
func ValidKey(key string) error {
	bad := func(why string) error { return fmt.Errorf("%w %q: %s", ErrInvalidKey, key, why) }
	switch {
	case key == "":
		return bad("empty")
	case len(key) > MaxKeyLen:
		return bad(fmt.Sprintf("longer than %d bytes", MaxKeyLen))
	case !utf8.ValidString(key):
		return bad("not UTF-8")
	case strings.HasPrefix(key, "/"):
		return bad("absolute (starts with /)")
	case strings.HasSuffix(key, "/"):
		return bad("ends with /")
	}
	for _, r := range key {
		if r < 0x20 || r == 0x7f || r == '\\' {
			return bad("control character or backslash")
		}
	}
	for _, seg := range strings.Split(key, "/") {
		switch seg {
		case "":
			return bad("empty segment (//)")
		case ".", "..":
			return bad("has a . or .. segment")
		}
	}
	return nil
}

// ValidMetadata reports whether metadata can be stored by every backend.
func ValidMetadata(md map[string]string) error {
	for k, v := range md {
		if k == "" {
			return fmt.Errorf("metadata: empty key")
		}
		for _, r := range k {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
				return fmt.Errorf("metadata key %q: use lower-case letters, digits and '-'", k)
			}
		}
		for _, r := range v {
			if r < 0x20 || r > 0x7e {
				return fmt.Errorf("metadata %q: value must be printable ASCII", k)
			}
		}
	}
	return nil
}

// CopyContext copies r to w like io.Copy, checking ctx between chunks so a long copy stops
// soon after ctx ends. It returns the bytes copied.
func CopyContext(ctx context.Context, w io.Writer, r io.Reader) (int64, error) {
	buf := make([]byte, 256<<10)
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		k, rerr := r.Read(buf)
		if k > 0 {
			if _, err := w.Write(buf[:k]); err != nil {
				return n, err
			}
			n += int64(k)
		}
		if rerr == io.EOF {
			return n, nil
		}
		if rerr != nil {
			return n, rerr
		}
	}
}
