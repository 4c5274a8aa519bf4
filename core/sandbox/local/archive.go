package local

import (
	"context"
	"fmt"
	"io"

	"github.com/toolhost/toolhost/core/archive"
)

// Archive packs the workspace straight from its host directory: no process in the
// sandbox is involved, and the tree never crosses the agent's socket.
func (s *Sandbox) Archive(ctx context.Context, w io.Writer, excludes []string) error {
	if err := s.closedErr(); err != nil {
		return err
	}
	st, err := archive.Pack(ctx, w, s.workspace, archive.PackOptions{Excludes: excludes})
	if err != nil {
		return fmt.Errorf("archive sandbox %s: %w", s.id, err)
	}
	s.log.Debug("archived workspace", "sandbox", s.id, "files", st.Files, "bytes_in", st.BytesIn, "bytes_out", st.BytesOut, "took", st.Duration)
	return nil
}

// Extract unpacks into the workspace's host directory through archive.Extract, which
// refuses every entry that would land outside it.
func (s *Sandbox) Extract(ctx context.Context, r io.Reader) error {
	if err := s.closedErr(); err != nil {
		return err
	}
	st, err := archive.Extract(ctx, r, s.workspace, archive.ExtractOptions{})
	if err != nil {
		return fmt.Errorf("extract into sandbox %s: %w", s.id, err)
	}
	s.log.Debug("extracted workspace", "sandbox", s.id, "files", st.Files, "bytes", st.Bytes, "took", st.Duration)
	return nil
}
