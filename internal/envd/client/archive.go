package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/envd"
)

// Archive has the agent pack the workspace inside the sandbox (leaving out excludes; nil
// means archive.DefaultExcludes) and copies the tar.gz to w. On error what reached w is
// incomplete and must be discarded: an archive counts only when the agent's trailer says it
// finished.
func (c *Client) Archive(ctx context.Context, w io.Writer, excludes []string) (envd.ArchiveResult, error) {
	q := url.Values{}
	if excludes != nil {
		b, _ := json.Marshal(excludes)
		q.Set(envd.QueryExcludes, string(b))
	}
	req, err := c.newRequest(ctx, http.MethodGet, envd.PathArchive, q, nil)
	if err != nil {
		return envd.ArchiveResult{}, fmt.Errorf("archive the workspace: %w", err)
	}
	resp, err := c.call(req)
	if err != nil {
		return envd.ArchiveResult{}, fmt.Errorf("archive the workspace: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return envd.ArchiveResult{}, fmt.Errorf("archive the workspace: %w", readError(resp))
	}
	n, err := io.Copy(w, io.LimitReader(resp.Body, envd.MaxArchiveBytes+1))
	if err != nil {
		return envd.ArchiveResult{}, fmt.Errorf("archive the workspace: after %d bytes: %w", n, c.streamErr(err))
	}
	if n > envd.MaxArchiveBytes {
		return envd.ArchiveResult{}, fmt.Errorf("archive the workspace: more than %d bytes: %w", int64(envd.MaxArchiveBytes), sandbox.ErrTooLarge)
	}
	var res envd.ArchiveResult
	t := resp.Trailer.Get(envd.TrailerArchive)
	if t == "" || len(t) > 64<<10 || json.Unmarshal([]byte(t), &res) != nil {
		return envd.ArchiveResult{}, fmt.Errorf("archive the workspace: the agent did not finish the archive (%d bytes, no valid trailer)", n)
	}
	if res.Error != "" {
		return res, fmt.Errorf("archive the workspace: the agent failed: %s", res.Error)
	}
	return res, nil
}

// Extract has the agent unpack a tar.gz read from r into the workspace, which must be
// empty; the agent refuses entries that would land outside it as archive.Extract does.
func (c *Client) Extract(ctx context.Context, r io.Reader) (envd.ArchiveResult, error) {
	req, err := c.newRequest(ctx, http.MethodPost, envd.PathExtract, nil, io.NopCloser(r))
	if err != nil {
		return envd.ArchiveResult{}, fmt.Errorf("extract into the workspace: %w", err)
	}
	req.Header.Set("Content-Type", envd.ContentGzip)
	resp, err := c.call(req)
	if err != nil {
		return envd.ArchiveResult{}, fmt.Errorf("extract into the workspace: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return envd.ArchiveResult{}, fmt.Errorf("extract into the workspace: %w", readError(resp))
	}
	var res envd.ArchiveResult
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&res); err != nil {
		return envd.ArchiveResult{}, fmt.Errorf("extract into the workspace: decode the agent's answer: %w", c.streamErr(err))
	}
	return res, nil
}
