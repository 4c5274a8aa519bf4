package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/toolhost/toolhost/internal/envd"
	"github.com/toolhost/toolhost/internal/tree"
)

// TreeList has the agent list the workspace from the sandbox's own view, leaving out
// excludes (nil: the defaults). What it answers is the sandbox's word: every entry is
// checked (tree.Check) and the listing bounded; a listing without the agent's trailer is
// incomplete and refused.
func (c *Client) TreeList(ctx context.Context, excludes []string) ([]tree.Entry, tree.WalkStats, error) {
	q := url.Values{}
	if excludes != nil {
		b, _ := json.Marshal(excludes)
		q.Set(envd.QueryExcludes, string(b))
	}
	req, err := c.newRequest(ctx, http.MethodGet, envd.PathTreeList, q, nil)
	if err != nil {
		return nil, tree.WalkStats{}, fmt.Errorf("list the workspace: %w", err)
	}
	resp, err := c.call(req)
	if err != nil {
		return nil, tree.WalkStats{}, fmt.Errorf("list the workspace: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, tree.WalkStats{}, fmt.Errorf("list the workspace: %w", readError(resp))
	}
	entries, err := tree.DecodeList(resp.Body, 0)
	if err != nil {
		return nil, tree.WalkStats{}, fmt.Errorf("list the workspace: %w", c.streamErr(err))
	}
	res, err := treeTrailer(resp)
	if err != nil {
		return nil, tree.WalkStats{}, fmt.Errorf("list the workspace: %w", err)
	}
	st := tree.WalkStats{Files: res.Files, Dirs: res.Dirs, Symlinks: res.Symlinks, Skipped: res.Skipped, Bytes: res.Bytes}
	st.Skips = append(st.Skips, res.Skips...)
	return entries, st, nil
}

func treeTrailer(resp *http.Response) (envd.TreeResult, error) {
	var res envd.TreeResult
	t := resp.Trailer.Get(envd.TrailerTree)
	if t == "" || len(t) > 64<<10 || json.Unmarshal([]byte(t), &res) != nil {
		return res, errors.New("the agent did not finish (no valid trailer)")
	}
	if res.Error != "" {
		return res, fmt.Errorf("the agent failed: %s", res.Error)
	}
	return res, nil
}

// TreeRead has the agent read the files at paths (in that order) and calls fn for each
// that is still a regular file, with exactly its size in bytes; a file the agent sends
// that was not asked for is refused.
func (c *Client) TreeRead(ctx context.Context, paths []string, fn func(tree.Entry, io.Reader) error) error {
	if len(paths) == 0 {
		return nil
	}
	body := tree.JoinPaths(paths)
	if len(body) > envd.MaxTreeReadBody {
		return fmt.Errorf("read the workspace: %d paths are too many for one read", len(paths))
	}
	req, err := c.newRequest(ctx, http.MethodPost, envd.PathTreeRead, nil, io.NopCloser(strings.NewReader(body)))
	if err != nil {
		return fmt.Errorf("read the workspace: %w", err)
	}
	resp, err := c.call(req)
	if err != nil {
		return fmt.Errorf("read the workspace: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("read the workspace: %w", readError(resp))
	}
	if err := tree.DecodeRead(resp.Body, paths, fn); err != nil {
		return fmt.Errorf("read the workspace: %w", c.streamErr(err))
	}
	if _, err := io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20)); err != nil {
		return fmt.Errorf("read the workspace: %w", c.streamErr(err))
	}
	if _, err := treeTrailer(resp); err != nil {
		return fmt.Errorf("read the workspace: %w", err)
	}
	return nil
}
