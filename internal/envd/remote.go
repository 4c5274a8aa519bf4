package envd

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"slices"

	"github.com/toolhost/toolhost/core/sandbox"
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
	req, err := c.newRequest(ctx, http.MethodGet, PathFiles, q, nil)
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
	req, err := c.newRequest(ctx, http.MethodPost, PathFiles, url.Values{"path": {p}}, io.NopCloser(r))
	if err != nil {
		return fmt.Errorf("upload %s: %w", p, err)
	}
	req.Header.Set("Content-Type", contentOctet)
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
func (c *Client) StatEntry(ctx context.Context, p string) (EntryInfo, error) {
	var out EntryResponse
	if err := c.unary(ctx, PathFilesystemStat, PathRequest{Path: p}, &out); err != nil {
		return EntryInfo{}, fmt.Errorf("stat %s: %w", p, err)
	}
	return out.Entry, nil
}

// FileInfo turns an entry into the Sandbox interface's description, named name.
func FileInfo(e EntryInfo, name string) sandbox.FileInfo { return fileInfo(e, name) }

// RemovePath deletes the absolute path p recursively (the provider's own files); a
// missing path is not an error.
func (c *Client) RemovePath(ctx context.Context, p string) error {
	if !path.IsAbs(p) || p == "/" || p == sandbox.WorkspaceRoot {
		return fmt.Errorf("remove %s: refused", p)
	}
	var out Empty
	if err := c.unary(ctx, PathFilesystemRm, PathRequest{Path: p}, &out); err != nil {
		return fmt.Errorf("remove %s: %w", p, err)
	}
	return nil
}

// ListeningPorts parses the kernel's TCP tables (the text of /proc/net/tcp and
// /proc/net/tcp6, as read inside a sandbox) and returns the ports in LISTEN state, sorted,
// with the addresses they are bound on. owner, when not nil, names the process holding a
// socket (by its inode); PID and Cmd are the lowest-numbered owner's. Dial is left empty.
func ListeningPorts(tcp, tcp6 []byte, owner func(inode uint64) (pid int, cmd string)) ([]ListeningPort, error) {
	var all []listenSocket
	for i, b := range [][]byte{tcp, tcp6} {
		if len(b) == 0 {
			continue
		}
		socks, err := parseTCPTable(b, i == 1)
		if err != nil {
			return nil, err
		}
		all = append(all, socks...)
	}
	byPort := map[int]*ListeningPort{}
	for _, s := range all {
		lp := byPort[s.port]
		if lp == nil {
			lp = &ListeningPort{Port: s.port}
			byPort[s.port] = lp
		}
		if a := s.addr.String(); !slices.Contains(lp.Addrs, a) {
			lp.Addrs = append(lp.Addrs, a)
		}
		if owner != nil {
			if pid, cmd := owner(s.inode); pid > 0 && (lp.PID == 0 || pid < lp.PID) {
				lp.PID, lp.Cmd = pid, cmd
			}
		}
	}
	out := make([]ListeningPort, 0, len(byPort))
	for _, lp := range byPort {
		slices.Sort(lp.Addrs)
		out = append(out, *lp)
	}
	slices.SortFunc(out, func(a, b ListeningPort) int { return a.Port - b.Port })
	return out, nil
}
