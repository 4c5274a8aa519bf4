package tree

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// Replace fills a new sibling of dir (made empty, mode 0755) with fill, and only when fill
// succeeds swaps it in: a non-empty dir is renamed to "<dir>.before-restore-<UTC time>"
// (the backup returned), never deleted; an empty dir is replaced. On error dir is
// untouched and the partial tree removed. Any restore into a directory that may hold
// work goes through it (a tar.gz's ExtractReplace, a chunked snapshot's restore).
func Replace(dir string, fill func(tmp string) error) (backup string, err error) {
	dir = filepath.Clean(dir)
	parent, base := filepath.Split(dir)
	if parent == "" {
		parent = "."
	}
	tmp, err := os.MkdirTemp(parent, "."+base+".restore-")
	if err != nil {
		return "", err
	}
	// MkdirTemp made tmp 0700; an archive with a root entry ("./") sets its own mode.
	if err := os.Chmod(tmp, 0o755); err != nil {
		os.RemoveAll(tmp)
		return "", err
	}
	if err := fill(tmp); err != nil {
		os.RemoveAll(tmp)
		return "", err
	}
	if fi, serr := os.Lstat(dir); serr == nil {
		if !fi.IsDir() {
			os.RemoveAll(tmp)
			return "", fmt.Errorf("restore into %s: not a directory", dir)
		}
		if rerr := os.Remove(dir); rerr != nil { // fails unless dir is empty
			backup = fmt.Sprintf("%s.before-restore-%s", dir, time.Now().UTC().Format("20060102T150405.000000000Z"))
			if err := os.Rename(dir, backup); err != nil {
				os.RemoveAll(tmp)
				return "", fmt.Errorf("restore into %s: move the old tree aside: %w", dir, err)
			}
		}
	} else if !errors.Is(serr, fs.ErrNotExist) {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("restore into %s: %w", dir, serr)
	}
	if err := os.Rename(tmp, dir); err != nil {
		if backup != "" {
			os.Rename(backup, dir)
			backup = ""
		}
		os.RemoveAll(tmp)
		return "", fmt.Errorf("restore into %s: swap in the restored tree: %w", dir, err)
	}
	return backup, nil
}
