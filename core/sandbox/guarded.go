package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
)

// Guarded file operations.
//
// A host that decides something about a file before it acts on it (that the file still
// has the contents a plugin read, that no part of a scoped path is a symbolic link) leaves
// a window between the decision and the use, which a process of the sandbox, or another
// host sharing the workspace, can use. A sandbox that can decide in the same step as it
// acts is a GuardedFiles, found with As. A sandbox without the ability leaves the caller
// to check first, with the window that implies.

var (
	// ErrChanged: a guarded write found the file's contents no longer at the version
	// the caller read (or a file where it expected none).
	ErrChanged = errors.New("the file changed since it was read")
	// ErrLink: a guarded operation with NoLinks met a symbolic link in the path.
	ErrLink = errors.New("a part of the path is a symbolic link")
)

// FileGuard is what a guarded operation checks as it opens the path.
type FileGuard struct {
	// NoLinks refuses a symbolic link at any part of the path, the last included, with
	// an error wrapping ErrLink: the path is opened from the workspace down one part at a
	// time, each relative to the directory before it, so no swap between a check and the
	// use can take the operation through a link.
	NoLinks bool
	// Versioned makes a write conditional: it happens only if the file's contents still
	// have Version (FileVersion of them), or, with Version empty, if no file is there;
	// else the error wraps ErrChanged. The check and the write run under a lock that every
	// guarded write of the file's directory takes, in any process on any host sharing it.
	Versioned bool
	Version   string
}

// GuardedFiles is a sandbox that checks a FileGuard in the same step as the operation.
// Versioned applies to WriteFileGuarded only; the others check NoLinks.
type GuardedFiles interface {
	ReadFileGuarded(ctx context.Context, path string, maxBytes int64, g FileGuard) ([]byte, error)
	WriteFileGuarded(ctx context.Context, path string, data []byte, g FileGuard) error
	// StatGuarded is Stat of the path opened with the guard: with NoLinks a link as the
	// last part is refused too (ErrLink), not described.
	StatGuarded(ctx context.Context, path string, g FileGuard) (FileInfo, error)
	// ListGuarded is List of the directory opened with the guard; below it, as in List,
	// no link is followed, and a directory swapped for a link during the listing is not
	// entered.
	ListGuarded(ctx context.Context, req ListRequest, g FileGuard) (ListResult, error)
	// RemoveFileGuarded removes one entry that is not a directory, never recursively, the
	// check and the removal one step: a directory gives ErrIsDir (whatever was there when
	// the caller looked), a missing entry ErrNotFound or fs.ErrNotExist.
	RemoveFileGuarded(ctx context.Context, path string, g FileGuard) error
}

// FileVersion is the version of a file's contents: the hex SHA-256 of them.
func FileVersion(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}
