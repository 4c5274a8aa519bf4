package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/internal/snapshot"
)

// The commands content addressing makes cheap: verify, diff, export, fork, rewind, merge,
// gc. A snapshot is named by its key (from snapshot list), by the part after the last
// "/" with or without its suffix, or as PROJECT:KEY for another project's.

// argRef resolves the snapshot reference args[i] names, or the project's newest when
// there is no args[i], to (project, key).
func (c *cli) argRef(ctx context.Context, st *toolhost.Storage, args []string, i int) (string, string, error) {
	ref := ""
	if len(args) > i {
		ref = args[i]
	}
	return st.ResolveSnapshot(ctx, c.cfg.Project, ref)
}

// changeJSON is a Change in --format json.
type changeJSON struct {
	Kind string   `json:"kind"`
	Path string   `json:"path"`
	What []string `json:"what,omitempty"`
}

func changesJSON(cs []toolhost.Change) []changeJSON {
	out := make([]changeJSON, len(cs))
	for i, ch := range cs {
		out[i] = changeJSON{ch.Kind, ch.Path, ch.What}
	}
	return out
}

func snapshotVerifyCommand() *command {
	cmd := &command{
		words:   []string{"snapshot", "verify"},
		args:    "[--project ID] [KEY] [--workspace DIR]",
		summary: "check a snapshot against its digests, or a workspace against a snapshot",
		help: `Reads every chunk of the snapshot KEY (default: the project's newest) and checks
each chunk, each file and the whole tree against their digests; a tar.gz snapshot is
checked against its SHA-256 and read to its end. Exit status 1 names what is wrong.

A chunked snapshot found damaged (a pack missing or not matching its digests, a manifest
that does not read) is set aside in the project's quarantine, with every other snapshot
of the project that needs what is damaged, and the output says where. Then the output
lists the project's quarantine: each snapshot set aside, when and why. snapshot release
KEY puts one back once it verifies; snapshot delete KEY deletes it.

With --workspace DIR, compares DIR (a live workspace) with the snapshot instead, reading
every file: what was added, removed or changed since.

Examples:
  toolhost snapshot verify --project shop
  toolhost snapshot verify --project shop --workspace ~/src/shop`,
		flags: func(fs *pflag.FlagSet) {
			fs.StringP("workspace", "w", "", "compare this directory with the snapshot")
		},
		nargs:  [2]int{0, 1},
		report: true,
	}
	cmd.run = func(ctx context.Context, c *cli, args []string) error {
		st, err := c.newStorage(ctx, nil)
		if err != nil {
			return err
		}
		defer st.Close()
		project, key, err := c.argRef(ctx, st, args, 0)
		if errors.Is(err, toolhost.ErrNoSnapshot) && len(args) == 0 {
			// Every snapshot may have been set aside: say so.
			if q, qerr := st.QuarantinedSnapshots(ctx, c.cfg.Project); qerr == nil {
				printQuarantine(c.stderr, q)
			}
		}
		if err != nil {
			return err
		}
		if ws, _ := c.flags.GetString("workspace"); ws != "" {
			abs, err := filepath.Abs(ws)
			if err != nil {
				return usagef(cmd, "--workspace: %v", err)
			}
			changes, err := st.VerifyDir(ctx, project, key, abs)
			if err != nil {
				return err
			}
			if c.json() {
				return writeJSON(c.stdout, struct {
					Key       string       `json:"key"`
					Workspace string       `json:"workspace"`
					Same      bool         `json:"same"`
					Changes   []changeJSON `json:"changes"`
				}{key, abs, len(changes) == 0, changesJSON(changes)}, true)
			}
			printChanges(c.stdout, changes)
			if len(changes) == 0 {
				fmt.Fprintf(c.stdout, "%s holds exactly %s\n", abs, key)
			}
			return nil
		}
		vs, verr := st.VerifySnapshot(ctx, project, key)
		q, err := st.QuarantinedSnapshots(ctx, project)
		if err != nil {
			return fmt.Errorf("listing the quarantine of project %s in %s: %w", project, st.Where(), err)
		}
		if verr != nil {
			printQuarantine(c.stderr, q)
			return fmt.Errorf("snapshot %s does not verify: %w", key, verr)
		}
		if c.json() {
			out := struct {
				Key         string           `json:"key"`
				Verified    bool             `json:"verified"`
				Files       int              `json:"files"`
				Dirs        int              `json:"dirs"`
				Symlinks    int              `json:"symlinks"`
				Bytes       int64            `json:"bytes"`
				Packs       int              `json:"packs"`
				Quarantined []quarantineJSON `json:"quarantined"`
			}{key, true, vs.Files, vs.Dirs, vs.Symlinks, vs.Bytes, vs.Packs, []quarantineJSON{}}
			for _, x := range q {
				out.Quarantined = append(out.Quarantined, quarantineJSON{x.Key, x.Snapshot, x.Time.UTC(), x.Reason, x.Why})
			}
			return writeJSON(c.stdout, out, true)
		}
		fmt.Fprintf(c.stdout, "verified %s: %d files, %d dirs, %d links, %s in %d packs\n", key, vs.Files, vs.Dirs, vs.Symlinks,
			humanBytes(vs.Bytes), vs.Packs)
		printQuarantine(c.stdout, q)
		return nil
	}
	return cmd
}

// quarantineJSON is a snapshot set aside, in --format json.
type quarantineJSON struct {
	Key      string    `json:"key"`
	Snapshot string    `json:"snapshot"`
	Time     time.Time `json:"time"`
	Reason   string    `json:"reason"`
	Why      string    `json:"why"`
}

// printQuarantine lists the snapshots set aside as damaged, and what to do with them.
func printQuarantine(w io.Writer, q []toolhost.QuarantinedSnapshot) {
	if len(q) == 0 {
		return
	}
	fmt.Fprintf(w, "%d %s set aside as damaged (snapshot release KEY puts one back once it verifies; snapshot delete KEY deletes it):\n",
		len(q), plural(len(q), "snapshot", "snapshots"))
	for _, x := range q {
		fmt.Fprintf(w, "  %s\n    was %s; set aside %s UTC: %s: %s\n", x.Key, x.Snapshot, x.Time.UTC().Format(timeLayout), x.Reason,
			printable(x.Why))
	}
}

func snapshotReleaseCommand() *command {
	cmd := &command{
		words:   []string{"snapshot", "release"},
		args:    "[--project ID] KEY",
		summary: "put a snapshot set aside as damaged back among the project's snapshots",
		help: `Verifies the quarantined snapshot KEY (a key snapshot verify lists) whole, every chunk,
file and the tree against their digests, and when it verifies puts it back under the
key it had, as after its pack was repaired. One that still does not verify stays set
aside (exit 1, naming what is wrong). A snapshot put back is the newest only if nothing
was saved after it; snapshot rewind makes it the next wake.

Example:
  toolhost snapshot release --project shop projects/shop/quarantine/20261122T101500Z-damaged-pack-20261121T093000Z-042-7f3a9c.snap`,
		nargs:  [2]int{1, 1},
		report: true,
	}
	cmd.run = func(ctx context.Context, c *cli, args []string) error {
		st, err := c.newStorage(ctx, nil)
		if err != nil {
			return err
		}
		defer st.Close()
		key, err := st.ReleaseSnapshot(ctx, c.cfg.Project, args[0])
		switch {
		case errors.Is(err, toolhost.ErrNotSnapshotKey):
			return usagef(cmd, "%v", err)
		case err != nil:
			return fmt.Errorf("in %s: %w", st.Where(), err)
		}
		if c.json() {
			return writeJSON(c.stdout, struct {
				Released string `json:"released"`
				Key      string `json:"key"`
			}{args[0], key}, true)
		}
		fmt.Fprintf(c.stdout, "released %s: it verifies, and is %s again\n", args[0], key)
		return nil
	}
	return cmd
}

func printChanges(w io.Writer, changes []toolhost.Change) {
	for _, ch := range changes {
		what := ""
		if len(ch.What) > 0 {
			what = " (" + strings.Join(ch.What, ", ") + ")"
		}
		fmt.Fprintf(w, "%-8s %s%s\n", ch.Kind, ch.Path, what)
	}
}

func snapshotDiffCommand() *command {
	cmd := &command{
		words:   []string{"snapshot", "diff"},
		args:    "[--project ID] A [B]",
		summary: "what changed between two snapshots (of one project, or a fork and its origin)",
		help: `Lists the paths added, removed and changed from snapshot A to snapshot B (default:
the project's newest), then a unified diff of each changed text file. A snapshot is a key,
the part of one after the last "/", or PROJECT:KEY (PROJECT: alone is its newest), so a
fork can be compared with its origin.

Examples:
  toolhost snapshot diff --project shop 20261121T093000Z-042-7f3a9c
  toolhost snapshot diff shop: shop-experiment:`,
		nargs:  [2]int{1, 2},
		report: true,
	}
	cmd.run = func(ctx context.Context, c *cli, args []string) error {
		st, err := c.newStorage(ctx, nil)
		if err != nil {
			return err
		}
		defer st.Close()
		pa, ka, err := c.argRef(ctx, st, args, 0)
		if err != nil {
			return err
		}
		pb, kb, err := c.argRef(ctx, st, args, 1)
		if err != nil {
			return err
		}
		if c.json() {
			var diff strings.Builder
			changes, err := st.DiffSnapshots(ctx, &diff, pa, ka, pb, kb)
			if err != nil {
				return err
			}
			return writeJSON(c.stdout, struct {
				A       string       `json:"a"`
				B       string       `json:"b"`
				Changes []changeJSON `json:"changes"`
				Diff    string       `json:"diff"`
			}{ka, kb, changesJSON(changes), diff.String()}, true)
		}
		fmt.Fprintf(c.stdout, "a: %s\nb: %s\n", ka, kb)
		changes, err := st.DiffSnapshots(ctx, c.stdout, pa, ka, pb, kb)
		if err != nil {
			return err
		}
		if len(changes) == 0 {
			fmt.Fprintln(c.stdout, "no differences")
		}
		return nil
	}
	return cmd
}

func snapshotExportCommand() *command {
	cmd := &command{
		words:   []string{"snapshot", "export"},
		args:    "[--project ID] [KEY] --output FILE",
		summary: "write a snapshot as one tar.gz (GNU tar reads it)",
		help: `Writes the snapshot KEY (default: the project's newest) as a single tar.gz, entry
for entry what toolhost's archive of the same tree holds (a tar.gz snapshot of an
older version: as it is stored). --output - writes to stdout.

Example:
  toolhost snapshot export --project shop -o shop.tar.gz`,
		flags: func(fs *pflag.FlagSet) {
			fs.StringP("output", "o", "", "file to write (- for stdout)")
		},
		nargs: [2]int{0, 1},
	}
	cmd.run = func(ctx context.Context, c *cli, args []string) error {
		out, _ := c.flags.GetString("output")
		if out == "" {
			return usagef(cmd, "--output FILE is required (- for stdout)")
		}
		st, err := c.newStorage(ctx, nil)
		if err != nil {
			return err
		}
		defer st.Close()
		project, key, err := c.argRef(ctx, st, args, 0)
		if err != nil {
			return err
		}
		w := c.stdout
		var f *os.File
		if out != "-" {
			if f, err = os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600); err != nil {
				return fmt.Errorf("export: %w", err)
			}
			w = f
		}
		err = st.ExportSnapshot(ctx, w, project, key)
		if f != nil {
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				os.Remove(out)
			}
		}
		if err != nil {
			return fmt.Errorf("export %s: %w", key, err)
		}
		if f != nil {
			fmt.Fprintf(c.stderr, "exported %s to %s\n", key, out)
		}
		return nil
	}
	return cmd
}

func snapshotImportCommand() *command {
	cmd := &command{
		words:   []string{"snapshot", "import"},
		args:    "[--project ID] FILE",
		summary: "store a tar.gz (one snapshot export wrote) as the project's newest snapshot",
		help: `Reads FILE, a tar.gz (one snapshot export wrote, or any archive of a workspace; -
reads stdin), and stores it as the project's newest snapshot, labelled "import of FILE",
as a save does: its files cut into chunks stored once per store, entries a snapshot
cannot hold left out and listed, retention applied. The next session of the project
wakes in it.

Example:
  toolhost snapshot import --project shop shop.tar.gz`,
		nargs:  [2]int{1, 1},
		report: true,
	}
	cmd.run = func(ctx context.Context, c *cli, args []string) error {
		in := c.stdin
		if args[0] != "-" {
			f, err := os.Open(args[0])
			if err != nil {
				return fmt.Errorf("import: %w", err)
			}
			defer f.Close()
			in = f
		}
		st, err := c.newStorage(ctx, nil)
		if err != nil {
			return err
		}
		defer st.Close()
		info, err := st.ImportSnapshot(ctx, c.cfg.Project, "import of "+filepath.Base(args[0]), in)
		if err != nil {
			return fmt.Errorf("import %s: %w", args[0], err)
		}
		if info.Unchanged {
			fmt.Fprintf(c.stdout, "unchanged: %s, the newest snapshot, already holds this content\n", info.Key)
		} else {
			fmt.Fprintf(c.stdout, "imported %s as %s\n", args[0], info.Key)
		}
		printSkips(c.stdout, info)
		return nil
	}
	return cmd
}

func snapshotForkCommand() *command {
	cmd := &command{
		words:   []string{"snapshot", "fork"},
		args:    "--project P --to Q [--key K]",
		summary: "start project Q from project P's snapshot (no chunk copied)",
		help: `Makes Q a new project whose first snapshot is P's newest (or K): several agents can
work from one state. Only the manifest is copied. Q keeps P's snapshot as its origin,
so "snapshot diff P: Q:" shows what the fork changed and "snapshot merge --project Q"
brings the fork's changes back into P.

Example:
  toolhost snapshot fork --project shop --to shop-experiment`,
		flags: func(fs *pflag.FlagSet) {
			fs.String("to", "", "the new project (required)")
			fs.String("key", "", "fork this snapshot, not the newest")
		},
		nargs:  [2]int{0, 0},
		report: true,
	}
	cmd.run = func(ctx context.Context, c *cli, _ []string) error {
		to, _ := c.flags.GetString("to")
		key, _ := c.flags.GetString("key")
		if to == "" {
			return usagef(cmd, "--to PROJECT is required (the new project)")
		}
		if err := snapshot.ValidProjectID(to); err != nil {
			return usagef(cmd, "--to: %v", err)
		}
		st, err := c.newStorage(ctx, nil)
		if err != nil {
			return err
		}
		defer st.Close()
		info, origin, err := st.Fork(ctx, c.cfg.Project, key, to)
		if err != nil {
			return err
		}
		if c.json() {
			return writeJSON(c.stdout, struct {
				Origin  string `json:"origin"`
				Project string `json:"project"`
				Key     string `json:"key"`
			}{origin, to, info.Key}, true)
		}
		fmt.Fprintf(c.stdout, "forked %s into project %s: %s\n", origin, to, info.Key)
		return nil
	}
	return cmd
}

func snapshotRewindCommand() *command {
	cmd := &command{
		words:   []string{"snapshot", "rewind"},
		args:    "[--project ID] KEY",
		summary: "make an earlier snapshot the project's newest again (undoable)",
		help: `The project's next session wakes in snapshot KEY. Nothing is lost: the present
(the newest snapshot) stays, and the rewind is itself a new snapshot, so rewinding to
the key printed as "undo" brings the present back. Save a live workspace first
(a session's commit, or snapshot save).

Example:
  toolhost snapshot rewind --project shop 20261121T093000Z-042-7f3a9c`,
		nargs:  [2]int{1, 1},
		report: true,
	}
	cmd.run = func(ctx context.Context, c *cli, args []string) error {
		st, err := c.newStorage(ctx, nil)
		if err != nil {
			return err
		}
		defer st.Close()
		info, origin, undo, err := st.Rewind(ctx, c.cfg.Project, args[0])
		if errors.Is(err, toolhost.ErrNotSnapshotKey) {
			return usagef(cmd, "%v", err)
		}
		if err != nil {
			return err
		}
		if c.json() {
			return writeJSON(c.stdout, struct {
				Project string `json:"project"`
				Origin  string `json:"origin"`
				Key     string `json:"key"`
				Undo    string `json:"undo"`
			}{c.cfg.Project, origin, info.Key, undo}, true)
		}
		fmt.Fprintf(c.stdout, "rewound project %s to %s: %s\nundo: toolhost snapshot rewind --project %s %s\n",
			c.cfg.Project, origin, info.Key, c.cfg.Project, strings.TrimSuffix(filepath.Base(undo), ".snap"))
		return nil
	}
	return cmd
}

func snapshotMergeCommand() *command {
	cmd := &command{
		words:   []string{"snapshot", "merge"},
		args:    "--project FORK",
		summary: "bring a fork's changes back into its origin project",
		help: `Merges what project FORK changed since it was forked into its origin project, as a
new snapshot of the origin: a path only the fork changed takes the fork's version, text
files both changed are merged line by line. Paths both changed in ways that cannot be
merged are listed as conflicts and nothing is written (exit status 1).

Example:
  toolhost snapshot merge --project shop-experiment`,
		nargs:  [2]int{0, 0},
		report: true,
	}
	cmd.run = func(ctx context.Context, c *cli, _ []string) error {
		st, err := c.newStorage(ctx, nil)
		if err != nil {
			return err
		}
		defer st.Close()
		res, err := st.MergeFork(ctx, c.cfg.Project)
		info := res.Snapshot
		if err != nil {
			return err
		}
		if c.json() {
			type conflict struct {
				Path string `json:"path"`
				Why  string `json:"why"`
			}
			out := struct {
				Project   string     `json:"project"`
				Into      string     `json:"into,omitempty"`
				Key       string     `json:"key,omitempty"`
				Taken     []string   `json:"taken"`
				Merged    []string   `json:"merged"`
				Conflicts []conflict `json:"conflicts"`
			}{Project: c.cfg.Project, Taken: nonNil(res.Taken), Merged: nonNil(res.Merged), Conflicts: []conflict{}}
			for _, cf := range res.Conflicts {
				out.Conflicts = append(out.Conflicts, conflict{cf.Path, cf.Why})
			}
			if len(res.Conflicts) == 0 {
				out.Into, out.Key = info.Project, info.Key
			}
			if err := writeJSON(c.stdout, out, true); err != nil {
				return err
			}
		}
		if len(res.Conflicts) > 0 {
			for _, cf := range res.Conflicts {
				if !c.json() {
					fmt.Fprintf(c.stdout, "conflict %s: %s\n", cf.Path, cf.Why)
				}
			}
			return fmt.Errorf("%d %s; nothing was written: resolve them in one project and merge again",
				len(res.Conflicts), plural(len(res.Conflicts), "conflict", "conflicts"))
		}
		if c.json() {
			return nil
		}
		for _, p := range res.Taken {
			fmt.Fprintf(c.stdout, "took     %s\n", p)
		}
		for _, p := range res.Merged {
			fmt.Fprintf(c.stdout, "merged   %s\n", p)
		}
		fmt.Fprintf(c.stdout, "merged project %s into %s: %s\n", c.cfg.Project, info.Project, info.Key)
		return nil
	}
	return cmd
}

func snapshotGCCommand() *command {
	cmd := &command{
		words:   []string{"snapshot", "gc"},
		args:    "",
		summary: "delete chunks no snapshot references any more",
		help: `Retention deletes snapshots; the chunks only they referenced are deleted by a
collection, in two passes at least snapshot.grace apart (so a host saving meanwhile never
loses a chunk it is about to reference): each run deletes what an earlier run found
unreferenced and is still unreferenced, then marks what is unreferenced now. One host
collects at a time.`,
		nargs:  [2]int{0, 0},
		report: true,
	}
	cmd.run = func(ctx context.Context, c *cli, _ []string) error {
		st, err := c.newStorage(ctx, nil)
		if err != nil {
			return err
		}
		defer st.Close()
		cs, err := st.CollectChunks(ctx)
		if err != nil {
			return err
		}
		if c.json() {
			return writeJSON(c.stdout, struct {
				Manifests int   `json:"manifests"`
				Packs     int   `json:"packs"`
				Deleted   int   `json:"deleted"`
				Freed     int64 `json:"freed_bytes"`
				Marked    int   `json:"marked"`
				Kept      int   `json:"kept"`
			}{cs.Manifests, cs.Packs, cs.Deleted, cs.Freed, cs.Marked, cs.Kept}, true)
		}
		fmt.Fprintf(c.stdout, "read %d manifests over %d packs: deleted %d packs (%s), marked %d for a later run, kept %d referenced again\n",
			cs.Manifests, cs.Packs, cs.Deleted, humanBytes(cs.Freed), cs.Marked, cs.Kept)
		return nil
	}
	return cmd
}

// nonNil is s, or an empty slice for nil (a JSON list, never null).
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
