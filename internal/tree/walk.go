package tree

import (
	"context"
	"errors"
	"fmt"
	"os"
)

// DefaultExcludes are the base names a walk leaves out when WalkOptions.Excludes is nil:
// dependency trees, build output, version control and virtual environments, all of which
// can be made again from the rest of the workspace. (The same list as the tar.gz format's.)
var DefaultExcludes = []string{"node_modules", ".next", "dist", "build", ".git", "__pycache__", ".venv"}

// WalkOptions configure Walk. The zero value is ready to use.
type WalkOptions struct {
	// Excludes lists base names of files and directories to leave out, at any depth. nil
	// means DefaultExcludes; an empty non-nil slice excludes nothing.
	Excludes []string
	// MaxEntries, MaxNameLen and MaxBytes are the bounds of what the walk stores; an entry
	// past one is skipped and reported, never failing the walk. Zero means the defaults.
	MaxEntries int
	MaxNameLen int
	MaxBytes   int64
	// Counted is how many entries count against MaxEntries before the walk's first: a
	// format that stores the root's own entry (a tar's "./") passes 1.
	Counted int
}

func (o *WalkOptions) defaults() {
	if o.Excludes == nil {
		o.Excludes = DefaultExcludes
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = DefaultMaxEntries
	}
	if o.MaxNameLen <= 0 {
		o.MaxNameLen = DefaultMaxNameLen
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
}

// WalkStats say what a walk found and left out.
type WalkStats struct {
	Files, Dirs, Symlinks int
	// Bytes is the sum of the files' sizes.
	Bytes int64
	// Skipped counts entries left out (sockets, devices, fifos, links that are absolute
	// or lead out of the tree, names too long, entries past a bound, unreadable ones);
	// Skips names the first MaxReportedSkips of them. Excluded names are not counted.
	Skipped int
	Skips   []Skip
}

func (st *WalkStats) skip(p, reason string) {
	st.Skipped++
	if len(st.Skips) < MaxReportedSkips {
		if len(p) > 200 {
			p = p[:200] + "..."
		}
		st.Skips = append(st.Skips, Skip{Path: p, Reason: reason})
	}
}

// Opener opens the file an entry of a walk names, relative to its parent's descriptor
// with O_NOFOLLOW, and checks that what it opened is still a regular file: a file
// swapped for a link is refused by the kernel, one swapped for a fifo or device is seen
// and refused without blocking. The Entry returned is the open file's own (size, times).
type Opener func() (*os.File, Entry, error)

// ErrChanged: the entry is no longer a regular file (or is gone) when opened.
var ErrChanged = errors.New("entry changed while being read")

type walker struct {
	ctx     context.Context
	opts    WalkOptions
	st      *WalkStats
	fn      func(Entry, Opener) error
	entries int
}

func (w *walker) admit(p string) bool {
	if len(p)+1 > w.opts.MaxNameLen { // +1: room for a trailing '/' in a tar export
		w.st.skip(p, fmt.Sprintf("its path is longer than %d bytes", w.opts.MaxNameLen))
		return false
	}
	if w.entries >= w.opts.MaxEntries {
		w.st.skip(p, fmt.Sprintf("the snapshot already holds %d entries, the most a restore accepts", w.opts.MaxEntries))
		return false
	}
	w.entries++
	return true
}
