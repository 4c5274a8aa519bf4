package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/spf13/pflag"

	"github.com/toolhost/toolhost/core/screenshot"
)

const timeLayout = "2006-01-02 15:04:05"

func snapshotSaveCommand() *command {
	cmd := &command{
		words:   []string{"snapshot", "save"},
		args:    "[--project ID] [--workspace DIR]",
		summary: "pack a workspace directory and upload it as the project's newest snapshot",
		help: `Packs DIR (default: the current directory) as one tar.gz, leaving out
snapshot.excludes, and stores it under projects/PROJECT/snapshots/ in the
configured store (store.kind; by default a directory under data_dir). Retention
then keeps the newest snapshot.keep. A failed upload is retried snapshot.retries
times. Progress goes to stderr (a live line on a terminal, else one summary line).

Example:
  toolhost snapshot save --project shop --workspace ~/src/shop`,
		flags: func(fs *pflag.FlagSet) {
			fs.StringP("workspace", "w", "", "directory to save (default: the current directory)")
		},
		nargs: [2]int{0, 0},
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
		project := c.cfg.Project
		info, stats, err := st.Snapshots().SaveDir(ctx, project, ws)
		pr.finish()
		if err != nil {
			return fmt.Errorf("saving %s for project %s in %s: %w", ws, project, st.Where(), err)
		}
		if !pr.saw("upload") && info.Size > 0 {
			// The manager found this very archive already stored under the key (same
			// second, same SHA-256): nothing new to upload.
			fmt.Fprintf(c.stdout, "unchanged: %s already holds this exact archive (%s; %d files); nothing uploaded\n",
				info.Key, humanBytes(info.Size), stats.Files)
		} else {
			fmt.Fprintf(c.stdout, "saved %s (%s; %d files, %s packed, in %s)\n", info.Key, humanBytes(info.Size),
				stats.Files, humanBytes(stats.BytesIn), ms(stats.Duration))
		}
		fmt.Fprintf(c.stdout, "store: %s\n", st.Where())
		if stats.Skipped > 0 {
			fmt.Fprintf(c.stdout, "left out %d entries that cannot be archived safely (sockets, devices, links out of the tree)\n", stats.Skipped)
		}
		if len(info.Pruned) > 0 {
			fmt.Fprintf(c.stdout, "retention removed %d older %s (snapshot.keep: %d)\n", len(info.Pruned), plural(len(info.Pruned), "snapshot", "snapshots"), c.cfg.Snapshot.Keep)
		}
		return nil
	}
	return cmd
}

func snapshotListCommand() *command {
	cmd := &command{
		words:   []string{"snapshot", "list"},
		args:    "[--project ID]",
		summary: "list the project's snapshots, newest first",
		help: `Prints one line per snapshot of the project: its key, the UTC time the save
started and its size, newest first. A project without snapshots prints nothing on
stdout and says so on stderr (exit status 0).`,
		nargs: [2]int{0, 0},
	}
	cmd.run = func(ctx context.Context, c *cli, _ []string) error {
		st, err := c.newStorage(ctx, nil)
		if err != nil {
			return err
		}
		defer st.Close()
		infos, err := st.Snapshots().List(ctx, c.cfg.Project)
		if err != nil {
			return fmt.Errorf("listing the snapshots of project %s in %s: %w", c.cfg.Project, st.Where(), err)
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
		args:    "[--project ID] --workspace DIR",
		summary: "extract the project's newest good snapshot into a directory",
		help: `Downloads the newest snapshot of the project whose checksum verifies (an older one
when the newest is corrupt) and extracts it into DIR, which is created if absent.
Nothing is ever lost: when DIR holds files, the snapshot is extracted next to it
first and only then swapped in, and the previous contents are moved to
DIR.before-restore-TIME (the output says where). Entries that would land outside
DIR (.., absolute names, links out, devices) are refused.

Example:
  toolhost snapshot restore --project shop --workspace /tmp/shop`,
		flags: func(fs *pflag.FlagSet) {
			fs.StringP("workspace", "w", "", "directory to restore into (required)")
		},
		nargs: [2]int{0, 0},
	}
	cmd.run = func(ctx context.Context, c *cli, _ []string) error {
		ws, _ := c.flags.GetString("workspace")
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
		info, stats, err := st.Snapshots().RestoreDir(ctx, project, abs, true)
		pr.finish()
		if err != nil {
			return fmt.Errorf("restoring project %s from %s into %s: %w", project, st.Where(), abs, errNoSnapshot(project, err))
		}
		fmt.Fprintf(c.stdout, "restored %s (saved %s UTC) into %s: %d files, %d dirs, %s, in %s\n",
			info.Key, info.Time.UTC().Format(timeLayout), abs, stats.Files, stats.Dirs, humanBytes(stats.Bytes), ms(stats.Duration))
		if stats.Backup != "" {
			fmt.Fprintf(c.stdout, "the previous contents of %s were moved to %s\n", abs, stats.Backup)
		}
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
		nargs: [2]int{0, 0},
	}
	cmd.run = func(ctx context.Context, c *cli, _ []string) error {
		kind, _ := c.flags.GetString("kind")
		if kind != "" && kind != screenshot.KindAgent && kind != screenshot.KindAuto {
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
func printShots(w io.Writer, shots []screenshot.Stored) {
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
