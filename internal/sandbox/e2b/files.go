package e2b

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/envd"
)

// File tools keep to the workspace. E2B's envd follows every symbolic link and opens
// anything, a FIFO included (an open that waits for a writer). So before a file is read
// or written, the provider looks at each component of its path (one Stat per component,
// all at once: one round trip), follows the links on the way itself, each of which must
// stay in the workspace, and hands envd the path without links; a FIFO, socket or
// device is refused before anything opens it. The sandbox could swap a component between
// the look and the open; that would only reach the sandbox's own files, never the
// host's: this is the workspace rule of the file tools, the wall is E2B's microVM.

const maxLinkHops = 16

// E2B's envd describes a symbolic link by its target: the type is the target's (or
// unspecified when it leads nowhere), symlinkTarget the target's fully resolved path (or
// the link's own path when it cannot be resolved), and the permissions string starts
// with "L". FIFOs, sockets and devices have an unspecified type. Our agent gives a link
// the symlink type and its target as written; both are understood here.

func isType(e envd.EntryInfo, name, num string) bool {
	return string(e.Type) == name || string(e.Type) == num
}

func isLink(e envd.EntryInfo) bool {
	return e.SymlinkTarget != nil || isType(e, envd.FileTypeSymlink, "3") || strings.HasPrefix(e.Permissions, "L")
}

func isDir(e envd.EntryInfo) bool { return !isLink(e) && isType(e, envd.FileTypeDir, "2") }

// isRegular: a regular file, not a link, FIFO, socket or device (the mode's type bits,
// which our agent sends, tell those apart too).
func isRegular(e envd.EntryInfo) bool {
	return !isLink(e) && isType(e, envd.FileTypeFile, "1") &&
		fs.FileMode(e.Mode)&(fs.ModeNamedPipe|fs.ModeSocket|fs.ModeDevice|fs.ModeCharDevice|fs.ModeIrregular) == 0 &&
		(e.Permissions == "" || e.Permissions[0] == '-')
}

func inWorkspace(p string) bool {
	return p == sandbox.WorkspaceRoot || strings.HasPrefix(p, sandbox.WorkspaceRoot+"/")
}

// resolve follows the symbolic links on the way to abs (a path Resolve accepted), and the
// final one too when final is set, each of which must lead to a path in the workspace. It
// returns the path without links and the entry there (nil when nothing is there; its
// missing parents are then created by a write).
func (s *Sandbox) resolve(ctx context.Context, abs string, final bool) (string, *envd.EntryInfo, error) {
	for hops := 0; ; {
		rel := sandbox.Rel(abs)
		var prefixes []string
		if rel == "." {
			prefixes = []string{sandbox.WorkspaceRoot}
		} else {
			comps := strings.Split(rel, "/")
			for i := range comps {
				prefixes = append(prefixes, path.Join(sandbox.WorkspaceRoot, path.Join(comps[:i+1]...)))
			}
		}
		entries := make([]envd.EntryInfo, len(prefixes))
		errs := make([]error, len(prefixes))
		var wg sync.WaitGroup
		for i, p := range prefixes {
			wg.Go(func() { entries[i], errs[i] = s.client.StatEntry(ctx, p) })
		}
		wg.Wait()
		next := ""
		for i, p := range prefixes {
			if errors.Is(errs[i], sandbox.ErrNotFound) {
				return abs, nil, nil
			}
			if errs[i] != nil {
				return "", nil, s.wrap(errs[i])
			}
			e := entries[i]
			last := i == len(prefixes)-1
			if isLink(e) && (final || !last) {
				if hops++; hops > maxLinkHops {
					return "", nil, fmt.Errorf("more than %d symbolic links: %w", maxLinkHops, sandbox.ErrOutside)
				}
				if e.SymlinkTarget == nil {
					return "", nil, fmt.Errorf("symbolic link %s: its target is not known", p)
				}
				t := *e.SymlinkTarget
				if t == p {
					return "", nil, fmt.Errorf("symbolic link %s leads to nothing that exists, so where it points cannot be checked: %w", sandbox.Rel(p), sandbox.ErrNotFound)
				}
				if !path.IsAbs(t) {
					t = path.Join(path.Dir(p), t)
				}
				t = path.Clean(t)
				if !inWorkspace(t) {
					return "", nil, fmt.Errorf("symbolic link %s points to %s, outside the workspace: %w", sandbox.Rel(p), *e.SymlinkTarget, sandbox.ErrOutside)
				}
				next = path.Join(t, strings.TrimPrefix(abs, p))
				break
			}
			if !last && !isDir(e) {
				return "", nil, fmt.Errorf("%s is not a directory: %w", sandbox.Rel(p), sandbox.ErrNotDir)
			}
			if last {
				return abs, &e, nil
			}
		}
		abs = next
	}
}

// ReadFile reads a workspace file; one bigger than maxBytes (when > 0) gives ErrTooLarge
// without being transferred.
func (s *Sandbox) ReadFile(ctx context.Context, p string, maxBytes int64) ([]byte, error) {
	if err := s.closedErr(); err != nil {
		return nil, err
	}
	abs, err := sandbox.Resolve(p)
	if err != nil {
		return nil, fmt.Errorf("read file: %w", err)
	}
	real, e, err := s.resolve(ctx, abs, true)
	switch {
	case err != nil:
		return nil, fmt.Errorf("read file %s: %w", p, err)
	case e == nil:
		return nil, fmt.Errorf("read file %s: %w", p, sandbox.ErrNotFound)
	case isDir(*e):
		return nil, fmt.Errorf("read file %s: %w", p, sandbox.ErrIsDir)
	case !isRegular(*e):
		return nil, fmt.Errorf("read file %s: %w", p, sandbox.ErrNotRegular)
	case maxBytes > 0 && int64(e.Size) > maxBytes:
		return nil, fmt.Errorf("read file %s: %d bytes, limit %d: %w", p, e.Size, maxBytes, sandbox.ErrTooLarge)
	}
	b, err := s.client.ReadFile(ctx, real, maxBytes)
	return b, s.wrap(err)
}

// WriteFile creates or replaces a workspace file, creating its parent directories. A
// symbolic link in the workspace is written through (its target replaced), as locally.
func (s *Sandbox) WriteFile(ctx context.Context, p string, data []byte) error {
	if err := s.closedErr(); err != nil {
		return err
	}
	abs, err := sandbox.Resolve(p)
	if err != nil {
		return fmt.Errorf("write file: %w", err)
	}
	if abs == sandbox.WorkspaceRoot {
		return fmt.Errorf("write file %s: %w", p, sandbox.ErrIsDir)
	}
	real, e, err := s.resolve(ctx, abs, true)
	switch {
	case err != nil:
		return fmt.Errorf("write file %s: %w", p, err)
	case e != nil && isDir(*e):
		return fmt.Errorf("write file %s: %w", p, sandbox.ErrIsDir)
	case e != nil && !isRegular(*e):
		return fmt.Errorf("write file %s: %w", p, sandbox.ErrNotRegular)
	}
	s.touched.Store(true)
	return s.wrap(s.client.WriteFile(ctx, real, data))
}

// Stat describes a workspace path without following a final symbolic link.
func (s *Sandbox) Stat(ctx context.Context, p string) (sandbox.FileInfo, error) {
	if err := s.closedErr(); err != nil {
		return sandbox.FileInfo{}, err
	}
	abs, err := sandbox.Resolve(p)
	if err != nil {
		return sandbox.FileInfo{}, fmt.Errorf("stat: %w", err)
	}
	_, e, err := s.resolve(ctx, abs, false)
	switch {
	case err != nil:
		return sandbox.FileInfo{}, fmt.Errorf("stat %s: %w", p, err)
	case e == nil:
		return sandbox.FileInfo{}, fmt.Errorf("stat %s: %w", p, sandbox.ErrNotFound)
	}
	fi := envd.FileInfo(*e, p)
	if isLink(*e) {
		fi.Mode, fi.Size = fs.ModeSymlink|0o777, int64(len(valueOr(e.SymlinkTarget)))
	}
	return fi, nil
}

func valueOr(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// List returns the entries below a workspace directory, sorted by path, never following
// symbolic links below it. It runs find(1) in the sandbox: envd's ListDir describes a
// link by its target, and would walk all of node_modules only for Skip to drop it.
func (s *Sandbox) List(ctx context.Context, lr sandbox.ListRequest) (sandbox.ListResult, error) {
	if err := s.closedErr(); err != nil {
		return sandbox.ListResult{}, err
	}
	abs, err := sandbox.Resolve(lr.Path)
	if err != nil {
		return sandbox.ListResult{}, fmt.Errorf("list: %w", err)
	}
	real, e, err := s.resolve(ctx, abs, true)
	switch {
	case err != nil:
		return sandbox.ListResult{}, fmt.Errorf("list %s: %w", lr.Path, err)
	case e == nil:
		return sandbox.ListResult{}, fmt.Errorf("list %s: %w", lr.Path, sandbox.ErrNotFound)
	case !isDir(*e):
		return sandbox.ListResult{}, fmt.Errorf("list %s: %w", lr.Path, sandbox.ErrNotDir)
	}
	return s.find(ctx, real, lr)
}

// findFormat prints one entry: type letter, octal permissions, size, mtime, path
// relative to the start, NUL-terminated (names may hold newlines).
const findFormat = `%y %m %s %T@ %P\0`

// maxListOutput bounds what a listing may print, and so what the host holds of it (about
// 400,000 entries): the listing is the sandbox's word.
const maxListOutput = 32 << 20

func (s *Sandbox) find(ctx context.Context, dir string, lr sandbox.ListRequest) (sandbox.ListResult, error) {
	args := []string{dir, "-mindepth", "1"}
	if !lr.Recursive {
		args = append(args, "-maxdepth", "1")
	}
	if len(lr.Skip) > 0 {
		args = append(args, "(", "-type", "d", "(")
		for i, name := range lr.Skip {
			if i > 0 {
				args = append(args, "-o")
			}
			args = append(args, "-name", globEscape(name))
		}
		args = append(args, ")", "-printf", findFormat, "-prune", ")", "-o")
	}
	args = append(args, "-printf", findFormat)
	argv := append([]string{"find"}, args...)
	if lr.Limit > 0 {
		// One more than the limit tells a cut listing from one that just fits.
		// Sorted by path (the fifth field) before the cut, as the listing is.
		script := `find "$@" | LC_ALL=C sort -z -t ' ' -k5 | head -z -n ` + strconv.Itoa(lr.Limit+1)
		argv = append([]string{"/bin/sh", "-c", script, "sh"}, args...)
	}
	res, err := s.client.Exec(ctx, sandbox.ExecRequest{Argv: argv, MaxOutputBytes: maxListOutput})
	if err != nil {
		return sandbox.ListResult{}, s.wrap(fmt.Errorf("list %s: %w", lr.Path, err))
	}
	if res.StdoutCut > 0 {
		return sandbox.ListResult{}, fmt.Errorf("list %s: more than %d bytes of entries; list a smaller directory or set a limit: %w", lr.Path, maxListOutput, sandbox.ErrTooLarge)
	}
	if res.ExitCode != 0 && len(res.Stdout) == 0 {
		return sandbox.ListResult{}, fmt.Errorf("list %s: find exited %d: %s", lr.Path, res.ExitCode, bytes.TrimSpace(res.Stderr))
	}
	out := sandbox.ListResult{}
	for rec := range bytes.SplitSeq(res.Stdout, []byte{0}) {
		if len(rec) == 0 {
			continue
		}
		fi, ok := parseFindRecord(string(rec))
		if ok {
			out.Entries = append(out.Entries, fi)
		}
	}
	slices.SortFunc(out.Entries, func(a, b sandbox.FileInfo) int { return strings.Compare(a.Path, b.Path) })
	if lr.Limit > 0 && len(out.Entries) > lr.Limit {
		out.Entries, out.Truncated = out.Entries[:lr.Limit], true
	}
	return out, nil
}

// parseFindRecord reads one findFormat record.
func parseFindRecord(rec string) (sandbox.FileInfo, bool) {
	f := strings.SplitN(rec, " ", 5)
	if len(f) != 5 || f[4] == "" {
		return sandbox.FileInfo{}, false
	}
	perm, err := strconv.ParseUint(f[1], 8, 32)
	if err != nil {
		return sandbox.FileInfo{}, false
	}
	size, _ := strconv.ParseInt(f[2], 10, 64)
	mode := fs.FileMode(perm) & fs.ModePerm
	if perm&0o4000 != 0 {
		mode |= fs.ModeSetuid
	}
	if perm&0o2000 != 0 {
		mode |= fs.ModeSetgid
	}
	if perm&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	switch f[0] {
	case "d":
		mode |= fs.ModeDir
	case "l":
		mode |= fs.ModeSymlink
	case "p":
		mode |= fs.ModeNamedPipe
	case "s":
		mode |= fs.ModeSocket
	case "c":
		mode |= fs.ModeDevice | fs.ModeCharDevice
	case "b":
		mode |= fs.ModeDevice
	}
	var mt time.Time
	if secs, frac, ok := strings.Cut(f[3], "."); ok || secs != "" {
		sec, _ := strconv.ParseInt(secs, 10, 64)
		ns, _ := strconv.ParseInt((frac + "000000000")[:9], 10, 64)
		mt = time.Unix(sec, ns)
	}
	return sandbox.FileInfo{Path: f[4], Mode: mode, Size: size, ModTime: mt}, true
}

// globEscape makes a name match itself in find's -name.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
