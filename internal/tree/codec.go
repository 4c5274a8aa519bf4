package tree

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
)

// The tree's wire form between the in-sandbox agent and the host: a listing (entries, no
// contents) and a read (the files asked for, each an entry and exactly its Size bytes).
// What comes from the agent is the sandbox's word: DecodeList and DecodeRead bound
// every length, check every entry (Check), and refuse a file that was not asked for.

// Source is a sandbox whose agent lists and reads its workspace from the sandbox's own
// view (an optional ability, found with sandbox.As): a save reads only what changed.
type Source interface {
	TreeList(ctx context.Context, excludes []string) ([]Entry, WalkStats, error)
	TreeRead(ctx context.Context, paths []string, fn func(Entry, io.Reader) error) error
}

const (
	frameFile byte = 1 // an entry, then Size bytes
	frameGone byte = 2 // a path that is no longer a regular file
)

// AppendEntry encodes e.
func AppendEntry(b []byte, e Entry) []byte {
	b = binary.AppendUvarint(b, uint64(len(e.Path)))
	b = append(b, e.Path...)
	b = append(b, byte(e.Type))
	b = binary.AppendUvarint(b, uint64(e.Mode))
	b = binary.AppendVarint(b, e.MTime)
	b = binary.AppendVarint(b, e.CTime)
	b = binary.AppendUvarint(b, e.Ino)
	b = binary.AppendUvarint(b, uint64(e.Size))
	b = binary.AppendUvarint(b, uint64(len(e.Target)))
	return append(b, e.Target...)
}

func readString(r *bufio.Reader, max int) (string, error) {
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return "", err
	}
	if n > uint64(max) {
		return "", fmt.Errorf("a name of %d bytes: %w", n, ErrUnsafe)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", err
	}
	return string(b), nil
}

// ReadEntry decodes one entry and checks it.
func ReadEntry(r *bufio.Reader) (Entry, error) {
	var e Entry
	var err error
	if e.Path, err = readString(r, DefaultMaxNameLen); err != nil {
		return e, err
	}
	t, err := r.ReadByte()
	if err != nil {
		return e, err
	}
	e.Type = Type(t)
	mode, err := binary.ReadUvarint(r)
	if err != nil {
		return e, err
	}
	e.Mode = fs.FileMode(mode)
	if e.MTime, err = binary.ReadVarint(r); err != nil {
		return e, err
	}
	if e.CTime, err = binary.ReadVarint(r); err != nil {
		return e, err
	}
	if e.Ino, err = binary.ReadUvarint(r); err != nil {
		return e, err
	}
	size, err := binary.ReadUvarint(r)
	if err != nil {
		return e, err
	}
	if size > DefaultMaxBytes {
		return e, fmt.Errorf("entry %q: %d bytes: %w", e.Path, size, ErrTooLarge)
	}
	e.Size = int64(size)
	if e.Target, err = readString(r, DefaultMaxNameLen); err != nil {
		return e, err
	}
	if err := Check(e, 0); err != nil {
		return e, err
	}
	return e, nil
}

// DecodeList reads a listing of at most maxEntries entries.
func DecodeList(r io.Reader, maxEntries int) ([]Entry, error) {
	if maxEntries <= 0 {
		maxEntries = DefaultMaxEntries
	}
	br := bufio.NewReaderSize(r, 256<<10)
	var out []Entry
	for {
		if _, err := br.Peek(1); err == io.EOF {
			return out, nil
		}
		e, err := ReadEntry(br)
		if err != nil {
			return nil, fmt.Errorf("listing after %d entries: %w", len(out), err)
		}
		if len(out) >= maxEntries {
			return nil, fmt.Errorf("listing of more than %d entries: %w", maxEntries, ErrTooLarge)
		}
		out = append(out, e)
	}
}

// WriteRead writes the read frames of paths in root (a Reader) to w.
func WriteRead(ctx context.Context, w io.Writer, rd *Reader, paths []string) error {
	bw := bufio.NewWriterSize(w, 256<<10)
	buf := make([]byte, 256<<10)
	var hdr []byte
	for _, p := range paths {
		if err := ctx.Err(); err != nil {
			return err
		}
		f, e, err := rd.Open(p)
		if err != nil {
			if !errors.Is(err, ErrChanged) && !errors.Is(err, ErrUnsafe) {
				// Unreadable: left out like a vanished file; the next save tries again.
			}
			hdr = append(binary.AppendUvarint(append(hdr[:0], frameGone), uint64(len(p))), p...)
			if _, err := bw.Write(hdr); err != nil {
				return err
			}
			continue
		}
		hdr = AppendEntry(append(hdr[:0], frameFile), e)
		_, err = bw.Write(hdr)
		if err == nil {
			// Exactly Size bytes, whatever the file does meanwhile: a shrunk file's tail is
			// zeros, a grown one is cut (its new size and times make the next save read it).
			var n int64
			n, err = io.CopyBuffer(bw, io.LimitReader(f, e.Size), buf)
			for err == nil && n < e.Size {
				k := min(int64(len(buf)), e.Size-n)
				clear(buf[:k])
				_, err = bw.Write(buf[:k])
				n += k
			}
		}
		f.Close()
		if err != nil {
			return err
		}
	}
	return bw.Flush()
}

// DecodeRead reads the frames of a read of paths (asked in that order) and calls fn for
// each file with its contents; a file not asked for, or out of order, is refused.
func DecodeRead(r io.Reader, paths []string, fn func(Entry, io.Reader) error) error {
	br := bufio.NewReaderSize(r, 256<<10)
	next := 0
	for next < len(paths) {
		kind, err := br.ReadByte()
		if err != nil {
			return fmt.Errorf("read of %d files cut after %d: %w", len(paths), next, err)
		}
		var p string
		var e Entry
		switch kind {
		case frameGone:
			if p, err = readString(br, DefaultMaxNameLen); err != nil {
				return err
			}
		case frameFile:
			if e, err = ReadEntry(br); err != nil {
				return err
			}
			p = e.Path
		default:
			return fmt.Errorf("read: unknown frame %d: %w", kind, ErrUnsafe)
		}
		for next < len(paths) && paths[next] != p {
			next++ // files the agent skipped without saying: gone
		}
		if next == len(paths) {
			return fmt.Errorf("read: the agent sent %q, which was not asked for (or out of order): %w", p, ErrUnsafe)
		}
		next++
		if kind == frameGone {
			continue
		}
		if e.Type != File {
			return fmt.Errorf("read: %q is a %s: %w", p, e.Type, ErrUnsafe)
		}
		lr := io.LimitReader(br, e.Size)
		if err := fn(e, lr); err != nil {
			return err
		}
		if _, err := io.Copy(io.Discard, lr); err != nil { // what fn left
			return err
		}
	}
	return nil
}

// JoinPaths and SplitPaths carry a read's paths: NUL-separated (a name never holds NUL).
func JoinPaths(paths []string) string { return strings.Join(paths, "\x00") }

// SplitPaths is JoinPaths' inverse.
func SplitPaths(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, "\x00")
}
