//go:build linux

package local

import (
	"context"
	"fmt"
	"github.com/toolhost/toolhost/internal/tree"
	"io"

	"github.com/toolhost/toolhost/core/sandbox"
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
func (s *Sandbox) ArchiveReport(ctx context.Context, w io.Writer, excludes []string) (sandbox.ArchiveReport, error) {
	if err := s.refused(); err != nil {
		return sandbox.ArchiveReport{}, err
	}
	res, err := s.client.Archive(ctx, w, excludes)
	if err != nil {
		return res.Report(), s.wrap(fmt.Errorf("archive sandbox %s: %w", s.id, err))
	}
	s.log.Debug("archived workspace", "files", res.Files, "skipped", res.Skipped, "bytes_in", res.Bytes, "ms", res.Millis)
	return res.Report(), nil
}

// Processes lists the background processes that still run (sandbox.ProcessLister).
func (s *Sandbox) Processes(ctx context.Context) ([]sandbox.ProcessInfo, error) {
	if err := s.refused(); err != nil {
		return nil, err
	}
	procs, err := s.client.BackgroundProcesses(ctx)
	if err != nil {
		return nil, s.wrap(fmt.Errorf("list processes of sandbox %s: %w", s.id, err))
	}
	return procs, nil
}

// Extract has the agent unpack a tar.gz into the (empty) workspace, inside the sandbox: the
// files are the sandbox user's, within its disk limit, and an entry that would land
// outside the workspace is refused (archive.Extract).
func (s *Sandbox) Extract(ctx context.Context, r io.Reader) error {
	if err := s.refused(); err != nil {
		return err
	}
	res, err := s.client.Extract(ctx, r)
	if err != nil {
		return s.wrap(fmt.Errorf("extract into sandbox %s: %w", s.id, err))
	}
	s.log.Debug("extracted workspace", "files", res.Files, "bytes", res.Bytes, "ms", res.Millis)
	return nil
}

// TreeList has the agent list the workspace from the sandbox's own view (tree.Source): a
// chunked save lists first and reads only what changed.
func (s *Sandbox) TreeList(ctx context.Context, excludes []string) ([]tree.Entry, tree.WalkStats, error) {
	if err := s.refused(); err != nil {
		return nil, tree.WalkStats{}, err
	}
	es, st, err := s.client.TreeList(ctx, excludes)
	if err != nil {
		return nil, st, s.wrap(fmt.Errorf("list sandbox %s: %w", s.id, err))
	}
	return es, st, nil
}

// TreeRead has the agent read files of the workspace (tree.Source).
func (s *Sandbox) TreeRead(ctx context.Context, paths []string, fn func(tree.Entry, io.Reader) error) error {
	if err := s.refused(); err != nil {
		return err
	}
	if err := s.client.TreeRead(ctx, paths, fn); err != nil {
		return s.wrap(fmt.Errorf("read sandbox %s: %w", s.id, err))
	}
	return nil
}

var _ tree.Source = (*Sandbox)(nil)
