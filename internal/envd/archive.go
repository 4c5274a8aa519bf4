package envd

import (
	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/archive"
)

// The workspace as one tar.gz, packed and unpacked inside the sandbox: the agent sees the
// sandbox's own view of the files, so a symbolic link the sandbox made can only ever lead to
// what the sandbox could read itself, never to a file of the host. Providers whose
// workspaces live on the host use these instead of touching the tree from outside.
const (
	PathArchive = "/toolhost/archive"
	PathExtract = "/toolhost/extract"

	// QueryExcludes carries the base names to leave out as a JSON array of strings;
	// absent means archive.DefaultExcludes, [] means none.
	QueryExcludes = "excludes"
	// TrailerArchive is the HTTP trailer of an archive response: ArchiveResult as JSON.
	// A response without it, or with Error set, is incomplete and must be discarded.
	TrailerArchive = "Toolhost-Archive"

	ContentGzip = "application/gzip"
)

// ArchiveResult reports a pack (in the TrailerArchive trailer) or an extract (the body of
// the response to PathExtract).
type ArchiveResult struct {
	Files    int    `json:"files"`
	Dirs     int    `json:"dirs"`
	Symlinks int    `json:"symlinks,omitempty"`
	Skipped  int    `json:"skipped,omitempty"`
	Bytes    int64  `json:"bytes"`
	Error    string `json:"error,omitempty"`
	Millis   int64  `json:"ms"`
	// Skips names the first entries a pack left out and why (at most MaxTrailerSkips,
	// names cut to MaxTrailerSkipName bytes). Sandbox-written names: quote them.
	Skips []archive.Skip `json:"skips,omitempty"`
}

// Bounds of ArchiveResult.Skips, which keep the trailer far below the client's 64 KiB.
const (
	MaxTrailerSkips    = 20
	MaxTrailerSkipName = 256
)

// MaxArchiveBytes bounds the archive Client.Archive accepts from an agent: an agent is
// inside the sandbox, so what it sends is hostile input, and an endless stream must not
// fill the host's disk. It matches archive.DefaultMaxBytes, the most a restore extracts.
const MaxArchiveBytes = archive.DefaultMaxBytes

// The workspace as a tree, listed and read from the sandbox's own view (see internal/tree):
// a chunked save lists it, then reads only the files whose size or times changed.
const (
	// PathTreeList answers a listing of the workspace (tree's wire form), leaving out
	// QueryExcludes; its TrailerTree says how it ended.
	PathTreeList = "/toolhost/tree/list"
	// PathTreeRead takes NUL-separated paths in its body and answers their contents.
	PathTreeRead = "/toolhost/tree/read"
	// TrailerTree is a TreeResult as JSON; without it a listing or read is incomplete.
	TrailerTree = "Toolhost-Tree"
	// MaxTreeReadBody bounds a read's list of paths.
	MaxTreeReadBody = 64 << 20
)

// TreeResult is the trailer of a listing or a read.
type TreeResult struct {
	Files    int            `json:"files"`
	Dirs     int            `json:"dirs"`
	Symlinks int            `json:"symlinks,omitempty"`
	Skipped  int            `json:"skipped,omitempty"`
	Bytes    int64          `json:"bytes"`
	Skips    []archive.Skip `json:"skips,omitempty"`
	Error    string         `json:"error,omitempty"`
}

// Report is the sandbox interface's report of a pack.
func (r ArchiveResult) Report() sandbox.ArchiveReport {
	out := sandbox.ArchiveReport{Files: r.Files, Dirs: r.Dirs, Symlinks: r.Symlinks, Bytes: r.Bytes, Skipped: r.Skipped}
	for _, s := range r.Skips {
		out.Skips = append(out.Skips, sandbox.ArchiveSkip{Path: s.Path, Reason: s.Reason})
	}
	return out
}
