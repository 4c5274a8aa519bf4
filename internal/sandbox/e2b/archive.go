package e2b

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/archive"
	"github.com/toolhost/toolhost/internal/envd"
)

// The workspace as one tar.gz, packed and unpacked inside the sandbox by GNU tar (E2B's
// envd has no archive endpoint), with the archive's file in the sandbox's /tmp and moved
// through envd's /files as a stream.
//
// Pack: tar reads the workspace from the sandbox's own view and stores links as links,
// uncompressed. What it wrote is the sandbox's word, so on its way to w it goes through
// archive.Filter, which leaves out what a restore would refuse (links out of the
// workspace, FIFOs, ...) and reports it: every snapshot saved restores, as with the
// local provider. The filter rebuilds and compresses the archive anyway (pgzip, every
// core of the host), so the sandbox does not compress: its single-threaded gzip -1 was
// the whole cost (50 MB on the fake: 13-15x the local archive with gzip -1 in the
// sandbox, 1.1-1.7x without; on a 100 Mbit/s link the uncompressed transfer was faster
// for a tree that hardly compresses and about even for one that compresses 4.5x;
// docs/BENCHMARKS.md, issue 18). Where the sandbox's /tmp cannot hold the workspace
// uncompressed, the sandbox compresses after all (packScript).
//
// Unpack: the archive is hostile input (a snapshot store is not a trusted party, and the
// snapshot was packed from an earlier sandbox). archive.Filter judges it on the host by
// Extract's own rules, strictly: one entry Extract would refuse (.., an absolute name, a
// link out, a link or file in the way of a later entry, a device or FIFO, too many
// entries or bytes) refuses the whole archive, and nothing is extracted. What goes into
// the sandbox is the filter's rebuild, plain entries only, so GNU tar there cannot read
// it differently from the way it was judged. tar then runs with --no-same-owner (a root
// user in a template makes files its own, never another's), --same-permissions (the
// modes the filter already stripped of setuid bits, not the umask's), and
// --no-overwrite-dir (the workspace root keeps its own mode, as with Extract).

// tmpName names a file of the provider's in the sandbox's /tmp.
func tmpName(kind, ext string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "/tmp/toolhost-" + kind + "-" + hex.EncodeToString(b[:]) + ext
}

// packScript archives the workspace into $1 uncompressed, leaving out the names after
// it; the host compresses (see packInSandbox). When /tmp has no room for the workspace
// uncompressed (GNU tar says "Wrote only N of M bytes" on a full tmpfs, or ENOSPC's own
// message), it tries again with gzip -1 and says so ("gzip" on stdout): a sandbox
// that lies about it only makes the host's filter fail. GNU tar exits 1 when a file
// changed while it was read: the archive is still whole.
const packScript = `f=$1; shift; umask 077
err=$(tar -C ` + sandbox.WorkspaceRoot + ` -c -f "$f" --no-wildcards "$@" . 2>&1); rc=$?
case $rc:$err in [2-9]:*"No space left on device"* | [2-9]:*"Wrote only "*)
	rm -f "$f"; echo gzip
	err=$(tar -C ` + sandbox.WorkspaceRoot + ` -c -f "$f" -I 'gzip -1' --no-wildcards "$@" . 2>&1); rc=$?;;
esac
printf '%s' "$err" >&2
[ $rc -le 1 ] || exit $rc`

// packGzipScript is packScript compressing with gzip -1 in the sandbox.
const packGzipScript = `f=$1; shift; umask 077
tar -C ` + sandbox.WorkspaceRoot + ` -c -f "$f" -I 'gzip -1' --no-wildcards "$@" .
rc=$?; [ $rc -le 1 ] || exit $rc`

// packInSandbox makes Archive compress in the sandbox (gzip -1, the former way) instead
// of on the host; only the benchmarks that compare the two set it (export_test.go).
var packInSandbox = false

// maxPlainArchive bounds an uncompressed archive's download: the filter's own bound on
// file contents plus a KiB of headers and padding for each entry it allows.
const maxPlainArchive = envd.MaxArchiveBytes + archive.DefaultMaxEntries<<10

// Archive writes the workspace to w as one tar.gz, leaving out excludes (nil: the
// archive defaults).
func (s *Sandbox) Archive(ctx context.Context, w io.Writer, excludes []string) error {
	if err := s.closedErr(); err != nil {
		return err
	}
	if excludes == nil {
		excludes = archive.DefaultExcludes
	}
	began := time.Now()
	tmp := tmpName("archive", ".tar")
	defer s.removeTmp(ctx, tmp)
	script, limit := packScript, int64(maxPlainArchive)
	if packInSandbox {
		script, limit = packGzipScript, envd.MaxArchiveBytes
	}
	argv := []string{"/bin/sh", "-c", script, "sh", tmp}
	for _, x := range excludes {
		argv = append(argv, "--exclude="+x)
	}
	res, err := s.client.Exec(ctx, sandbox.ExecRequest{Argv: argv, MaxOutputBytes: 16 << 10})
	if err != nil {
		return s.wrap(fmt.Errorf("archive E2B sandbox %s: run tar: %w", s.id, err))
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("archive E2B sandbox %s: tar exited %d: %s", s.id, res.ExitCode, bytes.TrimSpace(res.Stderr))
	}
	packed := time.Since(began)
	gzipped := packInSandbox
	if !gzipped && string(bytes.TrimSpace(res.Stdout)) == "gzip" {
		s.log.Debug("the sandbox's /tmp had no room for the workspace uncompressed: it compressed", "sandbox", s.id)
		gzipped, limit = true, envd.MaxArchiveBytes
	}

	// Download into the filter, which writes the cleaned archive to w.
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { // owned by Archive, which waits for it below
		_, err := s.client.Download(ctx, tmp, pw, limit)
		pw.CloseWithError(err)
		done <- err
	}()
	st, ferr := archive.Filter(ctx, w, pr, archive.FilterOptions{Plain: !gzipped})
	pr.CloseWithError(errors.New("archive filter stopped"))
	derr := <-done
	if derr != nil && (ferr == nil || !errors.Is(ferr, derr)) {
		return s.wrap(fmt.Errorf("archive E2B sandbox %s: download the archive: %w", s.id, derr))
	}
	if ferr != nil {
		return fmt.Errorf("archive E2B sandbox %s: %w", s.id, ferr)
	}
	if st.Skipped > 0 {
		s.log.Warn("snapshot leaves out what a restore would refuse", "skipped", st.Skipped, "first", st.Skips[0].Path, "why", st.Skips[0].Reason)
	}
	s.log.Debug("archived workspace", "files", st.Files, "bytes_in", st.Bytes, "bytes_out", st.BytesOut,
		"tar", packed, "total", time.Since(began))
	return nil
}

// extractScript unpacks $1 into the workspace.
const extractScript = `tar -C ` + sandbox.WorkspaceRoot + ` -x -z -f "$1" --no-same-owner --same-permissions --no-overwrite-dir`

// linksScript lists the symbolic links in the workspace, NUL-terminated, relative.
const linksScript = `find ` + sandbox.WorkspaceRoot + ` -mindepth 1 -type l -printf '%P\0'`

// errStopped ends the pipe between the filter and the upload when the upload ends first.
var errStopped = errors.New("the upload stopped")

// Extract unpacks a tar.gz into the workspace of a sandbox that nothing has run in or
// written to yet, after judging every entry by archive.Extract's rules on the host (see
// above). An E2B workspace starts with its template's files (dotfiles, or a project the
// template prepared): they are the workspace's "empty", and an entry that would land
// below one of their symbolic links is refused as well.
func (s *Sandbox) Extract(ctx context.Context, r io.Reader) error {
	if err := s.closedErr(); err != nil {
		return err
	}
	if s.touched.Swap(true) {
		return fmt.Errorf("extract into E2B sandbox %s: the workspace is in use (a command ran or a file was written): %w", s.id, archive.ErrNotEmpty)
	}
	began := time.Now()
	res, err := s.client.Exec(ctx, sandbox.ExecRequest{Argv: []string{"/bin/sh", "-c", linksScript}, MaxOutputBytes: 16 << 20})
	if err != nil {
		return s.wrap(fmt.Errorf("extract into E2B sandbox %s: list the template's links: %w", s.id, err))
	}
	var links []string
	for l := range bytes.SplitSeq(res.Stdout, []byte{0}) {
		if len(l) > 0 {
			links = append(links, string(l))
		}
	}
	tmp := tmpName("extract", ".tar.gz")
	defer s.removeTmp(ctx, tmp)

	pr, pw := io.Pipe()
	filtered := make(chan error, 1)
	var st archive.FilterStats
	go func() { // owned by Extract, which waits for it below
		var err error
		st, err = archive.Filter(ctx, pw, r, archive.FilterOptions{Strict: true, Level: 1, Links: links})
		pw.CloseWithError(err)
		filtered <- err
	}()
	uerr := s.client.Upload(ctx, tmp, pr, -1)
	pr.CloseWithError(errStopped)
	ferr := <-filtered
	switch {
	case errors.Is(ferr, archive.ErrUnsafe), errors.Is(ferr, archive.ErrTooLarge):
		return fmt.Errorf("extract into E2B sandbox %s: the archive was refused, nothing was extracted: %w", s.id, ferr)
	case uerr != nil:
		return s.wrap(fmt.Errorf("extract into E2B sandbox %s: upload the archive: %w", s.id, uerr))
	case ferr != nil:
		return fmt.Errorf("extract into E2B sandbox %s: read the archive: %w", s.id, ferr)
	}
	res, err = s.client.Exec(ctx, sandbox.ExecRequest{Argv: []string{"/bin/sh", "-c", extractScript, "sh", tmp}, MaxOutputBytes: 16 << 10})
	if err != nil {
		return s.wrap(fmt.Errorf("extract into E2B sandbox %s: run tar: %w", s.id, err))
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("extract into E2B sandbox %s: tar exited %d: %s", s.id, res.ExitCode, bytes.TrimSpace(res.Stderr))
	}
	s.log.Debug("extracted workspace", "files", st.Files, "bytes", st.Bytes, "took", time.Since(began))
	return nil
}

// removeTmp deletes a file of the provider's, even when ctx has ended.
func (s *Sandbox) removeTmp(ctx context.Context, p string) {
	if s.closedErr() != nil {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := s.client.RemovePath(rctx, p); err != nil {
		s.log.Debug("remove a temporary archive", "path", p, "err", err)
	}
}
