package chunked

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/toolhost/toolhost/internal/tree"
)

// Copy stores m's content under key as a new snapshot (another project's: a fork; the
// same project's: a rewind), referencing the same packs: no chunk is copied. label and
// origin are the new manifest's.
func (r *Repo) Copy(ctx context.Context, m *Manifest, key, label, origin string) (*Manifest, error) {
	v, err := r.refresh(ctx)
	if err != nil {
		return nil, err
	}
	v.copy = true // a copy is as sound as m, whatever damage records say (the caller examines m)
	n := *m
	n.Project = projectOf(key)
	n.Label, n.Origin, n.Parent = label, origin, m.Key
	if _, t, ok := ParseManifestKey(key); ok {
		n.Time = t
	}
	n.Packs = slices.Clone(m.Packs)
	n.Segments = slices.Clone(m.Segments)
	if err := r.putManifest(ctx, v, &n, key); err != nil {
		return nil, err
	}
	return &n, nil
}

// Change is one path that differs between two snapshots.
type Change struct {
	Path string
	// Kind is "added", "removed" or "changed".
	Kind     string
	Old, New *Entry
	// What changed: "type", "content", "mode", "target".
	What []string
}

// DiffEntries compares two trees (each in order).
func DiffEntries(a, b []Entry) []Change {
	var out []Change
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j >= len(b) || (i < len(a) && compare(a[i].Path, b[j].Path) < 0):
			out = append(out, Change{Path: a[i].Path, Kind: "removed", Old: &a[i]})
			i++
		case i >= len(a) || compare(a[i].Path, b[j].Path) > 0:
			out = append(out, Change{Path: b[j].Path, Kind: "added", New: &b[j]})
			j++
		default:
			x, y := &a[i], &b[j]
			var what []string
			switch {
			case x.Type != y.Type:
				what = append(what, "type")
			case x.Type == tree.File && (x.Digest != y.Digest || x.Size != y.Size):
				what = append(what, "content")
			case x.Type == tree.Symlink && x.Target != y.Target:
				what = append(what, "target")
			}
			if x.Type == y.Type && x.Type != tree.Symlink && x.Mode != y.Mode {
				what = append(what, "mode")
			}
			if len(what) > 0 {
				out = append(out, Change{Path: x.Path, Kind: "changed", Old: x, New: y, What: what})
			}
			i++
			j++
		}
	}
	return out
}

// ReadFile returns a file's contents from the store (checked against its digest).
func (r *Repo) ReadFile(ctx context.Context, e *Entry) ([]byte, error) {
	if e.Type != tree.File {
		return nil, fmt.Errorf("%q is a %s, not a file", e.Path, e.Type)
	}
	var order []PackID
	for _, c := range e.Chunks {
		order = append(order, c.Pack)
	}
	f := r.newFetcher(ctx, order, nil)
	defer f.close()
	return r.assemble(f, e, func(PackID) {})
}

// TextDiff renders changes as a listing with a unified diff for each changed text file
// (both sides text and at most MaxTextBytes): what `snapshot diff` prints.
func (r *Repo) TextDiff(ctx context.Context, w io.Writer, changes []Change, nameA, nameB string) error {
	for _, c := range changes {
		switch c.Kind {
		case "added":
			fmt.Fprintf(w, "added    %s (%s)\n", c.Path, describe(c.New))
		case "removed":
			fmt.Fprintf(w, "removed  %s (%s)\n", c.Path, describe(c.Old))
		default:
			fmt.Fprintf(w, "changed  %s (%s)\n", c.Path, strings.Join(c.What, ", "))
		}
	}
	for _, c := range changes {
		if c.Kind == "changed" && !slices.Contains(c.What, "content") {
			continue
		}
		if (c.Old != nil && c.Old.Type != tree.File) || (c.New != nil && c.New.Type != tree.File) {
			continue
		}
		text := func(e *Entry) ([]byte, bool, error) {
			if e == nil {
				return nil, true, nil
			}
			if e.Size > MaxTextBytes {
				return nil, false, nil
			}
			b, err := r.ReadFile(ctx, e)
			if err != nil {
				return nil, false, err
			}
			return b, IsText(b), nil
		}
		a, okA, err := text(c.Old)
		if err != nil {
			return err
		}
		b, okB, err := text(c.New)
		if err != nil {
			return err
		}
		if !okA || !okB {
			fmt.Fprintf(w, "\nBinary files %s/%s and %s/%s differ\n", nameA, c.Path, nameB, c.Path)
			continue
		}
		pa, pb := nameA+"/"+c.Path, nameB+"/"+c.Path
		if c.Old == nil {
			pa = "/dev/null"
		}
		if c.New == nil {
			pb = "/dev/null"
		}
		if d := UnifiedDiff(pa, pb, a, b); d != "" {
			fmt.Fprintf(w, "\n%s", d)
		}
	}
	return nil
}

func describe(e *Entry) string {
	switch e.Type {
	case tree.File:
		return fmt.Sprintf("file, %d bytes", e.Size)
	case tree.Symlink:
		return "link to " + e.Target
	}
	return e.Type.String()
}

// prebuilt is a tree given as entries: files with Chunks reuse them (still live: Commit
// checks), files with Data are chunked and stored.
type prebuilt struct {
	entries []Entry
	data    map[string][]byte
}

func (p *prebuilt) Stream(ctx context.Context, fn func(tree.Entry, io.Reader) error) (tree.WalkStats, error) {
	return tree.WalkStats{}, nil // Build special-cases it
}

// Conflict is a path a merge could not decide.
type Conflict struct {
	Path string
	Why  string
}

// MergeResult is a three-way merge of two trees over their common base.
type MergeResult struct {
	Conflicts []Conflict
	// Taken lists the paths whose version came from theirs (or was merged line by line).
	Taken  []string
	Merged []string
	tree   *prebuilt
}

// Merge merges the changes from base to theirs into ours: a path only theirs changed
// takes their version; one both changed the same way is kept; a text file both changed
// is merged line by line; anything else both changed is a conflict. Nothing is stored:
// CommitMerge stores a result without conflicts.
func (r *Repo) Merge(ctx context.Context, base, ours, theirs *Manifest) (*MergeResult, error) {
	eb, err := r.Entries(ctx, base)
	if err != nil {
		return nil, err
	}
	eo, err := r.Entries(ctx, ours)
	if err != nil {
		return nil, err
	}
	et, err := r.Entries(ctx, theirs)
	if err != nil {
		return nil, err
	}
	idx := func(es []Entry) map[string]*Entry {
		m := make(map[string]*Entry, len(es))
		for i := range es {
			m[es[i].Path] = &es[i]
		}
		return m
	}
	mb, mo, mt := idx(eb), idx(eo), idx(et)
	paths := map[string]bool{}
	for _, es := range [][]Entry{eb, eo, et} {
		for _, e := range es {
			paths[e.Path] = true
		}
	}
	res := &MergeResult{tree: &prebuilt{data: map[string][]byte{}}}
	same := func(a, b *Entry) bool {
		if a == nil || b == nil {
			return a == b
		}
		return a.Type == b.Type && a.Mode == b.Mode && a.Digest == b.Digest && a.Size == b.Size && a.Target == b.Target
	}
	for p := range paths {
		b, o, t := mb[p], mo[p], mt[p]
		var pick *Entry
		switch {
		case same(b, t): // theirs did not touch it
			pick = o
		case same(b, o) || same(o, t): // only theirs changed it, or both the same way
			pick = t
			if !same(o, t) {
				res.Taken = append(res.Taken, p)
			}
		case b != nil && o != nil && t != nil && b.Type == tree.File && o.Type == tree.File && t.Type == tree.File &&
			o.Mode == t.Mode && max(b.Size, o.Size, t.Size) <= MaxTextBytes:
			db, err1 := r.ReadFile(ctx, b)
			do, err2 := r.ReadFile(ctx, o)
			dt, err3 := r.ReadFile(ctx, t)
			if err := firstErr(err1, err2, err3); err != nil {
				return nil, err
			}
			if !IsText(db) || !IsText(do) || !IsText(dt) {
				res.Conflicts = append(res.Conflicts, Conflict{p, "binary file changed on both sides"})
				continue
			}
			merged, n := Merge3(db, do, dt)
			if n > 0 {
				res.Conflicts = append(res.Conflicts, Conflict{p, fmt.Sprintf("%d overlapping %s changed on both sides", n, plural(n, "region", "regions"))})
				continue
			}
			e := *o
			e.Size, e.Chunks = int64(len(merged)), nil
			res.tree.data[p] = merged
			res.Merged = append(res.Merged, p)
			pick = &e
		default:
			why := "changed on both sides"
			switch {
			case o == nil || t == nil:
				why = "removed on one side, changed on the other"
			case o.Type != t.Type:
				why = "made a " + o.Type.String() + " on one side and a " + t.Type.String() + " on the other"
			case o.Mode != t.Mode:
				why = "mode changed on both sides"
			}
			res.Conflicts = append(res.Conflicts, Conflict{p, why})
			continue
		}
		if pick != nil {
			res.tree.entries = append(res.tree.entries, *pick)
		}
	}
	slices.SortFunc(res.Conflicts, func(a, b Conflict) int { return compare(a.Path, b.Path) })
	slices.Sort(res.Taken)
	slices.Sort(res.Merged)
	slices.SortFunc(res.tree.entries, func(a, b Entry) int { return compare(a.Path, b.Path) })
	// A parent a merge removed while a child stayed would leave the child without one.
	have := map[string]tree.Type{}
	for _, e := range res.tree.entries {
		have[e.Path] = e.Type
	}
	for _, e := range res.tree.entries {
		if i := strings.LastIndexByte(e.Path, '/'); i > 0 {
			if have[e.Path[:i]] != tree.Dir {
				res.Conflicts = append(res.Conflicts, Conflict{e.Path, "its directory was removed or replaced on the other side"})
			}
		}
	}
	return res, nil
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// CommitMerge stores a merge without conflicts as a new snapshot of ours' project under
// key, over ours (its parent).
func (r *Repo) CommitMerge(ctx context.Context, res *MergeResult, ours *Manifest, key, label string) (*Manifest, error) {
	if len(res.Conflicts) > 0 {
		return nil, fmt.Errorf("the merge has %d conflicts; nothing is written", len(res.Conflicts))
	}
	b, err := r.Build(ctx, res.tree, BuildOptions{Project: ours.Project, Label: label, Base: ours,
		RootMode: ours.RootMode, RootMTime: ours.RootMTime})
	if err != nil {
		return nil, err
	}
	if err := r.Commit(ctx, b, key); err != nil {
		return nil, err
	}
	return b.Manifest, nil
}

// Scan reads a tree whole and returns its entries with their files' digests, storing
// nothing: what a live workspace holds, to compare with a snapshot.
func (r *Repo) Scan(ctx context.Context, src Lister) ([]Entry, error) {
	list, _, err := src.List(ctx)
	if err != nil {
		return nil, err
	}
	var out []Entry
	var files []string
	for _, e := range list {
		if e.Type == tree.File {
			files = append(files, e.Path)
			continue
		}
		out = append(out, Entry{Entry: e})
	}
	buf := make([]byte, 256<<10)
	err = src.Read(ctx, files, func(e tree.Entry, rd io.Reader) error {
		h := sha256.New()
		n, err := io.CopyBuffer(h, rd, buf)
		if err != nil {
			return err
		}
		x := Entry{Entry: e}
		x.Size = n
		h.Sum(x.Digest[:0])
		out = append(out, x)
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b Entry) int { return compare(a.Path, b.Path) })
	return out, nil
}
