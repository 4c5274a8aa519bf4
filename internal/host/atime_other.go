//go:build !linux

package host

import (
	"io/fs"
	"time"
)

// lastUse is a file's modification time (its access time is not read on this system).
func lastUse(fi fs.FileInfo) time.Time { return fi.ModTime() }
