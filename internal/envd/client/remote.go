package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/envd"
)

// What a provider needs beyond the Sandbox interface when the agent is not ours (E2B's
// envd has no /toolhost endpoints): streamed transfers of its own files (archives in
// /tmp), raw file facts, and processes' listening ports read from /proc. The paths here
// are the provider's, used as given; tool paths go through ReadFile and WriteFile, which
// keep to the workspace.

// Download streams the file at the absolute path p to w without holding it in memory. A
// file bigger than maxBytes (when > 0) gives sandbox.ErrTooLarge; with a size known up
// front, before any byte is copied. It returns the bytes copied.
func (c *Client) Download(ctx context.Context, p string, w io.Writer, maxBytes int64) (int64, error) {
	if !path.IsAbs(p) {
		return 0, fmt.Errorf("download %s: not an absolute path", p)
	}
	q := url.Values{"path": {p}}
	req, err := c.newRequest(ctx, http.MethodGet, envd.PathFiles, q, nil)
	if err != nil {
		return 0, fmt.Errorf("download %s: %w", p, err)
	}
	resp, err := c.call(req)
	if err != nil {
		return 0, fmt.Errorf("download %s: %w", p, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("download %s: %w", p, readError(resp))
	}
	if maxBytes > 0 && resp.ContentLength > maxBytes {
		return 0, fmt.Errorf("download %s: %d bytes, limit %d: %w", p, resp.ContentLength, maxBytes, sandbox.ErrTooLarge)
	}
	r := io.Reader(resp.Body)
	if maxBytes > 0 {
		r = io.LimitReader(r, maxBytes+1)
	}
	n, err := io.Copy(w, r)
	if err != nil {
		return n, fmt.Errorf("download %s: after %d bytes: %w", p, n, c.streamErr(err))
	}
	if maxBytes > 0 && n > maxBytes {
		return n, fmt.Errorf("download %s: more than %d bytes: %w", p, maxBytes, sandbox.ErrTooLarge)
	}
	if resp.ContentLength >= 0 && n != resp.ContentLength {
		return n, fmt.Errorf("download %s: %d of %d bytes: %w", p, n, resp.ContentLength, io.ErrUnexpectedEOF)
	}
	return n, nil
}

// Upload streams r into the file at the absolute path p (created with its parents, or
// replaced), as one application/octet-stream POST /files (envd >= 0.5.7). size is r's
// length when known, else -1.
func (c *Client) Upload(ctx context.Context, p string, r io.Reader, size int64) error {
	if !path.IsAbs(p) {
		return fmt.Errorf("upload %s: not an absolute path", p)
	}
	req, err := c.newRequest(ctx, http.MethodPost, envd.PathFiles, url.Values{"path": {p}}, io.NopCloser(r))
	if err != nil {
		return fmt.Errorf("upload %s: %w", p, err)
	}
	req.Header.Set("Content-Type", envd.ContentOctet)
	if size >= 0 {
		req.ContentLength = size
		if size == 0 {
			req.Body = http.NoBody
		}
	}
	resp, err := c.call(req)
	if err != nil {
		return fmt.Errorf("upload %s: %w", p, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("upload %s: %w", p, readError(resp))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return nil
}

// StatEntry describes the absolute path p as the agent sees it, without following a final
// symbolic link (SymlinkTarget is set for one).
func (c *Client) StatEntry(ctx context.Context, p string) (envd.EntryInfo, error) {
	var out envd.EntryResponse
	if err := c.unary(ctx, envd.PathFilesystemStat, envd.PathRequest{Path: p}, &out); err != nil {
		return envd.EntryInfo{}, fmt.Errorf("stat %s: %w", p, err)
	}
	return out.Entry, nil
}

// RemovePath deletes the absolute path p recursively (the provider's own files); a
// missing path is not an error.
func (c *Client) RemovePath(ctx context.Context, p string) error {
	if !path.IsAbs(p) || p == "/" || p == sandbox.WorkspaceRoot {
		return fmt.Errorf("remove %s: refused", p)
	}
	var out envd.Empty
	if err := c.unary(ctx, envd.PathFilesystemRm, envd.PathRequest{Path: p}, &out); err != nil {
		return fmt.Errorf("remove %s: %w", p, err)
	}
	return nil
}
