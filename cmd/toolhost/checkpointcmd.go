package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/internal/snapshot"
)

// The commands content addressing makes cheap: verify, diff, export, fork, rewind, merge,
// gc. A snapshot is named by its key (from snapshot list), by the part after the last
// "/" with or without its suffix, or as PROJECT:KEY for another project's.

// snapRef resolves a reference to (project, key) within project by default.
func snapRef(ctx context.Context, m *toolhost.Storage, project, ref string) (string, string, error) {
	return m.ResolveSnapshot(ctx, project, ref)
}

func snapshotVerifyCommand() *command {
	cmd := &command{
		words:   []string{"snapshot", "verify"},
		args:    "[--project ID] [KEY] [--workspace DIR]",
		summary: "check a snapshot against its digests, or a workspace against a snapshot",
		help: `Reads every chunk of the snapshot KEY (default: the project's newest) and checks
each chunk, each file and the whole tree against their digests; a tar.gz snapshot is
checked against its SHA-256 and read to its end. Exit status 1 names what is wrong.

With --workspace DIR, compares DIR (a live workspace) with the snapshot instead, reading
every file: what was added, removed or changed since.

Examples:
  toolhost snapshot verify --project shop
  toolhost snapshot verify --project shop --workspace ~/src/shop`,
		flags: func(fs *pflag.FlagSet) {
			fs.StringP("workspace", "w", "", "compare this directory with the snapshot")
		},
		nargs: [2]int{0, 1},
	}
	cmd.run = func(ctx context.Context, c *cli, args []string) error {
		st, err := c.newStorage(ctx, nil)
		if err != nil {
			return err
		}
		defer st.Close()
		m := st
		ref := ""
		if len(args) > 0 {
			ref = args[0]
		}
		project, key, err := snapRef(ctx, m, c.cfg.Project, ref)
		if err != nil {
			return err
		}
		if ws, _ := c.flags.GetString("workspace"); ws != "" {
			abs, err := filepath.Abs(ws)
			if err != nil {
				return usagef(cmd, "--workspace: %v", err)
			}
			changes, err := m.VerifyDir(ctx, project, key, abs)
			if err != nil {
				return err
			}
			printChanges(c.stdout, changes)
			if len(changes) == 0 {
				fmt.Fprintf(c.stdout, "%s holds exactly %s\n", abs, key)
			}
			return nil
		}
		vs, err := m.VerifySnapshot(ctx, project, key)
		if err != nil {
			return fmt.Errorf("snapshot %s does not verify: %w", key, err)
		}
		fmt.Fprintf(c.stdout, "verified %s: %d files, %d dirs, %d links, %s in %d packs\n", key, vs.Files, vs.Dirs, vs.Symlinks,
			humanBytes(vs.Bytes), vs.Packs)
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
		nargs: [2]int{1, 2},
	}
	cmd.run = func(ctx context.Context, c *cli, args []string) error {
		st, err := c.newStorage(ctx, nil)
		if err != nil {
			return err
		}
		defer st.Close()
		m := st
		pa, ka, err := snapRef(ctx, m, c.cfg.Project, args[0])
		if err != nil {
			return err
		}
		refB := ""
		if len(args) > 1 {
			refB = args[1]
		}
		pb, kb, err := snapRef(ctx, m, c.cfg.Project, refB)
		if err != nil {
			return err
		}
		fmt.Fprintf(c.stdout, "a: %s\nb: %s\n", ka, kb)
		changes, err := m.DiffSnapshots(ctx, c.stdout, pa, ka, pb, kb)
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
		summary: "write a snapshot as one tar.gz (the seed's format; GNU tar reads it)",
		help: `Writes the snapshot KEY (default: the project's newest) as a single tar.gz, entry
for entry what a tar.gz save of the same tree holds. --output - writes to stdout.

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
		m := st
		ref := ""
		if len(args) > 0 {
			ref = args[0]
		}
		project, key, err := snapRef(ctx, m, c.cfg.Project, ref)
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
		err = m.ExportSnapshot(ctx, w, project, key)
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
		nargs: [2]int{0, 0},
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
		nargs: [2]int{1, 1},
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
		nargs: [2]int{0, 0},
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
		if len(res.Conflicts) > 0 {
			for _, cf := range res.Conflicts {
				fmt.Fprintf(c.stdout, "conflict %s: %s\n", cf.Path, cf.Why)
			}
			return fmt.Errorf("%d %s; nothing was written: resolve them in one project and merge again",
				len(res.Conflicts), plural(len(res.Conflicts), "conflict", "conflicts"))
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
		nargs: [2]int{0, 0},
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
		fmt.Fprintf(c.stdout, "read %d manifests over %d packs: deleted %d packs (%s), marked %d for a later run, kept %d referenced again\n",
			cs.Manifests, cs.Packs, cs.Deleted, humanBytes(cs.Freed), cs.Marked, cs.Kept)
		return nil
	}
	return cmd
}
