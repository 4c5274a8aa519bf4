package envd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

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

	contentGzip = "application/gzip"
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

func (s *Server) handleArchive(w http.ResponseWriter, r *http.Request) {
	var excludes []string
	if q := r.URL.Query(); q.Has(QueryExcludes) {
		excludes = []string{}
		if err := json.Unmarshal([]byte(q.Get(QueryExcludes)), &excludes); err != nil {
			s.filesError(w, http.StatusBadRequest, badArg("%s: want a JSON array of names: %v", QueryExcludes, err))
			return
		}
	}
	w.Header().Set("Trailer", TrailerArchive)
	w.Header().Set("Content-Type", contentGzip)
	w.WriteHeader(http.StatusOK)
	st, err := archive.Pack(r.Context(), w, s.cfg.Workspace, archive.PackOptions{Excludes: excludes})
	res := ArchiveResult{Files: st.Files, Dirs: st.Dirs, Symlinks: st.Symlinks, Skipped: st.Skipped,
		Bytes: st.BytesIn, Millis: st.Duration.Milliseconds()}
	for _, sk := range st.Skips[:min(len(st.Skips), MaxTrailerSkips)] {
		if len(sk.Path) > MaxTrailerSkipName {
			sk.Path = sk.Path[:MaxTrailerSkipName] + "..."
		}
		res.Skips = append(res.Skips, sk)
	}
	if err != nil {
		res.Error = err.Error()
	}
	b, _ := json.Marshal(res)
	w.Header().Set(TrailerArchive, string(b))
}

func (s *Server) handleExtract(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	st, err := archive.Extract(r.Context(), r.Body, s.cfg.Workspace, archive.ExtractOptions{})
	if err != nil {
		s.filesError(w, http.StatusBadRequest, fmt.Errorf("extract into the workspace: %w", err))
		return
	}
	w.Header().Set("Content-Type", contentJSON)
	_ = json.NewEncoder(w).Encode(ArchiveResult{Files: st.Files, Dirs: st.Dirs, Symlinks: st.Symlinks,
		Bytes: st.Bytes, Millis: time.Since(start).Milliseconds()})
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

// Archive has the agent pack the workspace inside the sandbox (leaving out excludes; nil
// means archive.DefaultExcludes) and copies the tar.gz to w. On error what reached w is
// incomplete and must be discarded: an archive counts only when the agent's trailer says it
// finished.
func (c *Client) Archive(ctx context.Context, w io.Writer, excludes []string) (ArchiveResult, error) {
	q := url.Values{}
	if excludes != nil {
		b, _ := json.Marshal(excludes)
		q.Set(QueryExcludes, string(b))
	}
	req, err := c.newRequest(ctx, http.MethodGet, PathArchive, q, nil)
	if err != nil {
		return ArchiveResult{}, fmt.Errorf("archive the workspace: %w", err)
	}
	resp, err := c.call(req)
	if err != nil {
		return ArchiveResult{}, fmt.Errorf("archive the workspace: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return ArchiveResult{}, fmt.Errorf("archive the workspace: %w", readError(resp))
	}
	n, err := io.Copy(w, io.LimitReader(resp.Body, MaxArchiveBytes+1))
	if err != nil {
		return ArchiveResult{}, fmt.Errorf("archive the workspace: after %d bytes: %w", n, c.streamErr(err))
	}
	if n > MaxArchiveBytes {
		return ArchiveResult{}, fmt.Errorf("archive the workspace: more than %d bytes: %w", int64(MaxArchiveBytes), sandbox.ErrTooLarge)
	}
	var res ArchiveResult
	t := resp.Trailer.Get(TrailerArchive)
	if t == "" || len(t) > 64<<10 || json.Unmarshal([]byte(t), &res) != nil {
		return ArchiveResult{}, fmt.Errorf("archive the workspace: the agent did not finish the archive (%d bytes, no valid trailer)", n)
	}
	if res.Error != "" {
		return res, fmt.Errorf("archive the workspace: the agent failed: %s", res.Error)
	}
	return res, nil
}

// Extract has the agent unpack a tar.gz read from r into the workspace, which must be
// empty; the agent refuses entries that would land outside it as archive.Extract does.
func (c *Client) Extract(ctx context.Context, r io.Reader) (ArchiveResult, error) {
	req, err := c.newRequest(ctx, http.MethodPost, PathExtract, nil, io.NopCloser(r))
	if err != nil {
		return ArchiveResult{}, fmt.Errorf("extract into the workspace: %w", err)
	}
	req.Header.Set("Content-Type", contentGzip)
	resp, err := c.call(req)
	if err != nil {
		return ArchiveResult{}, fmt.Errorf("extract into the workspace: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return ArchiveResult{}, fmt.Errorf("extract into the workspace: %w", readError(resp))
	}
	var res ArchiveResult
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&res); err != nil {
		return ArchiveResult{}, fmt.Errorf("extract into the workspace: decode the agent's answer: %w", c.streamErr(err))
	}
	return res, nil
}
