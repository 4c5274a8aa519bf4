package host

import (
	"io/fs"
	"syscall"
	"time"
)

// lastUse is the later of a file's modification and access times.
func lastUse(fi fs.FileInfo) time.Time {
	t := fi.ModTime()
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		if a := time.Unix(st.Atim.Sec, st.Atim.Nsec); a.After(t) {
			return a
		}
	}
	return t
}
