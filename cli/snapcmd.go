package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/internal/screenshot"
)

const timeLayout = "2006-01-02 15:04:05"

func snapshotSaveCommand() *command {
	cmd := &command{
		words:   []string{"snapshot", "save"},
		args:    "[--project ID] [--workspace DIR]",
		summary: "save a workspace directory as the project's newest snapshot",
		help: `Saves DIR (default: the current directory), leaving out snapshot.excludes, as a
snapshot under projects/PROJECT/snapshots/ in the configured store (store.kind; by
default a directory under data_dir): its files cut into chunks stored once per
store, so a save stores what changed. Retention then keeps the newest
snapshot.keep. When the project's newest snapshot already holds this content,
nothing is uploaded ("unchanged").

What a snapshot cannot hold (a name too long, an unreadable file, a socket or
device, a link out of the tree) is left out and listed; the rest is saved. A store
that fails is retried (snapshot.retries) within a few seconds, one log line per
attempt, then the save fails with one line naming the store and the cause.
What really moved goes to stderr ("transfer: ..."), with a live line on a terminal.

Example:
  toolhost snapshot save --project shop --workspace ~/src/shop`,
		flags: func(fs *pflag.FlagSet) {
			fs.StringP("workspace", "w", "", "directory to save (default: the current directory)")
		},
		nargs:  [2]int{0, 0},
		report: true,
	}
	cmd.run = func(ctx context.Context, c *cli, _ []string) error {
		ws, _ := c.flags.GetString("workspace")
		ws, err := workspaceDir(ws)
		if err != nil {
			return usagef(cmd, "--workspace: %v", err)
		}
		pr := newProgress(c.stderr)
		st, err := c.newStorage(ctx, pr.update)
		if err != nil {
			return err
		}
		defer st.Close()
		info, stats, err := st.SaveDir(ctx, c.cfg.Project, ws)
		pr.finish()
		printTransfer(c.stderr, info)
		if err != nil {
			// It names the project, the store and the cause: print it as it is.
			return err
		}
		if c.json() {
			out := saveJSON{Key: info.Key, Bytes: info.Size, Unchanged: info.Unchanged, Files: stats.Files,
				Pruned: append([]string{}, info.Pruned...), Skipped: info.Skipped, Skips: []skipJSON{}}
			for _, sk := range info.Skips {
				out.Skips = append(out.Skips, skipJSON{What: sk.Path, Reason: sk.Reason})
			}
			return writeJSON(c.stdout, out, true)
		}
		if info.Unchanged {
			fmt.Fprintf(c.stdout, "unchanged: %s, the newest snapshot, already holds this content (%s; %s); nothing uploaded\n",
				info.Key, humanBytes(info.Size), count(stats.Files, "file", "files"))
		} else {
			fmt.Fprintf(c.stdout, "saved %s (%s; %s, %s packed, in %s)\n", info.Key, humanBytes(info.Size),
				count(stats.Files, "file", "files"), humanBytes(stats.Bytes), ms(stats.Duration))
		}
		fmt.Fprintf(c.stdout, "store: %s\n", st.Where())
		printSkips(c.stdout, info)
		if len(info.Pruned) > 0 {
			fmt.Fprintf(c.stdout, "retention removed %d older %s (snapshot.keep: %d)\n", len(info.Pruned), plural(len(info.Pruned), "snapshot", "snapshots"), c.cfg.Snapshot.Keep)
		}
		return nil
	}
	return cmd
}

// count is "1 file", "2 files".
func count(n int, one, many string) string { return fmt.Sprintf("%d %s", n, plural(n, one, many)) }

// printSkips says what a save left out because a snapshot cannot hold it: the count and
// the first entries, quoted (names come from the workspace).
func printSkips(w io.Writer, info toolhost.SnapshotInfo) {
	if info.Skipped == 0 {
		return
	}
	fmt.Fprintf(w, "left out %d %s that a snapshot cannot hold (the rest is saved):\n", info.Skipped, plural(info.Skipped, "entry", "entries"))
	const show = 10
	for _, sk := range info.Skips[:min(len(info.Skips), show)] {
		fmt.Fprintf(w, "  %s: %s\n", strconv.Quote(sk.Path), sk.Reason)
	}
	if more := info.Skipped - min(len(info.Skips), show); more > 0 {
		fmt.Fprintf(w, "  and %d more\n", more)
	}
}

func snapshotListCommand() *command {
	cmd := &command{
		words:   []string{"snapshot", "list"},
		args:    "[--project ID]",
		summary: "list the project's snapshots, newest first",
		help: `Prints one line per snapshot of the project: its key, the UTC time the save
started and its size, newest first. A project without snapshots prints nothing on
stdout and says so on stderr (exit status 0).`,
		nargs:  [2]int{0, 0},
		report: true,
	}
	cmd.run = func(ctx context.Context, c *cli, _ []string) error {
		st, err := c.newStorage(ctx, nil)
		if err != nil {
			return err
		}
		defer st.Close()
		infos, err := st.Snapshots(ctx, c.cfg.Project)
		if err != nil {
			return fmt.Errorf("listing the snapshots of project %s in %s: %w", c.cfg.Project, st.Where(), err)
		}
		if c.json() {
			out := snapshotsJSON{Project: c.cfg.Project, Snapshots: []snapshotJSON{}}
			for _, in := range infos {
				out.Snapshots = append(out.Snapshots, snapshotJSON{Key: in.Key, Time: in.Time.UTC(), Bytes: in.Size})
			}
			return writeJSON(c.stdout, out, true)
		}
		if len(infos) == 0 {
			fmt.Fprintf(c.stderr, "project %s has no snapshots in %s\n", c.cfg.Project, st.Where())
			return nil
		}
		tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "KEY\tTIME (UTC)\tSIZE\n")
		for _, in := range infos {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", in.Key, in.Time.UTC().Format(timeLayout), humanBytes(in.Size))
		}
		return tw.Flush()
	}
	return cmd
}

func snapshotRestoreCommand() *command {
	cmd := &command{
		words:   []string{"snapshot", "restore"},
		args:    "[--project ID] [--key KEY] --workspace DIR",
		summary: "extract the project's newest good snapshot (or one by key) into a directory",
		help: `Downloads the newest snapshot of the project that restores and extracts it into
DIR, which is created if absent. A snapshot that is refused (its checksum does not
verify, or extracting it fails) is skipped for the next older one, and the output
says which were skipped and why. With --key KEY, only that snapshot is restored (a
key from snapshot list), with no fallback.

Nothing is ever lost: when DIR holds files, the snapshot is extracted next to it
first and only then swapped in, and the previous contents are moved to
DIR.before-restore-TIME (the output says where). Entries that would land outside
DIR (.., absolute names, links out, devices) are refused.

Examples:
  toolhost snapshot restore --project shop --workspace /tmp/shop
  toolhost snapshot restore --project shop --key projects/shop/snapshots/20261121T093000Z-042-7f3a9c.snap -w /tmp/shop`,
		flags: func(fs *pflag.FlagSet) {
			fs.StringP("workspace", "w", "", "directory to restore into (required)")
			fs.String("key", "", "restore this snapshot (a key from snapshot list), not the newest good one")
		},
		nargs:  [2]int{0, 0},
		report: true,
	}
	cmd.run = func(ctx context.Context, c *cli, _ []string) error {
		ws, _ := c.flags.GetString("workspace")
		key, _ := c.flags.GetString("key")
		if ws == "" {
			return usagef(cmd, "--workspace DIR is required (the directory to restore into)")
		}
		abs, err := filepath.Abs(ws)
		if err != nil {
			return usagef(cmd, "--workspace: %v", err)
		}
		if st, err := os.Stat(abs); err == nil && !st.IsDir() {
			return usagef(cmd, "--workspace: %s is not a directory", abs)
		} else if err != nil && !errors.Is(err, os.ErrNotExist) {
			return usagef(cmd, "--workspace: %v", err)
		}
		pr := newProgress(c.stderr)
		st, err := c.newStorage(ctx, pr.update)
		if err != nil {
			return err
		}
		defer st.Close()
		project := c.cfg.Project
		info, stats, err := st.RestoreDir(ctx, project, key, abs, true)
		pr.finish()
		printTransfer(c.stderr, info)
		for _, r := range info.Refused {
			aside := ""
			if r.Quarantine != "" {
				aside = "; set aside as " + r.Quarantine
			}
			fmt.Fprintf(c.stderr, "skipped %s: %s%s\n", r.Key, printable(strings.Join(strings.Fields(r.Reason), " ")), aside)
		}
		if errors.Is(err, toolhost.ErrNotSnapshotKey) {
			return usagef(cmd, "--key: %v", err)
		}
		if err != nil {
			return fmt.Errorf("restoring project %s from %s into %s: %w", project, st.Where(), abs, errNoSnapshot(project, err))
		}
		if c.json() {
			out := restoreJSON{Key: info.Key, Time: info.Time.UTC(), Workspace: abs, Files: stats.Files, Dirs: stats.Dirs,
				Bytes: stats.Bytes, MovedAside: stats.Backup, Skipped: []skipJSON{}}
			for _, r := range info.Refused {
				out.Skipped = append(out.Skipped, skipJSON{What: r.Key, Reason: r.Reason, Quarantine: r.Quarantine})
			}
			return writeJSON(c.stdout, out, true)
		}
		fmt.Fprintf(c.stdout, "restored %s (saved %s UTC) into %s: %s, %s, %s, in %s\n",
			info.Key, info.Time.UTC().Format(timeLayout), abs, count(stats.Files, "file", "files"),
			count(stats.Dirs, "dir", "dirs"), humanBytes(stats.Bytes), ms(stats.Duration))
		if stats.Backup != "" {
			fmt.Fprintf(c.stdout, "the previous contents of %s were moved to %s\n", abs, stats.Backup)
		}
		return nil
	}
	return cmd
}

func snapshotDeleteCommand() *command {
	cmd := &command{
		words:   []string{"snapshot", "delete"},
		args:    "[--project ID] KEY",
		summary: "delete one snapshot of the project",
		help: `Deletes the snapshot KEY (a key from snapshot list) of the project from the store,
or one set aside as damaged (a key snapshot verify lists: the chunks only it needed go
at the next collections, snapshot gc). A key that is neither is refused (exit 2); one
that names no stored snapshot fails (exit 1).

Example:
  toolhost snapshot delete --project shop projects/shop/snapshots/20261121T093000Z-042-7f3a9c.snap`,
		nargs:  [2]int{1, 1},
		report: true,
	}
	cmd.run = func(ctx context.Context, c *cli, args []string) error {
		key := args[0]
		st, err := c.newStorage(ctx, nil)
		if err != nil {
			return err
		}
		defer st.Close()
		err = st.DeleteSnapshot(ctx, c.cfg.Project, key)
		switch {
		case errors.Is(err, toolhost.ErrNotSnapshotKey):
			return usagef(cmd, "%v", err)
		case err != nil:
			return fmt.Errorf("deleting from %s: %w", st.Where(), err)
		}
		if c.json() {
			return writeJSON(c.stdout, struct {
				Deleted []string `json:"deleted"`
			}{[]string{key}}, true)
		}
		fmt.Fprintf(c.stdout, "deleted %s\n", key)
		return nil
	}
	return cmd
}

func snapshotPruneCommand() *command {
	cmd := &command{
		words:   []string{"snapshot", "prune"},
		args:    "[--project ID] --keep N",
		summary: "delete all but the project's newest N snapshots",
		help: `Deletes every snapshot of the project but the newest N (at least 1; delete the last
ones by key with snapshot delete), printing each key it deletes. Saves apply
snapshot.keep on their own; this is for trimming by hand.

Example:
  toolhost snapshot prune --project shop --keep 2`,
		flags: func(fs *pflag.FlagSet) {
			fs.Int("keep", 0, "how many of the newest snapshots to keep (required, at least 1)")
		},
		nargs:  [2]int{0, 0},
		report: true,
	}
	cmd.run = func(ctx context.Context, c *cli, _ []string) error {
		if f := c.flags.Lookup("keep"); f == nil || !f.Changed {
			return usagef(cmd, "--keep N is required (how many of the newest snapshots to keep)")
		}
		keep, _ := c.flags.GetInt("keep")
		st, err := c.newStorage(ctx, nil)
		if err != nil {
			return err
		}
		defer st.Close()
		pruned, err := st.PruneSnapshots(ctx, c.cfg.Project, keep)
		switch {
		case errors.Is(err, toolhost.ErrInvalidKeep):
			return usagef(cmd, "--keep: %v", err)
		case err != nil:
			return fmt.Errorf("pruning the snapshots of project %s in %s: %w", c.cfg.Project, st.Where(), err)
		}
		if c.json() {
			return writeJSON(c.stdout, struct {
				Deleted []string `json:"deleted"`
				Kept    int      `json:"kept"`
			}{append([]string{}, pruned...), keep}, true)
		}
		for _, k := range pruned {
			fmt.Fprintf(c.stdout, "deleted %s\n", k)
		}
		fmt.Fprintf(c.stdout, "pruned %d %s; kept the newest %d\n", len(pruned), plural(len(pruned), "snapshot", "snapshots"), keep)
		return nil
	}
	return cmd
}

func screenshotListCommand() *command {
	cmd := &command{
		words:   []string{"screenshot", "list"},
		args:    "[--project ID] [--kind agent|auto]",
		summary: "list the project's stored screenshots, newest first",
		help: `Prints the captures stored under screenshots/PROJECT/ in the configured store:
those take_screenshot took (kind agent) and those the session took on its own
after a dev server started or a commit (kind auto), newest first, with viewport,
UTC time, size and URL (store.public_base + key when set, else a presigned S3 URL,
else the file of the directory store).`,
		flags: func(fs *pflag.FlagSet) {
			fs.String("kind", "", "only this kind: agent or auto (default both)")
		},
		nargs:  [2]int{0, 0},
		report: true,
	}
	cmd.run = func(ctx context.Context, c *cli, _ []string) error {
		kind, _ := c.flags.GetString("kind")
		if kind != "" && kind != toolhost.ScreenshotsAgent && kind != toolhost.ScreenshotsAuto {
			return usagef(cmd, "--kind must be agent or auto, got %q", kind)
		}
		st, err := c.newStorage(ctx, nil)
		if err != nil {
			return err
		}
		defer st.Close()
		// Listed even with screenshots off: what was stored before is still there.
		shots, err := st.Screenshots(ctx, c.cfg.Project, kind)
		if err != nil {
			return fmt.Errorf("listing the screenshots of project %s in %s: %w", c.cfg.Project, st.Where(), err)
		}
		if c.json() {
			type shot struct {
				Key      string    `json:"key"`
				Time     time.Time `json:"time"`
				Kind     string    `json:"kind"`
				Viewport string    `json:"viewport"`
				Bytes    int64     `json:"bytes"`
				URL      string    `json:"url"`
			}
			out := struct {
				Project     string `json:"project"`
				Screenshots []shot `json:"screenshots"`
			}{c.cfg.Project, []shot{}}
			for _, s := range shots {
				out.Screenshots = append(out.Screenshots, shot{s.Key, s.Time.UTC(), s.Kind, s.Viewport, s.Size, s.URL})
			}
			return writeJSON(c.stdout, out, true)
		}
		if len(shots) == 0 {
			fmt.Fprintf(c.stderr, "project %s has no stored screenshots in %s\n", c.cfg.Project, st.Where())
			return nil
		}
		printShots(c.stdout, shots)
		return nil
	}
	return cmd
}

// printShots prints stored captures as a table.
func printShots(w io.Writer, shots []toolhost.Screenshot) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "TIME (UTC)\tKIND\tVIEWPORT\tSIZE\tURL\n")
	for _, s := range shots {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.Time.UTC().Format(timeLayout), s.Kind, viewportLabel(s.Viewport), humanBytes(s.Size), s.URL)
	}
	tw.Flush()
}

// viewportLabel is "desktop 1280x800" for a viewport name.
func viewportLabel(name string) string {
	for _, v := range []screenshot.Viewport{screenshot.Desktop, screenshot.Mobile} {
		if v.Name == name {
			return fmt.Sprintf("%s %dx%d", v.Name, v.Width, v.Height)
		}
	}
	return name
}

// The JSON of the snapshot commands (--format json).
type (
	snapshotsJSON struct {
		Project   string         `json:"project"`
		Snapshots []snapshotJSON `json:"snapshots"`
	}
	snapshotJSON struct {
		Key   string    `json:"key"`
		Time  time.Time `json:"time"`
		Bytes int64     `json:"bytes"`
	}
	saveJSON struct {
		Key       string     `json:"key"`
		Bytes     int64      `json:"bytes"`
		Unchanged bool       `json:"unchanged"`
		Files     int        `json:"files"`
		Pruned    []string   `json:"pruned"`
		Skipped   int        `json:"skipped"`
		Skips     []skipJSON `json:"skips"`
	}
	restoreJSON struct {
		Key        string     `json:"key"`
		Time       time.Time  `json:"time"`
		Workspace  string     `json:"workspace"`
		Files      int        `json:"files"`
		Dirs       int        `json:"dirs"`
		Bytes      int64      `json:"bytes"`
		MovedAside string     `json:"moved_aside,omitempty"`
		Skipped    []skipJSON `json:"skipped"`
	}
	skipJSON struct {
		What   string `json:"what"`
		Reason string `json:"reason"`
		// Quarantine is where a refused snapshot was set aside, found damaged.
		Quarantine string `json:"quarantine,omitempty"`
	}
)
