package envd

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"syscall"

	"github.com/toolhost/toolhost/core/sandbox"
)

// Kinds carried in toolhostKind, one per sandbox sentinel.
var kinds = []struct {
	name string
	err  error
}{
	{"not_found", sandbox.ErrNotFound},
	{"is_dir", sandbox.ErrIsDir},
	{"not_dir", sandbox.ErrNotDir},
	{"exists", sandbox.ErrExists},
	{"outside", sandbox.ErrOutside},
	{"too_large", sandbox.ErrTooLarge},
	{"closed", sandbox.ErrClosed},
	{"port_closed", sandbox.ErrPortClosed},
	{"not_regular", sandbox.ErrNotRegular},
	{"changed", sandbox.ErrChanged},
	{"link", sandbox.ErrLink},
	{"cannot_start", sandbox.ErrCannotStart},
}

func KindError(name string) error {
	for _, k := range kinds {
		if k.name == name {
			return k.err
		}
	}
	return nil
}

// Error is a failure reported by the agent (or by whatever answered in its place).
// It unwraps to the matching sandbox sentinel when there is one.
type Error struct {
	Status  int    // HTTP status
	Code    string // Connect code, or "" for /files
	Message string
	Kind    error // a sandbox sentinel or nil
}

func (e *Error) Error() string {
	if e.Code != "" {
		return fmt.Sprintf("envd %s: %s", e.Code, e.Message)
	}
	return fmt.Sprintf("envd HTTP %d: %s", e.Status, e.Message)
}

// Unwrap exposes the sentinel for errors.Is.
func (e *Error) Unwrap() error { return e.Kind }

// guessKind maps an error from a server that did not say (a real envd or a proxy).
func GuessKind(status int, code, msg string) error {
	switch {
	case status == 502: // E2B edge proxy: the sandbox is gone
		return sandbox.ErrClosed
	case code == CodeNotFound || (code == "" && status == 404):
		return sandbox.ErrNotFound
	case code == CodeAlreadyExists:
		return sandbox.ErrExists
	case strings.Contains(msg, "is a directory"):
		return sandbox.ErrIsDir
	case strings.Contains(msg, "not a directory"):
		return sandbox.ErrNotDir
	case status == 413:
		return sandbox.ErrTooLarge
	}
	return nil
}

// errPathEscapes is how os.Root reports a path or link leaving the root; the os package
// keeps its sentinel unexported, so the text is matched.
const ErrPathEscapes = "path escapes from parent"

// classify maps an agent-side Go error to a Connect code and a kind name.
func Classify(err error) (code, kind string) {
	if strings.Contains(err.Error(), ErrPathEscapes) { // codecheck:errtext os keeps its sentinel unexported
		return CodePermissionDenied, "outside"
	}
	switch {
	case errors.Is(err, sandbox.ErrCannotStart):
		return CodeResourceExhaust, "cannot_start"
	case errors.Is(err, sandbox.ErrLink):
		return CodePermissionDenied, "link"
	case errors.Is(err, sandbox.ErrChanged):
		return CodeFailedPrecond, "changed"
	case errors.Is(err, sandbox.ErrOutside):
		return CodePermissionDenied, "outside"
	case errors.Is(err, sandbox.ErrPortClosed):
		return CodeNotFound, "port_closed"
	case errors.Is(err, sandbox.ErrNotRegular):
		return CodeInvalidArgument, "not_regular"
	case errors.Is(err, sandbox.ErrTooLarge):
		return CodeOutOfRange, "too_large"
	case errors.Is(err, sandbox.ErrIsDir), errors.Is(err, syscall.EISDIR):
		return CodeInvalidArgument, "is_dir"
	case errors.Is(err, sandbox.ErrNotDir), errors.Is(err, syscall.ENOTDIR):
		return CodeInvalidArgument, "not_dir"
	case errors.Is(err, sandbox.ErrNotFound), errors.Is(err, fs.ErrNotExist):
		return CodeNotFound, "not_found"
	case errors.Is(err, sandbox.ErrExists), errors.Is(err, fs.ErrExist):
		return CodeAlreadyExists, "exists"
	case errors.Is(err, syscall.ELOOP):
		// Too many links, or O_NOFOLLOW met a link.
		return CodePermissionDenied, "outside"
	case errors.Is(err, fs.ErrPermission):
		return CodePermissionDenied, ""
	}
	var ae *ArgError
	if errors.As(err, &ae) {
		return CodeInvalidArgument, ""
	}
	return CodeInternal, ""
}

// ArgError marks a bad request.
type ArgError struct{ msg string }

func (e *ArgError) Error() string { return e.msg }

func BadArg(format string, a ...any) error { return &ArgError{fmt.Sprintf(format, a...)} }
