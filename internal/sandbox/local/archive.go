//go:build linux

package local

import (
	"context"
	"fmt"
	"io"

	"github.com/toolhost/toolhost/internal/envd"
)

// Archive has the agent pack the workspace inside the sandbox and streams it to w. Packing
// from the sandbox's own view is what makes a snapshot safe: a symbolic link the sandbox
// made can only lead to what the sandbox could read itself, whatever it swaps while the
// archive is being made. The stream is the sandbox's word, bounded (envd.MaxArchiveBytes)
// and checked again when it is restored.
func (s *Sandbox) Archive(ctx context.Context, w io.Writer, excludes []string) error {
	_, err := s.ArchiveReport(ctx, w, excludes)
	return err
}

// ArchiveReport is Archive that also returns the agent's report: what it packed and what
// it left out because a snapshot cannot hold it (the sandbox's word: names are hostile).
func (s *Sandbox) ArchiveReport(ctx context.Context, w io.Writer, excludes []string) (envd.ArchiveResult, error) {
	if err := s.closedErr(); err != nil {
		return envd.ArchiveResult{}, err
	}
	res, err := s.client.Archive(ctx, w, excludes)
	if err != nil {
		return res, s.wrap(fmt.Errorf("archive sandbox %s: %w", s.id, err))
	}
	s.log.Debug("archived workspace", "files", res.Files, "skipped", res.Skipped, "bytes_in", res.Bytes, "ms", res.Millis)
	return res, nil
}

// Extract has the agent unpack a tar.gz into the (empty) workspace, inside the sandbox: the
// files are the sandbox user's, within its disk limit, and an entry that would land
// outside the workspace is refused (archive.Extract).
func (s *Sandbox) Extract(ctx context.Context, r io.Reader) error {
	if err := s.closedErr(); err != nil {
		return err
	}
	res, err := s.client.Extract(ctx, r)
	if err != nil {
		return s.wrap(fmt.Errorf("extract into sandbox %s: %w", s.id, err))
	}
	s.log.Debug("extracted workspace", "files", res.Files, "bytes", res.Bytes, "ms", res.Millis)
	return nil
}
