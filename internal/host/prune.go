package host

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The compilation cache grows with every module, wazero version and toolhost version that
// ever ran against a data dir (12 MB per built-in, 50 MB a set): it is kept under a bound by
// removing the entries used least recently. New prunes in the background once the cache
// passes Config.MaxCacheBytes; PruneCache does it on demand.

// DefaultMaxCacheBytes bounds the compilation cache unless Config.MaxCacheBytes says
// otherwise: about ten sets of the built-ins.
const DefaultMaxCacheBytes = 512 << 20

// staleTemp is the age past which a temporary file of the cache (a write interrupted by a
// crash; a finished write renames it) is removed whatever the bound.
const staleTemp = time.Hour

// PruneResult says what PruneCache did.
type PruneResult struct {
	Files, Bytes               int64 // what the cache held before
	RemovedFiles, RemovedBytes int64
}

// PruneCache removes the entries of dataDir's cache (compiled modules and plugin records)
// used least recently until the cache holds at most maxBytes, and temporary files older
// than an hour. An entry's last use is the later of its modification and access times:
// a hit of wazero's cache reads the file (the access time moves at least once a day on a
// filesystem mounted relatime, the default), a hit of a record touches it. An entry being
// read by another process is safe to remove: the reader keeps its open file, and a later
// miss compiles the module again.
func PruneCache(dataDir string, maxBytes int64) (PruneResult, error) {
	type entry struct {
		path string
		size int64
		used time.Time
	}
	var res PruneResult
	var entries []entry
	now := time.Now()
	root := filepath.Join(dataDir, "cache")
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil // removed meanwhile
		}
		res.Files++
		res.Bytes += fi.Size()
		if strings.HasSuffix(p, ".tmp") && now.Sub(fi.ModTime()) > staleTemp {
			if os.Remove(p) == nil {
				res.RemovedFiles++
				res.RemovedBytes += fi.Size()
			}
			return nil
		}
		entries = append(entries, entry{p, fi.Size(), lastUse(fi)})
		return nil
	})
	if err != nil {
		return res, err
	}
	total := res.Bytes - res.RemovedBytes
	slices.SortFunc(entries, func(a, b entry) int { return a.used.Compare(b.used) })
	for _, e := range entries {
		if total <= maxBytes {
			break
		}
		if err := os.Remove(e.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return res, err
		}
		total -= e.size
		res.RemovedFiles++
		res.RemovedBytes += e.size
	}
	return res, nil
}

// pruneInBackground prunes the cache past the configured bound, owned by the host's
// background group (Close waits for it).
func (h *Host) pruneInBackground() {
	max := h.cfg.MaxCacheBytes
	if max < 0 {
		return
	}
	h.finishing.Go(func() {
		res, err := PruneCache(h.cfg.DataDir, max)
		switch {
		case err != nil:
			h.log.Warn("could not prune the compilation cache", "dir", h.cfg.DataDir, "err", err)
		case res.RemovedFiles > 0:
			h.log.Info("pruned the compilation cache", "dir", h.cfg.DataDir, "removed_files", res.RemovedFiles,
				"removed_bytes", res.RemovedBytes, "bound", max)
		}
	})
}
